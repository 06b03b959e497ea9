"""Connecting to Temporal the way every raysize command does."""

from __future__ import annotations

from datetime import timedelta

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client, TLSConfig
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode

from raysize.worker.settings import Settings
from raysize.worker.telemetry import Telemetry, default_interceptors
from raysize.workflows.naming import SEARCH_ATTRIBUTES


class SetupError(RuntimeError):
    """Something the operator must fix before raysize can run; the message says how."""


async def connect(settings: Settings, telemetry: Telemetry | None = None) -> Client:
    """A client with raysize's data converter and telemetry interceptors (workers built
    from it inherit them); `telemetry` brings the metrics runtime and span export."""
    tls: TLSConfig | bool = False
    if settings.temporal_tls_cert or settings.temporal_tls_ca or settings.temporal_api_key:
        tls = TLSConfig(
            server_root_ca_cert=settings.temporal_tls_ca.read_bytes()
            if settings.temporal_tls_ca
            else None,
            client_cert=settings.temporal_tls_cert.read_bytes()
            if settings.temporal_tls_cert
            else None,
            client_private_key=settings.temporal_tls_key.read_bytes()
            if settings.temporal_tls_key
            else None,
        )
    try:
        client = await Client.connect(
            settings.temporal_address,
            namespace=settings.temporal_namespace,
            tls=tls,
            api_key=settings.temporal_api_key,
            data_converter=pydantic_data_converter,
            interceptors=telemetry.interceptors if telemetry else default_interceptors(),
            runtime=telemetry.runtime if telemetry else None,
        )
    except RuntimeError as exc:
        raise SetupError(
            f"cannot reach Temporal at {settings.temporal_address} "
            f"(namespace {settings.temporal_namespace!r}): {exc}. Set RAYSIZE_TEMPORAL_ADDRESS "
            "or start a dev server with `temporal server start-dev`."
        ) from exc
    await check_namespace(client, settings)
    return client


async def check_namespace(client: Client, settings: Settings) -> None:
    """Refuse a Temporal namespace that does not exist: the worker would otherwise fail
    with a traceback, and a client command would report "no such workflow". Any other
    answer (no permission to describe it, say) is left to the calls that follow."""
    try:
        await client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace=settings.temporal_namespace),
            timeout=timedelta(seconds=10),
        )
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise SetupError(
                f"RAYSIZE_TEMPORAL_NAMESPACE: namespace {settings.temporal_namespace!r} does not "
                f"exist on Temporal at {settings.temporal_address}. Set RAYSIZE_TEMPORAL_NAMESPACE "
                "to an existing namespace, or create it: temporal operator namespace create "
                f"--namespace {settings.temporal_namespace}"
            ) from None


def search_attribute_command(namespace: str) -> str:
    flags = " ".join(f"--name {k.name} --type Keyword" for k in SEARCH_ATTRIBUTES)
    return f"temporal operator search-attribute create --namespace {namespace} {flags}"


async def ensure_search_attributes(client: Client, *, register: bool = True) -> list[str]:
    """Make sure raysize's search attributes exist; returns those it added.

    An unregistered attribute would wedge every resize workflow's first task, so a worker
    that cannot register them stops and prints the exact command to run instead."""
    try:
        listed = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=client.namespace)
        )
        have = set(listed.custom_attributes) | set(listed.system_attributes)
    except RPCError:
        have = set()
    missing = [k.name for k in SEARCH_ATTRIBUTES if k.name not in have]
    if not missing:
        return []
    if not register:
        raise SetupError(
            f"search attributes {', '.join(missing)} are not registered in namespace "
            f"{client.namespace!r}. Run: {search_attribute_command(client.namespace)}"
        )
    try:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(
                namespace=client.namespace,
                search_attributes={
                    name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD for name in missing
                },
            )
        )
    except RPCError as exc:
        if exc.status in (RPCStatusCode.PERMISSION_DENIED, RPCStatusCode.UNIMPLEMENTED):
            raise SetupError(
                f"raysize may not register its search attributes ({exc.message}). Ask an "
                f"admin to run: {search_attribute_command(client.namespace)}"
            ) from exc
        if exc.status != RPCStatusCode.ALREADY_EXISTS:
            raise
    return missing
