"""Free TCP ports for the processes the test worlds start (Ray nodes, servers)."""

from __future__ import annotations

import random
import socket
import threading
from collections import deque
from pathlib import Path

_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# ports handed out lately: a port is free until its server binds it, so two asked for
# one after the other (the six of one `ray start`) could be the same one
_GIVEN_KEPT = 4096
_given: deque[int] = deque()
_given_set: set[int] = set()
_lock = threading.Lock()


def _give(port: int) -> int:
    with _lock:
        _given.append(port)
        _given_set.add(port)
        if len(_given) > _GIVEN_KEPT:
            _given_set.discard(_given.popleft())
    return port


def _ephemeral_low() -> int:
    try:
        return int(_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    """Whether a server could bind `port` on 127.0.0.1 now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A free port on 127.0.0.1, below the kernel's ephemeral range.

    Binding to port 0 gives one from that range, and so may every client that connects
    somewhere: between this call and the server's bind, the port can be taken as a
    client's source port, and a client that keeps dialling a local port nothing listens on
    yet (raysize reading a Ray head that is starting) may even be connected to itself on it
    (TCP self-connect). The server then cannot bind: seen once in CI, a Ray head whose GCS
    never came up and that exited 1 three minutes later. Below the range neither happens.

    Nor is a port this process handed out lately handed out again: Ray checks the ports
    of one `ray start` against each other, and once refused two that were the same (seen
    in CI: `runtime_env_agent is trying to use a port number 24286 that is used by other
    components`).
    """
    high = _ephemeral_low() - 1
    low = 20000 if high > 21000 else 10000
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randint(low, high)
        with _lock:
            if port in _given_set:
                continue
        if _bindable(port):
            return _give(port)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # a crowded range
        s.bind(("127.0.0.1", 0))
        return _give(int(s.getsockname()[1]))
