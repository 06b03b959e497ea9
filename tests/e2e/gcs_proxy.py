"""A TCP proxy between raysize and a real Ray GCS that a test can cut and restore.

While dark, the proxy drops every open connection and closes each new one as soon as it
is accepted, so every gRPC call through it fails with UNAVAILABLE, as when the head pod
is unreachable. The Raylets and the drivers talk to the GCS directly, not through it.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class GcsProxy:
    def __init__(self, upstream: str = "") -> None:
        self._upstream = upstream  # "host:port"; until set, the proxy is dark
        self._dark = False
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._closed = threading.Event()
        self.refused = 0  # connections closed because the proxy was dark or had no upstream
        self.forwarded = 0  # connections joined to the GCS
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = int(self._listener.getsockname()[1])
        self._accept = threading.Thread(target=self._accept_loop, name="gcs-proxy", daemon=True)
        self._accept.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def set_upstream(self, upstream: str) -> None:
        with self._lock:
            self._upstream = upstream

    def go_dark(self) -> None:
        """Cut: drop every open connection, refuse new ones until `restore`."""
        with self._lock:
            self._dark = True
            conns, self._conns = list(self._conns), set()
        for conn in conns:
            _drop(conn)

    def restore(self) -> None:
        with self._lock:
            self._dark = False

    @property
    def dark(self) -> bool:
        with self._lock:
            return self._dark

    def close(self) -> None:
        self._closed.set()
        self._accept.join(5)
        self._listener.close()
        with self._lock:
            conns, self._conns = list(self._conns), set()
            threads, self._threads = list(self._threads), []
        for conn in conns:
            _drop(conn)
        for t in threads:
            t.join(5)

    def __enter__(self) -> GcsProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- plumbing --------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                upstream = "" if self._dark else self._upstream
            if not upstream:
                with self._lock:
                    self.refused += 1
                _drop(client)
                continue
            host, port = upstream.rsplit(":", 1)
            try:
                server = socket.create_connection((host, int(port)), timeout=2)
            except OSError:
                _drop(client)
                continue
            server.settimeout(None)
            with self._lock:
                if self._dark:  # cut while connecting
                    self.refused += 1
                    _drop(client)
                    _drop(server)
                    continue
                self.forwarded += 1
                self._conns.update((client, server))
                self._threads = [t for t in self._threads if t.is_alive()]
                for src, dst in ((client, server), (server, client)):
                    t = threading.Thread(target=self._pump, args=(src, dst), daemon=True)
                    self._threads.append(t)
                    t.start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._conns.discard(src)
                self._conns.discard(dst)
            _drop(src)
            _drop(dst)


def _drop(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
