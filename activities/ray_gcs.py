"""A client for the Ray GCS: read nodes and demands, resize Raylets.

It speaks Ray's gRPC protocol with raysize's own minimal protos (`activities.ray_proto`)
and never imports `ray`. One channel is opened per client and reused; every call carries
a deadline, and the token when there is one. Errors come back as typed exceptions whose
`retryable` flag tells a retry policy what to do.

Ray reports a failed RPC as gRPC `ABORTED` with Ray's status name ("NotFound",
"InvalidArgument", …) as the details, and the readable message as raw UTF-8 in the
`grpc-status-details-bin` trailer (not a `google.rpc.Status`).
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import grpc
from google.protobuf.message import DecodeError, Message

from raysize.activities.gcs_cadence import GcsCadence
from raysize.activities.ray_errors import (
    RayError,
    RayInvalidArgument,
    RayletNotFound,
    RayPermissionDenied,
    RayRefused,
    RayReplyError,
    RayUnauthenticated,
    RayUnavailable,
    RayUnsupported,
)
from raysize.activities.ray_proto import ray_autoscaler_pb2 as autoscaler_pb2
from raysize.activities.ray_proto import ray_rpc_pb2 as rpc_pb2
from raysize.activities.ray_state import (
    ClusterState,
    NodeInfo,
    demand_digest,
    parse_cluster_state,
    parse_node_infos,
    ray_amounts,
    ray_version_of,
    state_fingerprint,
)
from raysize.workflows.resources import CPU, MEMORY, Resources

__all__ = [
    "DrainReply",
    "RayError",
    "RayGcsClient",
    "RayInvalidArgument",
    "RayPermissionDenied",
    "RayRefused",
    "RayReplyError",
    "RayUnauthenticated",
    "RayUnavailable",
    "RayUnsupported",
    "RayletNotFound",
    "TlsConfig",
]

DEFAULT_TIMEOUT_S: Final = 10.0
# where Ray keeps the cluster's metadata (ray._common.usage.usage_lib.put_cluster_metadata)
CLUSTER_METADATA_KEY: Final = b"CLUSTER_METADATA"
CLUSTER_METADATA_NAMESPACE: Final = b"cluster"
NODE_ID_BYTES: Final = 28
TOKEN_ENV: Final = "RAY_AUTH_TOKEN"
TOKEN_PATH_ENV: Final = "RAY_AUTH_TOKEN_PATH"
# raysize's own, next to Ray's RAY_TLS_* settings; Ray itself has no such setting.
TLS_SERVER_NAME_ENV: Final = "RAY_TLS_SERVER_NAME"
_DETAILS_TRAILER: Final = "grpc-status-details-bin"
# A large cluster's state is well above gRPC's 4 MiB default.
_MAX_MESSAGE_BYTES: Final = 512 * 1024 * 1024
# gRPC backs off reconnecting up to 120 s by default, failing every call fast meanwhile:
# after a GCS outage the cached channel would stay broken long after Ray is back.
_MAX_RECONNECT_BACKOFF_MS: Final = 2000
_RESIZABLE: Final = frozenset({CPU, MEMORY})


# Ray status names (the `details` of an ABORTED reply, Ray 2.60's `CodeAsString`) → class.
# Transient ones are retried; a name not listed here is `RayRefused`, not retried.
_RAY_STATUS: Final[dict[str, type[RayError]]] = {
    "NotFound": RayletNotFound,
    "InvalidArgument": RayInvalidArgument,
    "Invalid": RayInvalidArgument,
    "Disconnected": RayUnavailable,
    "IOError": RayUnavailable,
    "TimedOut": RayUnavailable,
    "RpcError": RayUnavailable,
    "RedisError": RayUnavailable,  # the GCS's external store (HA GCS) hiccupped
    "GcsPassive": RayUnavailable,  # a standby GCS answered; the active one takes over
    "Unauthenticated": RayUnauthenticated,
    "PermissionDenied": RayPermissionDenied,
    "NotImplemented": RayUnsupported,
}
# Ray's numeric status codes (`GcsStatus.code` in replies of the older GCS services,
# such as GetAllNodeInfo, which answer gRPC OK and put the error in the reply).
_RAY_STATUS_NAMES: Final[dict[int, str]] = {
    4: "Invalid",
    5: "IOError",
    10: "NotImplemented",
    11: "RedisError",
    12: "TimedOut",
    17: "NotFound",
    18: "Disconnected",
    30: "RpcError",
    33: "Unauthenticated",
    34: "InvalidArgument",
    37: "PermissionDenied",
}
# gRPC Python's own words when a message cannot be (de)serialised: not a network fault.
_CODEC_FAILURES: Final = ("Exception deserializing response", "Exception serializing request")
_NEEDS: Final = "raysize needs Ray ≥ 2.60"
# gRPC's words when the server certificate does not name the address dialled.
_NAME_MISMATCH: Final = ("Hostname Verification Check failed", "not in peer certificate")


@dataclass(frozen=True)
class TlsConfig:
    """Mutual TLS: Ray's GCS (RAY_USE_TLS=1) accepts nothing less.

    `server_name` overrides the name checked against the server certificate, for when
    the address dialled is not in its SANs (dialling an IP the certificate does not
    name, or a port-forward): docs/design/ray-protocol.md §3(d).
    """

    ca_cert: Path
    cert: Path
    key: Path
    server_name: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TlsConfig | None:
        """Ray's own settings: RAY_USE_TLS, RAY_TLS_CA_CERT, RAY_TLS_SERVER_CERT/KEY; and
        raysize's RAY_TLS_SERVER_NAME for `server_name`. Without RAY_USE_TLS, none."""
        env = os.environ if env is None else env
        if env.get("RAY_USE_TLS", "0").lower() not in ("1", "true"):
            return None
        try:
            return cls(
                ca_cert=Path(env["RAY_TLS_CA_CERT"]),
                cert=Path(env["RAY_TLS_SERVER_CERT"]),
                key=Path(env["RAY_TLS_SERVER_KEY"]),
                server_name=env.get(TLS_SERVER_NAME_ENV, "").strip() or None,
            )
        except KeyError as exc:
            raise RayInvalidArgument(
                f"RAY_USE_TLS is set but {exc.args[0]} is not: Ray's TLS needs RAY_TLS_CA_CERT, "
                f"RAY_TLS_SERVER_CERT and RAY_TLS_SERVER_KEY (set {exc.args[0]} to its file, or "
                "unset RAY_USE_TLS)"
            ) from None

    def credentials(self) -> grpc.ChannelCredentials:
        try:
            ca, cert, key = (p.read_bytes() for p in (self.ca_cert, self.cert, self.key))
        except OSError as exc:
            raise RayInvalidArgument(f"cannot read a TLS file: {exc}") from None
        return grpc.ssl_channel_credentials(
            root_certificates=ca, private_key=key, certificate_chain=cert
        )


def resolve_token(token: str | None = None, env: Mapping[str, str] | None = None) -> str | None:
    """The token to send: the argument, else $RAY_AUTH_TOKEN, else $RAY_AUTH_TOKEN_PATH's file."""
    env = os.environ if env is None else env
    if token and token.strip():
        return token.strip()
    if env.get(TOKEN_ENV, "").strip():
        return env[TOKEN_ENV].strip()
    path = env.get(TOKEN_PATH_ENV, "").strip()
    if path:
        try:
            text = Path(path).read_text().strip()
        except OSError as exc:
            raise RayUnauthenticated(
                f"cannot read the token file {TOKEN_PATH_ENV}={path}: {exc.strerror} (point "
                f"{TOKEN_PATH_ENV} at the file holding the Ray cluster's auth token, or unset it)"
            ) from None
        if not text:
            raise RayUnauthenticated(
                f"the token file {TOKEN_PATH_ENV}={path} is empty (point {TOKEN_PATH_ENV} at the "
                "file holding the Ray cluster's auth token, or unset it)"
            )
        return text
    return None


def node_id_bytes(node_id: str | bytes) -> bytes:
    """A node ID as the 28 raw bytes the wire wants (from 56 hex characters or raw)."""
    if isinstance(node_id, bytes):
        raw = node_id
    else:
        try:
            raw = bytes.fromhex(node_id)
        except ValueError:
            raise RayInvalidArgument(f"node id {node_id!r} is not hexadecimal") from None
    if len(raw) != NODE_ID_BYTES:
        raise RayInvalidArgument(
            f"node id must be {NODE_ID_BYTES} bytes ({2 * NODE_ID_BYTES} hex characters), "
            f"got {len(raw)} bytes"
        )
    return raw


def resize_request(resources: Mapping[str, float] | Resources) -> dict[str, float]:
    """Check a resize target before it goes out; Ray itself checks almost nothing.

    The Raylet deletes a resource set to 0 or less and accepts any custom name, so only
    CPU and memory, both present, finite and strictly positive, are let through.
    """
    amounts: Mapping[str, Any] = (
        resources.to_ray() if isinstance(resources, Resources) else resources
    )
    extra = sorted(set(amounts) - _RESIZABLE)
    if extra:
        raise RayInvalidArgument(f"only CPU and memory can be resized, not {', '.join(extra)}")
    out: dict[str, float] = {}
    for name in (CPU, MEMORY):
        if name not in amounts:
            raise RayInvalidArgument(f"a resize needs both CPU and memory; {name} is missing")
        value = amounts[name]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise RayInvalidArgument(f"{name}: {value!r} is not a number")
        if not math.isfinite(value):
            raise RayInvalidArgument(f"{name}: {value!r} is not a finite number")
        if value <= 0:
            raise RayInvalidArgument(
                f"{name}: {value!r} must be > 0 (the Raylet would delete the resource)"
            )
        if name == MEMORY and value != int(value):
            raise RayInvalidArgument(f"memory: {value!r} is not a whole number of bytes")
        out[name] = float(value)
    return out


def _error_text(err: grpc.RpcError) -> str:
    """Ray's readable message from the trailer, else gRPC's details."""
    for key, value in err.trailing_metadata() or ():
        if key == _DETAILS_TRAILER:
            text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
            if text.strip():
                return text.strip()
    return str(err.details() or "").strip()


def _rpc_name(method: str) -> str:
    """The RPC of a gRPC path, as "AutoscalerStateService.GetClusterResourceState"."""
    service, _, name = method.strip("/").rpartition("/")
    return f"{service.rpartition('.')[2]}.{name}" if service else name or "this call"


def _auth_hint(sent_token: bool, token_from: str = "") -> str:
    if not sent_token and token_from:
        # the worker's own token exists, but is not for this cluster (RAYSIZE_RAY_TOKEN_FOR)
        return f"no token was sent: {token_from}"
    if token_from:
        # a cluster's own token (activities/ray_tokens.py), read again before this
        return (
            f"the token from {token_from} is not the one this Ray runs with (Ray reads its "
            "token when it starts: restart its pods after changing the Secret)"
        )
    if sent_token:
        return f"the token sent is wrong; check {TOKEN_ENV} or {TOKEN_PATH_ENV}"
    return f"no token was sent; set {TOKEN_ENV} or {TOKEN_PATH_ENV}, or pass one"


def _from_ray_status(
    status: str,
    text: str,
    *,
    target: str,
    what: str,
    rpc: str,
    sent_token: bool,
    token_from: str = "",
) -> RayError:
    """A Ray status name (ABORTED's details, or a reply's GcsStatus) → typed exception."""
    cls = _RAY_STATUS.get(status)
    said = f"{status}: {text}" if text and text != status else status
    if cls is RayUnavailable:
        return RayUnavailable(
            f"{what}: {target} or the Raylet behind it is unreachable for now ({said})"
        )
    if cls is RayUnauthenticated:
        return RayUnauthenticated(
            f"{what}: {target} refused the call ({said}): " + _auth_hint(sent_token, token_from)
        )
    if cls is RayPermissionDenied:
        return RayPermissionDenied(
            f"{what}: {target} refused the call ({said}): the token is not allowed to call "
            f"{rpc}; use one that is ({TOKEN_ENV} or {TOKEN_PATH_ENV})"
        )
    if cls is RayUnsupported:
        return RayUnsupported(f"{what}: this Ray does not support {rpc} ({said}); {_NEEDS}")
    if cls is None:
        return RayRefused(
            f"{what}: Ray refused it with status {said}, which raysize does not know and "
            f"does not retry; {_NEEDS}"
        )
    return cls(f"{what}: {text}" if text and text != status else f"{what}: Ray said {status}")


def undecodable_reply(what: str, target: str, rpc: str, text: str) -> RayReplyError:
    return RayReplyError(f"{what}: cannot decode what {target} sent for {rpc} ({text}); {_NEEDS}")


def map_rpc_error(
    err: grpc.RpcError,
    *,
    target: str,
    what: str,
    sent_token: bool,
    method: str = "",
    timeout: float | None = None,
    token_from: str = "",
) -> RayError:
    """One gRPC failure → the typed exception with a one-line, actionable message.

    Retried (RayUnavailable): UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED (an
    overloaded GCS), CANCELLED, and INTERNAL or UNKNOWN. A Ray 2.60 GCS sends none of
    the last two itself (its own errors are ABORTED with a status name): they come from
    the transport ("Stream removed", an RST_STREAM from a proxy) and pass. Giving up on
    them would leave a Raylet out of step with its pod after a hiccup; the one INTERNAL
    that never passes, a reply raysize cannot decode, is told apart by gRPC's words
    and is a RayReplyError.

    Not retried: UNIMPLEMENTED (RayUnsupported: this Ray lacks the RPC), PERMISSION_DENIED
    and UNAUTHENTICATED (credentials), INVALID_ARGUMENT (the request), a Ray status
    raysize does not know (RayRefused), and codes Ray never sends (RayReplyError: not a
    Ray GCS at the address). `method` (the gRPC path) and `timeout` make the messages exact.
    """
    code = err.code()
    text = _error_text(err)
    rpc = _rpc_name(method)
    if code == grpc.StatusCode.ABORTED:
        status = str(err.details() or "").strip() or "ABORTED"
        return _from_ray_status(
            status,
            text,
            target=target,
            what=what,
            rpc=rpc,
            sent_token=sent_token,
            token_from=token_from,
        )
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return RayUnauthenticated(
            f"{what}: {target} refused the call ({text}): {_auth_hint(sent_token, token_from)}"
        )
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return _from_ray_status(
            "PermissionDenied", text, target=target, what=what, rpc=rpc, sent_token=sent_token
        )
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return RayUnsupported(
            f"{what}: this Ray does not support {rpc} ({target} answered UNIMPLEMENTED: "
            f"{text}); {_NEEDS}, and the address must be its GCS (the head's --port)"
        )
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return RayInvalidArgument(f"{what}: {target} refused the request: {text}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        within = f" within {timeout:g} s" if timeout is not None else " in time"
        return RayUnavailable(f"{what}: {target} did not answer{within}")
    if code == grpc.StatusCode.UNAVAILABLE:
        hint = ""
        if any(words in text for words in _NAME_MISMATCH):
            hint = (
                "; the GCS certificate does not name the address dialled: give a name it "
                f"has with --tls-server-name or {TLS_SERVER_NAME_ENV}"
            )
        return RayUnavailable(f"{what}: cannot reach {target}: {text}{hint}")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return RayUnavailable(f"{what}: {target} is overloaded ({text}); try again later")
    if code == grpc.StatusCode.CANCELLED:
        return RayUnavailable(f"{what}: the call to {target} was cancelled ({text})")
    if code == grpc.StatusCode.INTERNAL and text.startswith(_CODEC_FAILURES):
        return undecodable_reply(what, target, rpc, text)
    if code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN):
        return RayUnavailable(f"{what}: the call to {target} broke off ({code.name}: {text})")
    # NOT_FOUND, ALREADY_EXISTS, FAILED_PRECONDITION, OUT_OF_RANGE, DATA_LOSS: a Ray GCS
    # turns each error of its own into ABORTED, so something else answered.
    return RayReplyError(
        f"{what}: {target} answered {code.name} ({text}), which a Ray GCS never does: "
        f"check that the address is the Ray head's GCS port; {_NEEDS}"
    )


_STATE_PATH: Final = "/ray.rpc.autoscaler.AutoscalerStateService/GetClusterResourceState"


@dataclass(frozen=True)
class DrainReply:
    """What the GCS answered to a drain: accepted, or refused and why."""

    accepted: bool
    rejection: str = ""


class RayGcsClient:
    """The Ray GCS at `address` ("host:port", the head's --port, 6379 by default)."""

    def __init__(
        self,
        address: str,
        token: str | None = None,
        tls: TlsConfig | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        token_from: str = "",
    ) -> None:
        """`token_from`: where `token` was read (a cluster's Secret), named when Ray
        refuses it; the token itself is never in a message."""
        if not address or ":" not in address:
            raise RayInvalidArgument(f"GCS address {address!r} is not host:port")
        if not timeout > 0:
            raise RayInvalidArgument(f"timeout {timeout!r} must be > 0 seconds")
        self.address = address
        self.timeout = timeout
        self.token_from = token_from
        resolved = resolve_token(token)
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {resolved}"),) if resolved else ()
        )
        options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
            ("grpc.max_reconnect_backoff_ms", _MAX_RECONNECT_BACKOFF_MS),
        ]
        if tls is not None and tls.server_name:
            options.append(("grpc.ssl_target_name_override", tls.server_name))
        self._tls = tls
        self._options = options
        if tls is not None:
            self._channel = grpc.secure_channel(address, tls.credentials(), options=options)
        else:
            self._channel = grpc.insecure_channel(address, options=options)
        # The reconcile's wait reads the state from the event loop, without a thread hop:
        # a channel of grpc.aio, opened on first use in that loop (`read_fingerprint`).
        self._aio: tuple[asyncio.AbstractEventLoop, grpc.aio.Channel, Any] | None = None
        # closed (`close`): its cluster was deleted, or its token or address changed; a
        # call still made on it (a wait that holds it) fails as the GCS unavailable, and
        # opens no channel again
        self.closed = False
        # When this GCS publishes demands, learned from every state read (gcs_cadence).
        self.cadence = GcsCadence()
        # Built once: the per-call cost is then serialising and the round trip.
        self._get_cluster_resource_state = self._method(
            _STATE_PATH,
            autoscaler_pb2.GetClusterResourceStateRequest,
            autoscaler_pb2.GetClusterResourceStateReply,
        )
        self._resize_raylet_resource_instances = self._method(
            "/ray.rpc.autoscaler.AutoscalerStateService/ResizeRayletResourceInstances",
            autoscaler_pb2.ResizeRayletResourceInstancesRequest,
            autoscaler_pb2.ResizeRayletResourceInstancesReply,
        )
        self._drain_node = self._method(
            "/ray.rpc.autoscaler.AutoscalerStateService/DrainNode",
            autoscaler_pb2.DrainNodeRequest,
            autoscaler_pb2.DrainNodeReply,
        )
        self._get_all_node_info = self._method(
            "/ray.rpc.NodeInfoGcsService/GetAllNodeInfo",
            rpc_pb2.GetAllNodeInfoRequest,
            rpc_pb2.GetAllNodeInfoReply,
        )
        self._internal_kv_get = self._method(
            "/ray.rpc.InternalKVGcsService/InternalKVGet",
            rpc_pb2.InternalKVGetRequest,
            rpc_pb2.InternalKVGetReply,
        )

    def _method(
        self, path: str, request_type: type[Message], reply_type: type[Message]
    ) -> tuple[str, grpc.UnaryUnaryMultiCallable]:
        return path, self._channel.unary_unary(
            path,
            request_serializer=request_type.SerializeToString,
            response_deserializer=reply_type.FromString,
            _registered_method=True,
        )

    # --- lifecycle --------------------------------------------------------------------
    def close(self) -> None:
        self.closed = True
        self._channel.close()
        aio, self._aio = self._aio, None
        if aio is not None and aio[0].is_running():
            # closed in its own loop; a loop that has stopped took its channels with it
            asyncio.run_coroutine_threadsafe(aio[1].close(), aio[0])

    def _closed_error(self, what: str) -> RayUnavailable:
        return RayUnavailable(
            f"Ray GCS {self.address}: {what}: this client was closed (its cluster was "
            "deleted, or its token or address changed); the next call opens another"
        )

    def _aio_method(self) -> Any:
        if self.closed:
            raise self._closed_error("read cluster state")
        loop = asyncio.get_running_loop()
        if self._aio is None or self._aio[0] is not loop:
            if self._tls is not None:
                channel = grpc.aio.secure_channel(
                    self.address, self._tls.credentials(), options=self._options
                )
            else:
                channel = grpc.aio.insecure_channel(self.address, options=self._options)
            # the reply is decoded here, not by grpc.aio, which would log an undecodable
            # reply and answer None instead of failing the call
            method = channel.unary_unary(
                _STATE_PATH,
                request_serializer=autoscaler_pb2.GetClusterResourceStateRequest.SerializeToString,
                _registered_method=True,
            )
            self._aio = (loop, channel, method)
        return self._aio[2]

    def __enter__(self) -> RayGcsClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- calls ------------------------------------------------------------------------
    def _rpc_error(self, err: grpc.RpcError, what: str, path: str, deadline: float) -> RayError:
        """One failed call to this GCS, typed: the blocking and the event-loop calls alike."""
        return map_rpc_error(
            err,
            target=f"Ray GCS {self.address}",
            what=what,
            sent_token=bool(self._metadata),
            method=path,
            timeout=deadline,
            token_from=self.token_from,
        )

    def _call(
        self,
        method: tuple[str, grpc.UnaryUnaryMultiCallable],
        request: Any,
        what: str,
        timeout: float | None,
    ) -> Any:
        path, call = method
        deadline = self.timeout if timeout is None else timeout
        if self.closed:
            raise self._closed_error(what)
        try:
            reply = call(request, timeout=deadline, metadata=self._metadata)
        except grpc.RpcError as err:
            if self.closed:  # closed under the call (grpc cancels it)
                raise self._closed_error(what) from err
            raise self._rpc_error(err, what, path, deadline) from err
        status = getattr(reply, "status", None)
        if status is not None and status.code != 0:
            # The older GCS services answer gRPC OK and report their errors in the reply:
            # an unread status would read as an empty answer ("no nodes").
            raise _from_ray_status(
                _RAY_STATUS_NAMES.get(status.code, f"code {status.code}"),
                status.message,
                target=f"Ray GCS {self.address}",
                what=what,
                rpc=_rpc_name(path),
                sent_token=bool(self._metadata),
                token_from=self.token_from,
            )
        return reply

    def _read_state(self, timeout: float | None) -> autoscaler_pb2.GetClusterResourceStateReply:
        sent = time.monotonic()
        reply: autoscaler_pb2.GetClusterResourceStateReply = self._call(
            self._get_cluster_resource_state,
            autoscaler_pb2.GetClusterResourceStateRequest(),
            "read cluster state",
            timeout,
        )
        self.cadence.note(demand_digest(reply), sent, time.monotonic())
        return reply

    def cluster_state(self, *, timeout: float | None = None) -> ClusterState:
        """Nodes, pending demands, placement groups and constraints, in one call."""
        return parse_cluster_state(self._read_state(timeout))

    def state_fingerprint(self, *, timeout: float | None = None) -> int:
        """`state_fingerprint` of the cluster state, read without building the typed
        state: equal to `cluster_state().fingerprint` for the same state."""
        return state_fingerprint(self._read_state(timeout))

    async def read_fingerprint(self, *, timeout: float | None = None) -> int:
        """`state_fingerprint`, read from the running event loop (grpc.aio): the call the
        reconcile's wait makes a few times a second for every cluster, so no thread."""
        deadline = self.timeout if timeout is None else timeout
        method = self._aio_method()
        sent = time.monotonic()
        target, what = f"Ray GCS {self.address}", "read cluster state"
        try:
            raw = await method(
                autoscaler_pb2.GetClusterResourceStateRequest(),
                timeout=deadline,
                metadata=self._metadata,
            )
        except grpc.RpcError as err:
            if self.closed:
                raise self._closed_error(what) from err
            raise self._rpc_error(err, what, _STATE_PATH, deadline) from err
        try:
            reply = autoscaler_pb2.GetClusterResourceStateReply.FromString(raw)
        except DecodeError as err:
            # the words of gRPC's own decoding failure, as the blocking call reports it
            text = "Exception deserializing response!"
            raise undecodable_reply(what, target, _rpc_name(_STATE_PATH), text) from err
        self.cadence.note(demand_digest(reply), sent, time.monotonic())
        return state_fingerprint(reply)

    def nodes(
        self, *, alive_only: bool = False, timeout: float | None = None
    ) -> tuple[NodeInfo, ...]:
        """Every Raylet the GCS has registered, dead ones too unless `alive_only`."""
        request = rpc_pb2.GetAllNodeInfoRequest()
        if alive_only:
            request.state_filter = rpc_pb2.GcsNodeInfo.ALIVE
        reply = self._call(self._get_all_node_info, request, "list nodes", timeout)
        return parse_node_infos(reply)

    def ray_version(self, *, timeout: float | None = None) -> str:
        """The Ray version the cluster's head started with, as Ray records it in the GCS
        (the cluster metadata `ray` itself checks a joining node against)."""
        request = rpc_pb2.InternalKVGetRequest(
            key=CLUSTER_METADATA_KEY, namespace=CLUSTER_METADATA_NAMESPACE
        )
        reply = self._call(self._internal_kv_get, request, "read the cluster metadata", timeout)
        return ray_version_of(reply.value, what=f"Ray GCS {self.address}: cluster metadata")

    def resize_raylet(
        self,
        node_id: str | bytes,
        cpu: float,
        memory: float,
        *,
        timeout: float | None = None,
    ) -> Resources:
        """Set the Raylet's logical CPU (cores) and memory (bytes), through the GCS.

        Returns the totals the Raylet applied: a downsize below what is in use is clamped
        to what is in use, so the reply, not the request, is the truth.
        """
        return self.resize_raylet_resources(node_id, {CPU: cpu, MEMORY: memory}, timeout=timeout)

    def resize_raylet_resources(
        self,
        node_id: str | bytes,
        resources: Mapping[str, float] | Resources,
        *,
        timeout: float | None = None,
    ) -> Resources:
        """`resize_raylet` from a map of Ray amounts, or from exact `Resources`."""
        raw = node_id_bytes(node_id)
        request = autoscaler_pb2.ResizeRayletResourceInstancesRequest(
            node_id=raw, resources=resize_request(resources)
        )
        what = f"resize Raylet {raw.hex()}"
        reply = self._call(self._resize_raylet_resource_instances, request, what, timeout)
        return ray_amounts(reply.total_resources, what=f"{what}: reply")

    def drain_node(
        self, node_id: str | bytes, reason_message: str, *, timeout: float | None = None
    ) -> DrainReply:
        """Ask the GCS to drain an idle Raylet before its pod is removed, as Ray's own
        autoscaler does (`DrainNode`, reason `IDLE_TERMINATION`, no deadline).

        A Raylet that runs work refuses (`accepted=False`, its reason in `rejection`); once
        accepted it takes no new work, so the pod must then go. A node the GCS knows as
        dead is accepted at once (docs/design/ray-protocol.md §7).
        """
        raw = node_id_bytes(node_id)
        request = autoscaler_pb2.DrainNodeRequest(
            node_id=raw,
            reason=autoscaler_pb2.DRAIN_NODE_REASON_IDLE_TERMINATION,
            reason_message=reason_message,
            deadline_timestamp_ms=0,
        )
        reply = self._call(self._drain_node, request, f"drain Raylet {raw.hex()}", timeout)
        return DrainReply(accepted=reply.is_accepted, rejection=reply.rejection_reason_message)
