"""Faults in front of a real kube-apiserver: an HTTPS proxy that decides each request as
the embedded API server does (`sandbox/faults.py`: errors, latency, watches cut), then
answers the fault or forwards the request unchanged (its bearer token included, so the
real server still authenticates and authorizes it). With no faults and an http://
upstream it is the embedded server's HTTPS front, for a client that speaks nothing else
(Ray's own autoscaler, `bench.autoscaler_compare`).

    proxy = FaultProxy(control_plane.url, control_plane.ca_pem, faults, workdir).start()
    write_kubeconfig(path, proxy.url, namespace, token=token, ca_pem=proxy.ca_pem)

The proxy has its own self-signed certificate for 127.0.0.1 (openssl, as the API server's
own), so a client of the proxy still speaks HTTPS and checks the certificate it is given.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import select
import shutil
import socket
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from raysize.sandbox.faults import Faults

log = logging.getLogger(__name__)

# what a client sends that the API server needs to see; hop-by-hop headers stay here
FORWARDED = ("authorization", "content-type", "accept", "user-agent", "accept-encoding")
STREAM_CHUNK = 64 * 1024


def request_of(method: str, target: str) -> tuple[str, str, str]:
    """(verb, resource label, name) of an API request, as `FaultRule` matches them:
    `GET /api/v1/namespaces/a/pods?watch=true` → ("watch", "pods", "")."""
    split = urlsplit(target)
    parts = [p for p in split.path.split("/") if p]
    query = {k: v[-1] for k, v in parse_qs(split.query).items()}
    # /api/v1/... or /apis/<group>/<version>/...
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:] if parts[:1] == ["apis"] else []
    if len(rest) >= 2 and rest[0] == "namespaces":
        rest = rest[2:] if len(rest) > 2 else ["namespaces", rest[1]]
    resource = rest[0] if rest else ""
    name = rest[1] if len(rest) > 1 else ""
    label = f"{resource}/{rest[2]}" if len(rest) > 2 else resource
    if method == "GET":
        verb = "watch" if query.get("watch") in ("true", "1") else ("get" if name else "list")
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, "")
        verb = verb or ("delete" if name else "deletecollection")
    return verb, label, name


class FaultProxy:
    def __init__(
        self, upstream: str, upstream_ca_pem: bytes | None, faults: Faults, workdir: Path
    ) -> None:
        """`upstream` is https:// (its CA `upstream_ca_pem`) or http:// (no CA: the embedded
        server, given an HTTPS front for a client that speaks nothing else, as Ray's own
        autoscaler does)."""
        split = urlsplit(upstream)
        self.upstream_host = split.hostname or "127.0.0.1"
        plain = split.scheme == "http"
        self.upstream_port = split.port or (80 if plain else 443)
        if plain == (upstream_ca_pem is not None):
            raise ValueError(f"{upstream}: an https:// upstream needs its CA, an http:// one none")
        self.upstream_tls = (
            None
            if upstream_ca_pem is None
            else ssl.create_default_context(cadata=upstream_ca_pem.decode())
        )
        self.faults = faults
        self.workdir = workdir
        self.ca_pem = b""
        self.stalled = 0  # watch streams gone silent (a `watch_stall_after_s` fault)
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the proxy first"
        return f"https://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FaultProxy:
        key, crt = self.workdir / "fault-proxy.key", self.workdir / "fault-proxy.crt"
        openssl = shutil.which("openssl")
        if openssl is None:
            raise RuntimeError("openssl is not on PATH (it makes the fault proxy's certificate)")
        subprocess.run(
            [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-keyout", str(key), "-out", str(crt), "-subj", "/CN=raysize-fault-proxy",
             "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
            check=True, capture_output=True,
        )  # fmt: skip
        self.ca_pem = crt.read_bytes()
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(str(crt), str(key))
        proxy = self

        class Handler(_Handler):
            owner = proxy

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        server.socket = tls.wrap_socket(server.socket, server_side=True)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="fault-proxy")
        self._thread.daemon = True
        self._thread.start()
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _Handler(BaseHTTPRequestHandler):
    owner: FaultProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("fault proxy: " + format, *args)

    def do_GET(self) -> None:
        self._proxy()

    def do_POST(self) -> None:
        self._proxy()

    def do_PUT(self) -> None:
        self._proxy()

    def do_PATCH(self) -> None:
        self._proxy()

    def do_DELETE(self) -> None:
        self._proxy()

    def _proxy(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        verb, label, name = request_of(self.command, self.path)
        decision = self.owner.faults.decide(verb, label, name)
        if decision.latency_s:
            time.sleep(decision.latency_s)
        if decision.error is not None:
            payload, headers = decision.error.answer()
            self.send_response(decision.error.code)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        o = self.owner
        upstream = (
            http.client.HTTPConnection(o.upstream_host, o.upstream_port, timeout=None)
            if o.upstream_tls is None
            else http.client.HTTPSConnection(
                o.upstream_host, o.upstream_port, context=o.upstream_tls, timeout=None
            )
        )
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() in FORWARDED}
            upstream.request(self.command, self.path, body=body, headers=headers)
            reply = upstream.getresponse()
            streaming = verb == "watch" or reply.getheader("Transfer-Encoding") == "chunked"
            self.send_response(reply.status)
            for k, v in reply.getheaders():
                if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(k, v)
            if not streaming:
                data = reply.read()
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            cut_at = (
                time.monotonic() + decision.watch_disconnect_after_s
                if decision.watch_disconnect_after_s
                else None
            )
            stall_at = (
                None
                if decision.watch_stall_after_s is None
                else time.monotonic() + decision.watch_stall_after_s
            )
            self._stream(upstream, reply, cut_at, stall_at)
        except (OSError, http.client.HTTPException) as exc:
            log.debug("fault proxy: %s %s: %s", self.command, self.path, exc)
            self.close_connection = True
        finally:
            upstream.close()

    def _stream(
        self,
        upstream: http.client.HTTPConnection,
        reply: Any,
        cut_at: float | None,
        stall_at: float | None = None,
    ) -> None:
        """Relay a chunked (watch) reply as it comes; at `cut_at` (a fault) the upstream
        connection is shut and the stream ends, as the embedded server's disconnect does.
        From `stall_at` (a fault) nothing more is relayed and the stream never ends: the
        client's connection stays open and silent until the client hangs up."""
        timer = None
        if cut_at is not None and upstream.sock is not None:
            sock = upstream.sock
            timer = threading.Timer(
                max(0.0, cut_at - time.monotonic()),
                lambda: _shut(sock),
            )
            timer.daemon = True
            timer.start()
        try:
            while True:
                if stall_at is not None and time.monotonic() >= stall_at:
                    self._stall()
                    return
                try:
                    data = reply.read1(STREAM_CHUNK)
                except (OSError, ValueError, http.client.HTTPException):
                    break  # cut (or the server ended it)
                if not data:
                    break
                if stall_at is not None and time.monotonic() >= stall_at:
                    self._stall()  # what came after the stall is never relayed
                    return
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        finally:
            if timer is not None:
                timer.cancel()
        self.close_connection = True

    def _stall(self) -> None:
        """Relay nothing more and keep the client's connection open, as a connection an
        idle NAT or load balancer dropped without closing it: until the client hangs up
        (or the proxy closes)."""
        with self.owner.lock:
            self.owner.stalled += 1
        self.close_connection = True
        sock = self.connection
        while self.owner._server is not None:
            try:
                readable, _, _ = select.select([sock], [], [], 0.2)
                if readable and not sock.recv(1):
                    return  # the client hung up
            except ssl.SSLWantReadError:
                continue
            except (OSError, ValueError):
                return


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
