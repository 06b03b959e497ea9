"""Connecting to Temporal the way every raysize command does."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client, TLSConfig
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode

from raysize.worker.health import (
    STATE_OK,
    STATE_REFUSED,
    STATE_UNREACHABLE,
    write_temporal_state,
)
from raysize.worker.settings import Settings
from raysize.worker.telemetry import Telemetry, default_interceptors
from raysize.workflows.naming import SEARCH_ATTRIBUTES

log = logging.getLogger("raysize.temporal")


class SetupError(RuntimeError):
    """Something the operator must fix before raysize can run; the message says how."""


TLS_CA, TLS_CERT, TLS_KEY = (
    "RAYSIZE_TEMPORAL_TLS_CA",
    "RAYSIZE_TEMPORAL_TLS_CERT",
    "RAYSIZE_TEMPORAL_TLS_KEY",
)
TLS_ON, SERVER_NAME = "RAYSIZE_TEMPORAL_TLS", "RAYSIZE_TEMPORAL_TLS_SERVER_NAME"
API_KEY, API_KEY_FILE = "RAYSIZE_TEMPORAL_API_KEY", "RAYSIZE_TEMPORAL_API_KEY_FILE"
ADDRESS = "RAYSIZE_TEMPORAL_ADDRESS"


def credential_files(settings: Settings) -> dict[str, Path]:
    """The credential files the worker reads, by the variable that names each."""
    named = {
        TLS_CA: settings.temporal_tls_ca,
        TLS_CERT: settings.temporal_tls_cert,
        TLS_KEY: settings.temporal_tls_key,
        API_KEY_FILE: settings.temporal_api_key_file,
    }
    return {variable: path for variable, path in named.items() if path is not None}


def _read(variable: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SetupError(
            f"{variable}: cannot read {str(path)!r}: {exc.strerror or exc} (point {variable} at "
            "a readable file, or unset it)"
        ) from None


def api_key(settings: Settings) -> str | None:
    """The API key: RAYSIZE_TEMPORAL_API_KEY_FILE's content (read now), else the variable."""
    if settings.temporal_api_key_file is None:
        return settings.temporal_api_key
    key = _read(API_KEY_FILE, settings.temporal_api_key_file).decode(errors="replace").strip()
    if not key:
        raise SetupError(
            f"{API_KEY_FILE}: {str(settings.temporal_api_key_file)!r} is empty (put the API key "
            "in it, or unset it)"
        )
    return key


def tls_on(settings: Settings) -> bool:
    return bool(
        settings.temporal_tls
        or settings.temporal_tls_server_name
        or credential_files(settings)  # a TLS file or the API key file
        or settings.temporal_api_key
    )


def tls_config(settings: Settings) -> TLSConfig | bool:
    """TLS as the settings say, the files read now: False (plain text), or a TLSConfig
    (the system's CAs when no CA file is given). An API key turns TLS on, as Temporal
    Cloud needs."""
    if not tls_on(settings):
        return False
    files = {v: _read(v, p) for v, p in credential_files(settings).items() if v != API_KEY_FILE}
    return TLSConfig(
        server_root_ca_cert=files.get(TLS_CA),
        domain=settings.temporal_tls_server_name,
        client_cert=files.get(TLS_CERT),
        client_private_key=files.get(TLS_KEY),
    )


# --- what went wrong, named ------------------------------------------------------------------


@dataclass(frozen=True)
class Trouble:
    """Why Temporal cannot be used: `kind` STATE_UNREACHABLE (nothing answers: a restart of
    either side may help) or STATE_REFUSED (it answers, but the TLS or the credentials do not
    match: the settings or the files must change); `reason` names the RAYSIZE_* variable
    to fix; `why` is the short cause."""

    kind: str
    reason: str
    why: str


_TRANSPORT_CLOSED = (
    "transport error",
    "broken pipe",
    "connection reset",
    "unexpectedeof",
    "close_notify",
    "certificaterequired",
    "certificate required",
    "handshake",
    "connection closed",
    "operation was canceled",
)


def diagnose(settings: Settings, message: str, status: RPCStatusCode | None = None) -> Trouble:
    """Name what is wrong from a failed connect (the core's message) or call (its status)."""
    address, namespace = settings.temporal_address, settings.temporal_namespace
    low = message.lower()
    key_var = API_KEY_FILE if settings.temporal_api_key_file else API_KEY
    has_key = settings.temporal_api_key_file is not None or settings.temporal_api_key is not None
    tls = tls_on(settings)
    if "unauthenticated" in low or status == RPCStatusCode.UNAUTHENTICATED:
        detail = message.rpartition('message: "')[2].partition('"')[0] or message
        if has_key:
            return Trouble(
                STATE_REFUSED,
                f"{key_var}: Temporal at {address} refused the API key ({detail}): give a valid "
                f"key in {key_var}",
                "API key refused",
            )
        return Trouble(
            STATE_REFUSED,
            f"{API_KEY_FILE}: Temporal at {address} asks for credentials ({detail}): set "
            f"{API_KEY_FILE} (or {API_KEY}), or a client certificate ({TLS_CERT}, {TLS_KEY})",
            "credentials refused",
        )
    if "permissiondenied" in low.replace(" ", "") or status == RPCStatusCode.PERMISSION_DENIED:
        creds = key_var if has_key else f"{TLS_CERT} (the client certificate)"
        return Trouble(
            STATE_REFUSED,
            f"{creds}: Temporal at {address} denies these credentials access to namespace "
            f"{namespace!r} ({message}): give them access, or set RAYSIZE_TEMPORAL_NAMESPACE",
            "permission denied",
        )
    if "invalidcontenttype" in low or "corrupt message" in low or "wrong_version" in low:
        return Trouble(
            STATE_REFUSED,
            f"{TLS_ON}: TLS is on, but Temporal at {address} answers in plain text: unset "
            f"{TLS_ON}, {TLS_CA}, {SERVER_NAME} and the client certificate (an API key turns "
            "TLS on too), or check RAYSIZE_TEMPORAL_ADDRESS",
            "TLS on, the server speaks plain text",
        )
    if "notvalidforname" in low:
        presented = ", ".join(re.findall(r'DnsName\(\\?"([^"\\]+)', message)) or "other names"
        return Trouble(
            STATE_REFUSED,
            f"{SERVER_NAME}: the certificate of Temporal at {address} is for {presented}, not "
            f"for {settings.temporal_tls_server_name or address.rpartition(':')[0]}: set "
            f"{SERVER_NAME} to the name it is for",
            "server name mismatch",
        )
    if "invalidcertificate" in low or "invalid peer certificate" in low:
        kind = re.search(r"(?:InvalidCertificate\(|invalid peer certificate: )(\w+)", message)
        cause = kind.group(1) if kind else "certificate verify failed"
        fix = (
            f"{TLS_CA} ({settings.temporal_tls_ca}) does not hold the CA that signed it"
            if settings.temporal_tls_ca
            else f"set {TLS_CA} to the CA bundle that signed it"
        )
        return Trouble(
            STATE_REFUSED,
            f"{TLS_CA}: the certificate of Temporal at {address} is not trusted (certificate "
            f"verify failed: {cause}): {fix}",
            f"certificate verify failed: {cause}",
        )
    if any(word in low for word in _TRANSPORT_CLOSED) and "tcp connect" not in low:
        if not tls:
            return Trouble(
                STATE_REFUSED,
                f"{TLS_ON}: Temporal at {address} closed a plain-text connection: it expects "
                f"TLS: set {TLS_ON}=true (the system's CAs) or {TLS_CA}",
                "TLS off, the server expects TLS",
            )
        if settings.temporal_tls_cert:
            return Trouble(
                STATE_REFUSED,
                f"{TLS_CERT}: Temporal at {address} refused this worker's client certificate "
                f"({settings.temporal_tls_cert}): give {TLS_CERT} and {TLS_KEY} a certificate "
                "signed by a CA the server trusts",
                "client certificate refused",
            )
        return Trouble(
            STATE_REFUSED,
            f"{TLS_CERT}: Temporal at {address} closed the TLS connection: it may want a client "
            f"certificate (mTLS): set {TLS_CERT} and {TLS_KEY}",
            "no client certificate",
        )
    why = message
    found = re.search(r'message: "([^"]+)"', message)
    if found:
        why = found.group(1)
    if "404" in low and "unimplemented" in low:
        why = "something that is not a Temporal frontend answered (HTTP 404)"
    return Trouble(
        STATE_UNREACHABLE,
        f"cannot reach Temporal at {address} (namespace {namespace!r}): {why}. Set "
        f"{ADDRESS} or start a dev server with `temporal server start-dev`.",
        why,
    )


async def connect(settings: Settings, telemetry: Telemetry | None = None) -> Client:
    """A client with raysize's data converter and telemetry interceptors (workers built
    from it inherit them); `telemetry` brings the metrics runtime and span export. The
    credential files are read now; a failure says what is wrong (TLS on or off, the CA,
    the server name, the client certificate, the API key, or no server at all)."""
    tls = tls_config(settings)
    key = api_key(settings)
    try:
        client = await Client.connect(
            settings.temporal_address,
            namespace=settings.temporal_namespace,
            tls=tls,
            api_key=key,
            data_converter=pydantic_data_converter,
            interceptors=telemetry.interceptors if telemetry else default_interceptors(),
            runtime=telemetry.runtime if telemetry else None,
        )
    except RuntimeError as exc:
        raise SetupError(diagnose(settings, str(exc)).reason) from exc
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
        if exc.status in (RPCStatusCode.UNAUTHENTICATED, RPCStatusCode.PERMISSION_DENIED):
            raise SetupError(diagnose(settings, exc.message, exc.status).reason) from None


def search_attribute_command(namespace: str) -> str:
    flags = " ".join(f"--name {k.name} --type Keyword" for k in SEARCH_ATTRIBUTES)
    return f"temporal operator search-attribute create --namespace {namespace} {flags}"


class SearchAttributesUnknown(SetupError):
    """Temporal would not list the search attributes (no operator rights): they may be
    registered or not; `raysize doctor` warns instead of failing."""


async def ensure_search_attributes(client: Client, *, register: bool = True) -> list[str]:
    """Make sure raysize's search attributes exist; returns those it added.

    An unregistered attribute would wedge every resize workflow's first task, so a worker
    that cannot register them stops and prints the exact command to run instead."""
    unlisted = ""  # why the server would not list them (then they may well be there)
    try:
        listed = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=client.namespace)
        )
        have = set(listed.custom_attributes) | set(listed.system_attributes)
    except RPCError as exc:
        have, unlisted = set(), f"{exc.status.name if exc.status else 'error'}: {exc.message}"
    missing = [k.name for k in SEARCH_ATTRIBUTES if k.name not in have]
    if not missing:
        return []
    if not register:
        if unlisted:
            raise SearchAttributesUnknown(
                f"cannot tell whether raysize's search attributes are registered in namespace "
                f"{client.namespace!r}: Temporal would not list them ({unlisted}); an API key "
                "without operator rights may not. If they are missing, an admin runs: "
                f"{search_attribute_command(client.namespace)}"
            )
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


# --- watching the connection and the credential files ----------------------------------------
def fingerprints(settings: Settings) -> dict[str, str | None]:
    """A digest of each credential file's content (None: unreadable now), by variable."""
    out: dict[str, str | None] = {}
    for variable, path in credential_files(settings).items():
        try:
            out[variable] = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError:
            out[variable] = None
    return out


class TemporalWatch:
    """Every `RAYSIZE_TEMPORAL_CHECK_S` seconds: apply credential files that changed, and
    look at the connection (one DescribeNamespace call, as the worker's credentials see
    it).

    - The API key file changed: the live connection uses the new key (`client.api_key`).
    - A TLS file changed: a new client with the new files, handed to `on_client` (the
      worker takes it: `Worker.client`, in-process; calls in flight end on the old one).
    Both are logged once; a change that cannot be applied yet (a half-written rotation, a
    refused certificate) is logged once and tried again every round.

    The connection's state (ok, unreachable, refused) is logged once when it changes:
    `Temporal at <addr> is unreachable: <why>`, then `Temporal at <addr> is back after
    <N>s`; and recorded in `state_file` for the readiness probe (worker/health.py)."""

    def __init__(
        self,
        settings: Settings,
        client: Client,
        *,
        telemetry: Telemetry | None = None,
        state_file: Path | None = None,
        on_client: Callable[[Client], None] | None = None,
    ) -> None:
        self.settings = settings
        self.client = client
        self.telemetry = telemetry
        self.state_file = state_file
        self.on_client = on_client
        self.applied = fingerprints(settings)  # what the client was made with (about)
        self.failed: dict[str, str | None] | None = None
        self.state, self.since, self.reason = STATE_OK, time.time(), ""

    async def run(self) -> None:
        self._record()
        try:
            while True:
                await asyncio.sleep(self.settings.temporal_check_s)
                await self.check()
        finally:
            if self.state_file is not None:
                with contextlib.suppress(OSError):
                    self.state_file.unlink()

    async def check(self) -> None:
        await self._credentials()
        await self._connection()

    async def _credentials(self) -> None:
        now = fingerprints(self.settings)
        if now == self.applied:
            return
        changed = ", ".join(v for v in now if now[v] != self.applied.get(v))
        address = self.settings.temporal_address
        try:
            if any(now[v] != self.applied.get(v) for v in now if v != API_KEY_FILE):
                client = await connect(self.settings, self.telemetry)
                if self.on_client is not None:
                    self.on_client(client)
                self.client = client
                log.info(
                    "%s changed: reconnected to Temporal at %s with the new files", changed, address
                )
            else:
                self.client.api_key = api_key(self.settings)
                log.info(
                    "%s changed: the connection to Temporal at %s uses the new key",
                    changed,
                    address,
                )
        except SetupError as exc:
            if now != self.failed:
                log.warning(
                    "%s changed, but the worker cannot use it yet: %s. It keeps its connection "
                    "and tries again every %gs",
                    changed,
                    exc,
                    self.settings.temporal_check_s,
                )
            self.failed = now
            return
        self.applied, self.failed = now, None

    async def _connection(self) -> None:
        trouble = await self._probe()
        if trouble is not None and trouble.kind == STATE_REFUSED:  # once more, on a fresh
            trouble = await self._probe()  # connection: a server going away can close a
        self.observe(trouble)  # call in a way that looks like a TLS mismatch

    async def _probe(self) -> Trouble | None:
        try:
            await self.client.workflow_service.describe_namespace(
                DescribeNamespaceRequest(namespace=self.settings.temporal_namespace),
                timeout=timedelta(seconds=min(5.0, max(1.0, self.settings.temporal_check_s))),
            )
        except RPCError as exc:
            if exc.status in (
                RPCStatusCode.UNAUTHENTICATED,
                RPCStatusCode.PERMISSION_DENIED,
                RPCStatusCode.UNAVAILABLE,
                RPCStatusCode.DEADLINE_EXCEEDED,
                RPCStatusCode.UNKNOWN,
                RPCStatusCode.CANCELLED,
                RPCStatusCode.UNIMPLEMENTED,
            ):
                return diagnose(self.settings, exc.message, exc.status)
            # any other answer (a namespace deleted, say) is an answer: Temporal is there
        return None

    def observe(self, trouble: Trouble | None) -> None:
        """Log and record a change of the connection's state; nothing when it stays."""
        state = trouble.kind if trouble else STATE_OK
        reason = trouble.reason if trouble else ""
        if state == self.state and (state != STATE_REFUSED or reason == self.reason):
            return
        now, address = time.time(), self.settings.temporal_address
        if trouble is not None and state == STATE_UNREACHABLE:
            log.warning("Temporal at %s is unreachable: %s", address, trouble.why)
        elif trouble is not None:
            log.warning("Temporal refuses this worker: %s", trouble.reason)
        elif self.state == STATE_UNREACHABLE:
            log.info("Temporal at %s is back after %.0fs", address, now - self.since)
        else:
            log.info(
                "Temporal at %s accepts this worker again after %.0fs", address, now - self.since
            )
        self.state, self.reason, self.since = state, reason, now
        self._record()

    def _record(self) -> None:
        if self.state_file is not None:
            with contextlib.suppress(OSError):
                write_temporal_state(self.state_file, self.state, self.since, self.reason)
