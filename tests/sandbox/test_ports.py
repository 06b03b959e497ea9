"""The test worlds' servers listen below the ephemeral range, where no client's source
port, nor a client connected to itself, can take the port before the server binds it."""

from __future__ import annotations

import socket

from raysize.sandbox.ports import _ephemeral_low, free_port


def test_free_ports_are_free_and_below_the_ephemeral_range() -> None:
    ports = {free_port() for _ in range(50)}
    assert len(ports) > 40  # spread, not one port handed out again and again
    assert all(1024 < p < _ephemeral_low() for p in ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))
