"""Every way a GCS call can fail, as the client reports it, and how the workflows see it;
the deadline of a call to a GCS that never answers; one channel for all calls.

No Ray: a stand-in gRPC server in this process answers the way docs/design/ray-protocol.md §3(c)
says Ray 2.60 does (ABORTED with Ray's status name as the details and the message in
the `grpc-status-details-bin` trailer, UNAUTHENTICATED for a token), or with any other
gRPC code. The client is the real `RayGcsClient`; the errors are real `grpc.RpcError`s.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from raysize.activities.cluster import _ray_error
from raysize.activities.ray_gcs import (
    RayError,
    RayGcsClient,
    RayInvalidArgument,
    RayletNotFound,
    RayPermissionDenied,
    RayRefused,
    RayReplyError,
    RayUnauthenticated,
    RayUnavailable,
    RayUnsupported,
)
from raysize.activities.ray_proto import ray_rpc_pb2 as rpc
from raysize.sandbox.gcs_standin import GcsStandIn
from raysize.workflows.contracts import Err
from tests.e2e.gcs_proxy import GcsProxy

NODE = os.urandom(28)
TRAILER = "grpc-status-details-bin"

Handler = Callable[[bytes, grpc.ServicerContext], bytes]


def aborts(code: grpc.StatusCode, details: str, trailer: str | None = None) -> Handler:
    """A handler that fails the call the way a GCS does."""

    def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
        if trailer is not None:
            context.set_trailing_metadata(((TRAILER, trailer.encode()),))
        context.abort(code, details)
        raise AssertionError("unreachable")

    return handle


class StandIn:
    """A GCS stand-in whose AutoscalerStateService does whatever `handler` says.

    It serves no NodeInfoGcsService: GetAllNodeInfo is UNIMPLEMENTED, as on a Ray without
    the RPC."""

    def __init__(self) -> None:
        self.handler: Handler = lambda request, context: b""
        self.release = threading.Event()
        rpcs = {
            name: grpc.unary_unary_rpc_method_handler(lambda r, c: self.handler(r, c))
            for name in ("GetClusterResourceState", "ResizeRayletResourceInstances")
        }
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "ray.rpc.autoscaler.AutoscalerStateService", rpcs
                ),
            )
        )
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def close(self) -> None:
        self.release.set()  # a handler that never answers lets go now
        self.server.stop(grace=None).wait(5)


@pytest.fixture(scope="module")
def standin() -> Iterator[StandIn]:
    server = StandIn()
    try:
        yield server
    finally:
        server.close()


@dataclass(frozen=True)
class Case:
    handler: Handler
    raised: type[RayError]
    retryable: bool
    says: str
    call: str = "resize"  # or "state", "nodes"
    token: str | None = None


CASES = {
    # docs/design/ray-protocol.md §3(c): what Ray 2.60 answers
    "not-found": Case(
        aborts(grpc.StatusCode.ABORTED, "NotFound", f"Raylet {NODE.hex()} is not alive."),
        RayletNotFound,
        False,
        f"resize Raylet {NODE.hex()}: Raylet {NODE.hex()} is not alive.",
    ),
    "invalid-argument": Case(
        aborts(
            grpc.StatusCode.ABORTED,
            "InvalidArgument",
            "Cannot resize unit instance resource 'GPU'.",
        ),
        RayInvalidArgument,
        False,
        "Cannot resize unit instance resource 'GPU'.",
    ),
    "disconnected": Case(
        aborts(grpc.StatusCode.ABORTED, "Disconnected", "GRPC client is shut down."),
        RayUnavailable,
        True,
        "the Raylet behind it is unreachable for now (Disconnected: GRPC client is shut down.)",
    ),
    "unauthenticated-no-token": Case(
        aborts(
            grpc.StatusCode.UNAUTHENTICATED,
            "InvalidAuthToken: Authentication token is missing or incorrect",
        ),
        RayUnauthenticated,
        False,
        "no token was sent; set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH",
        call="state",
    ),
    "unauthenticated-wrong-token": Case(
        aborts(
            grpc.StatusCode.UNAUTHENTICATED,
            "InvalidAuthToken: Authentication token is missing or incorrect",
        ),
        RayUnauthenticated,
        False,
        "the token sent is wrong; check RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH",
        call="state",
        token="not-the-token",
    ),
    # Ray statuses the two GCS RPCs could carry, and one raysize does not know
    "ray-unauthenticated": Case(
        aborts(grpc.StatusCode.ABORTED, "Unauthenticated", "bad token"),
        RayUnauthenticated,
        False,
        "(Unauthenticated: bad token): no token was sent; set RAY_AUTH_TOKEN",
    ),
    "ray-permission-denied": Case(
        aborts(grpc.StatusCode.ABORTED, "PermissionDenied", "not allowed"),
        RayPermissionDenied,
        False,
        "the token is not allowed to call AutoscalerStateService.ResizeRayletResourceInstances",
    ),
    "ray-not-implemented": Case(
        aborts(grpc.StatusCode.ABORTED, "NotImplemented", "no resize here"),
        RayUnsupported,
        False,
        "this Ray does not support AutoscalerStateService.ResizeRayletResourceInstances "
        "(NotImplemented: no resize here); raysize needs Ray ≥ 2.60",
    ),
    "ray-redis-error": Case(
        aborts(grpc.StatusCode.ABORTED, "RedisError", "redis went away"),
        RayUnavailable,
        True,
        "RedisError: redis went away",
    ),
    "ray-status-unknown-to-raysize": Case(
        aborts(grpc.StatusCode.ABORTED, "SchedulingCancelled", "cancelled"),
        RayRefused,
        False,
        "Ray refused it with status SchedulingCancelled: cancelled, which raysize does not "
        "know and does not retry",
    ),
    "aborted-without-message": Case(
        aborts(grpc.StatusCode.ABORTED, "NotFound"), RayletNotFound, False, "Ray said NotFound"
    ),
    # gRPC codes
    "permission-denied": Case(
        aborts(grpc.StatusCode.PERMISSION_DENIED, "SubjectAccessReview denied"),
        RayPermissionDenied,
        False,
        "(PermissionDenied: SubjectAccessReview denied): the token is not allowed to call "
        "AutoscalerStateService.GetClusterResourceState",
        call="state",
        token="known-but-not-allowed",
    ),
    "unimplemented": Case(
        lambda r, c: b"",  # GetAllNodeInfo is not served at all
        RayUnsupported,
        False,
        "list nodes: this Ray does not support NodeInfoGcsService.GetAllNodeInfo",
        call="nodes",
    ),
    "invalid-argument-code": Case(
        aborts(grpc.StatusCode.INVALID_ARGUMENT, "bad node id"),
        RayInvalidArgument,
        False,
        "refused the request: bad node id",
    ),
    "resource-exhausted": Case(
        aborts(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many requests"),
        RayUnavailable,
        True,
        "is overloaded (too many requests)",
    ),
    "unavailable": Case(
        aborts(grpc.StatusCode.UNAVAILABLE, "shutting down"),
        RayUnavailable,
        True,
        "cannot reach Ray GCS",
    ),
    "cancelled": Case(
        aborts(grpc.StatusCode.CANCELLED, "server shut down"),
        RayUnavailable,
        True,
        "was cancelled (server shut down)",
    ),
    "internal": Case(
        aborts(grpc.StatusCode.INTERNAL, "Received RST_STREAM with error code 2"),
        RayUnavailable,
        True,
        "broke off (INTERNAL: Received RST_STREAM with error code 2)",
    ),
    "unknown": Case(
        aborts(grpc.StatusCode.UNKNOWN, "Stream removed"),
        RayUnavailable,
        True,
        "broke off (UNKNOWN: Stream removed)",
    ),
    "undecodable-reply": Case(
        lambda r, c: b"\xff\xff\xff",
        RayReplyError,
        False,
        "cannot decode what Ray GCS",
        call="state",
    ),
    **{
        f"foreign-{code.name.lower()}": Case(
            aborts(code, "from something else"),
            RayReplyError,
            False,
            f"answered {code.name} (from something else), which a Ray GCS never does",
        )
        for code in (
            grpc.StatusCode.NOT_FOUND,
            grpc.StatusCode.ALREADY_EXISTS,
            grpc.StatusCode.FAILED_PRECONDITION,
            grpc.StatusCode.OUT_OF_RANGE,
            grpc.StatusCode.DATA_LOSS,
        )
    },
}


def call(client: RayGcsClient, which: str) -> Any:
    if which == "state":
        return client.cluster_state()
    if which == "nodes":
        return client.nodes()
    return client.resize_raylet(NODE.hex(), 1, 1e9)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_each_failure_is_typed_with_a_message_and_reaches_temporal_as_it_should(
    standin: StandIn, case: Case
) -> None:
    standin.handler = case.handler
    client = RayGcsClient(standin.address, token=case.token, timeout=5)
    with client, pytest.raises(RayError) as caught:
        call(client, case.call)
    exc = caught.value
    assert type(exc) is case.raised, f"{type(exc).__name__}: {exc}"
    assert exc.retryable is case.retryable
    assert case.says in str(exc)
    assert "\n" not in str(exc)

    # What the activities hand to Temporal: a non-retryable error stops every policy.
    app = _ray_error(exc)
    assert app.non_retryable is (not case.retryable)
    assert app.message == str(exc)
    expected_type = {
        RayletNotFound: Err.RAYLET_GONE,
        RayUnauthenticated: Err.RAY_AUTH,
        RayPermissionDenied: Err.RAY_AUTH,
        RayInvalidArgument: Err.RAY_INVALID,
    }.get(case.raised, case.raised.__name__)
    assert app.type == expected_type


@pytest.mark.parametrize(
    "code", [c for c in grpc.StatusCode if c != grpc.StatusCode.OK], ids=lambda c: c.name
)
def test_no_grpc_code_falls_back_to_the_unclassified_base_error(
    standin: StandIn, code: grpc.StatusCode
) -> None:
    """The base RayError is what nobody decided about; no code may end there."""
    standin.handler = aborts(code, "whatever")
    with RayGcsClient(standin.address, timeout=5) as client, pytest.raises(RayError) as caught:
        client.cluster_state()
    assert type(caught.value) is not RayError


def test_an_unreachable_gcs_is_retryable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        client = RayGcsClient(f"127.0.0.1:{port}", timeout=5)
        with client, pytest.raises(RayUnavailable, match="cannot reach Ray GCS") as caught:
            client.cluster_state()
    assert caught.value.retryable and not _ray_error(caught.value).non_retryable


# --- GetAllNodeInfo: errors in the reply --------------------------------------------------


@pytest.mark.parametrize(
    ("code", "raised", "says"),
    [
        (5, RayUnavailable, "unreachable for now (IOError: store timed out)"),
        (34, RayInvalidArgument, "list nodes: store timed out"),
        (99, RayRefused, "status code 99: store timed out"),
    ],
    ids=["io-error", "invalid-argument", "unknown-code"],
)
def test_a_node_list_with_an_error_status_is_an_error_not_an_empty_list(
    code: int, raised: type[RayError], says: str
) -> None:
    """GetAllNodeInfo answers gRPC OK and puts a failure in the reply's GcsStatus."""
    reply = rpc.GetAllNodeInfoReply(
        status=rpc.GcsStatus(code=code, message="store timed out")
    ).SerializeToString()
    rpcs = {"GetAllNodeInfo": grpc.unary_unary_rpc_method_handler(lambda r, c: reply)}
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("ray.rpc.NodeInfoGcsService", rpcs),)
    )
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    try:
        client = RayGcsClient(address, timeout=5)
        with client, pytest.raises(RayError) as caught:
            client.nodes()
    finally:
        server.stop(grace=None).wait(5)
    assert type(caught.value) is raised
    assert says in str(caught.value)


@pytest.mark.parametrize(
    "case",
    [c for c in CASES.values() if c.call != "nodes"],
    ids=[k for k, c in CASES.items() if c.call != "nodes"],
)
def test_the_waits_event_loop_read_fails_as_the_observes_read_does(
    standin: StandIn, case: Case
) -> None:
    """The reconcile's wait reads the state with grpc.aio, the observe with a blocking
    call: the same failure must be the same typed error with the same words."""
    standin.handler = case.handler
    client = RayGcsClient(standin.address, token=case.token, timeout=5)
    with client:
        with pytest.raises(RayError) as blocking:
            client.cluster_state()
        with pytest.raises(RayError) as in_loop:
            asyncio.run(client.read_fingerprint())
    assert type(in_loop.value) is type(blocking.value)
    assert str(in_loop.value) == str(blocking.value)
    assert in_loop.value.retryable is blocking.value.retryable


# --- deadline ---------------------------------------------------------------------------


def test_a_gcs_that_never_answers_is_unavailable_within_the_timeout(standin: StandIn) -> None:
    def hang(request: bytes, context: grpc.ServicerContext) -> bytes:
        standin.release.wait(30)
        return b""

    standin.handler = hang
    with RayGcsClient(standin.address, timeout=0.3) as client:
        started = time.monotonic()
        with pytest.raises(RayUnavailable, match=r"did not answer within 0\.3 s") as caught:
            client.resize_raylet(NODE.hex(), 1, 1e9)
        took = time.monotonic() - started
    assert caught.value.retryable
    assert 0.25 <= took < 1.5, f"took {took:.2f} s with a 0.3 s timeout"


def test_a_gcs_that_accepts_but_never_speaks_is_unavailable_within_the_timeout() -> None:
    """A hung GCS process: the kernel accepts the connection, nothing answers."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        with RayGcsClient(address, timeout=0.3) as client:
            started = time.monotonic()
            with pytest.raises(RayUnavailable, match=r"did not answer within 0\.3 s"):
                client.cluster_state()
            took = time.monotonic() - started
    assert took < 1.5, f"took {took:.2f} s with a 0.3 s timeout"


# --- one channel --------------------------------------------------------------------------


def test_calls_share_one_channel_and_one_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """Thirty calls of all three kinds: one channel made, one TCP connection at the GCS.

    Both are counted: gRPC Python shares connections between channels to the same
    address, so a client that made a channel per call could still show one connection.
    """
    made: list[str] = []
    real = grpc.insecure_channel

    def counting(target: str, *args: Any, **kwargs: Any) -> grpc.Channel:
        made.append(target)
        return real(target, *args, **kwargs)

    monkeypatch.setattr(grpc, "insecure_channel", counting)
    with GcsStandIn() as gcs, GcsProxy(gcs.address) as proxy:
        with RayGcsClient(proxy.address, timeout=5) as client:
            for _ in range(10):
                client.cluster_state()
                client.nodes()
                client.resize_raylet(NODE.hex(), 1, 1e9)
        assert gcs.resizes == 10
        assert proxy.forwarded == 1
    assert made == [proxy.address]
