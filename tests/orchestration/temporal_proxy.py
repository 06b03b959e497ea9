"""A TLS-terminating gRPC proxy in front of the real Temporal dev server, which can do
neither TLS nor API keys itself (`temporal server start-dev --help` has no such flag).

It forwards every call, unchanged (bytes in, bytes out), to the dev server, after the
checks a Temporal Cloud frontend makes: TLS with its server certificate, a client
certificate signed by the CA it trusts (mTLS), and an API key in the `authorization`
metadata (`Bearer <key>`) from the set it accepts (UNAUTHENTICATED otherwise). The keys it
accepts can change while it runs (`accept`); new certificates take a `restart` on the same
port, as a server's rotation does. It runs its own event loop in a thread, so sync and
async tests can use it.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(d: Path, name: str) -> None:
    """`<name>.crt`, `<name>.key` in `d`: a CA."""
    openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{name}.key", cwd=d)
    openssl(
        "req", "-x509", "-new", "-key", f"{name}.key", "-subj", f"/CN={name}", "-days", "1",
        "-out", f"{name}.crt", cwd=d,
    )  # fmt: skip


def issue(d: Path, ca: str, name: str, san: str) -> None:
    """`<name>.crt`, `<name>.key` in `d`, signed by the CA `ca`, for `san` (DNS:x)."""
    openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{name}.key", cwd=d)
    openssl(
        "req", "-new", "-key", f"{name}.key", "-subj", f"/CN={name}", "-out", f"{name}.csr", cwd=d
    )
    (d / f"{name}.ext").write_text(f"subjectAltName={san}\n")
    openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-days", "1", "-extfile", f"{name}.ext", "-out", f"{name}.crt",
        cwd=d,
    )  # fmt: skip


@dataclass(frozen=True)
class ProxyTls:
    cert: Path
    key: Path
    client_ca: Path | None = None  # set: client certificates signed by it are required


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TemporalProxy:
    def __init__(
        self,
        upstream: str,
        *,
        tls: ProxyTls | None = None,
        keys: Iterable[str] | None = None,
        port: int | None = None,
    ) -> None:
        self.upstream = upstream
        self.tls = tls
        self.keys: set[str] | None = set(keys) if keys is not None else None
        self.port = port or free_port()
        self.refused = 0  # calls refused for their key
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server: Any = None
        self._channel: Any = None
        self._run(self._start())

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def accept(self, keys: Iterable[str] | None) -> None:
        """The API keys accepted from now on (None: no check)."""
        self.keys = set(keys) if keys is not None else None

    def restart(self, tls: ProxyTls | None) -> None:
        """Stop, and listen again on the same port with other certificates."""
        self._run(self._stop())
        self.tls = tls
        self._run(self._start())

    def close(self) -> None:
        self._run(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(60)

    async def _start(self) -> None:
        self._channel = grpc.aio.insecure_channel(self.upstream)
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((_Forward(self),))
        if self.tls is None:
            server.add_insecure_port(self.address)
        else:
            credentials = grpc.ssl_server_credentials(
                [(self.tls.key.read_bytes(), self.tls.cert.read_bytes())],
                root_certificates=self.tls.client_ca.read_bytes() if self.tls.client_ca else None,
                require_client_auth=self.tls.client_ca is not None,
            )
            server.add_secure_port(self.address, credentials)
        await server.start()
        self._server = server

    async def _stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def forward(self, method: str, request: bytes, context: Any) -> bytes:
        metadata = [
            (k, v)
            for k, v in context.invocation_metadata() or ()
            if k not in ("authorization", "user-agent") and not k.startswith((":", "grpc-"))
        ]
        if self.keys is not None:
            given = dict(context.invocation_metadata() or ()).get("authorization", "")
            if given.removeprefix("Bearer ") not in self.keys:
                self.refused += 1
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, "Request unauthorized")
        call = self._channel.unary_unary(method)
        timeout = context.time_remaining()
        try:
            response: bytes = await call(request, metadata=metadata, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            await context.abort(exc.code(), exc.details() or "")
        return response


class _Forward(grpc.GenericRpcHandler):
    def __init__(self, proxy: TemporalProxy) -> None:
        self.proxy = proxy

    def service(self, handler_call_details: Any) -> grpc.RpcMethodHandler:
        method = handler_call_details.method

        async def handle(request: bytes, context: Any) -> bytes:
            return await self.proxy.forward(method, request, context)

        return grpc.unary_unary_rpc_method_handler(handle)
