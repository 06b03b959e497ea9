"""The test worlds' servers listen below the ephemeral range, where no client's source
port, nor a client connected to itself, can take the port before the server binds it."""

from __future__ import annotations

import socket

from raysize.sandbox import ports
from raysize.sandbox.ports import _ephemeral_low, free_port


def test_free_ports_are_free_and_below_the_ephemeral_range() -> None:
    ports = {free_port() for _ in range(50)}
    assert len(ports) > 40  # spread, not one port handed out again and again
    assert all(1024 < p < _ephemeral_low() for p in ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))


def picking(monkeypatch, *picks: int) -> None:
    """`free_port` draws `picks`, in order, with nothing handed out before."""
    drawn = iter(picks)

    class Picks:
        def randint(self, low: int, high: int) -> int:
            return next(drawn)

    monkeypatch.setattr(ports.random, "SystemRandom", Picks)
    monkeypatch.setattr(ports, "_given", ports.deque())
    monkeypatch.setattr(ports, "_given_set", set())


def test_a_port_handed_out_lately_is_not_handed_out_again(monkeypatch) -> None:
    """Until its server binds it, a port handed out is still free: the next call must not
    give it again (Ray refused a `ray start` whose two agents were given one port).

    Every pick counts as bindable: the ports are the machine's, and another process (CI
    runs its parts at once) may hold any of them, which once ran this test out of picks.
    """
    picking(monkeypatch, 24286, 24286, 24286, 24287)
    monkeypatch.setattr(ports, "_bindable", lambda port: True)
    assert [free_port(), free_port()] == [24286, 24287]


def test_a_port_another_process_holds_is_passed_over(monkeypatch) -> None:
    """A pick that cannot be bound (another socket holds it) is not handed out."""
    with socket.socket() as held, socket.socket() as spare:
        held.bind(("127.0.0.1", 0))
        spare.bind(("127.0.0.1", 0))
        taken, free = held.getsockname()[1], spare.getsockname()[1]
        spare.close()
        picking(monkeypatch, taken, taken, free)
        assert not ports._bindable(taken)
        assert free_port() == free
