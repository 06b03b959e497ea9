"""Serving a service of raysize's Ray protocol (`activities/ray_proto/*.proto`) from a
stand-in: the handlers come from the service's descriptor, so the product ships no
generated server code (it only calls Ray; `scripts/gen_ray_proto.py` generates messages).

    add_service(server, rpc_pb2, "NodeInfoGcsService", impl)

registers each method of the service that `impl` defines (`Method(request, context)`);
a method it leaves out answers UNIMPLEMENTED, as gRPC answers a method nobody serves.
A method ends with an error status by raising `Abort` (the same on a `grpc.aio` server:
`asynchronous=True` wraps each method in a coroutine, as that server wants).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any

import grpc
from google.protobuf import message_factory


class Abort(Exception):
    """Raised by a method: the call ends with `code` and `details`."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


def _sync(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def method(request: Any, context: Any) -> Any:
        try:
            return fn(request, context)
        except Abort as e:
            context.abort(e.code, e.details)

    return method


def _async(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Awaitable[Any]]:
    async def method(request: Any, context: Any) -> Any:
        try:
            return fn(request, context)
        except Abort as e:
            await context.abort(e.code, e.details)

    return method


def add_service(
    server: grpc.Server | grpc.aio.Server,
    pb2: ModuleType,
    service: str,
    impl: object,
    *,
    asynchronous: bool = False,
) -> None:
    desc = pb2.DESCRIPTOR.services_by_name[service]
    handlers: dict[str, Any] = {}
    for method in desc.methods:
        fn = getattr(impl, method.name, None)
        if fn is None:
            continue
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            _async(fn) if asynchronous else _sync(fn),
            request_deserializer=message_factory.GetMessageClass(method.input_type).FromString,
            response_serializer=message_factory.GetMessageClass(
                method.output_type
            ).SerializeToString,
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(desc.full_name, handlers),)
    )
