"""Worker Versioning at the worker: the deployment config, and whether this worker makes
its own version the deployment's current one (`RAYSIZE_MAKE_CURRENT`).

With versioning on and no current version, the server sends new workflows to unversioned
workers only: a first install would start nothing. So a versioned worker makes its version
current when the deployment has none yet (`if-none`, the default), or when the current
version's workers are gone (a rolling update: `worker/takeover.py`, run from
`keep_loops_on_current`). A version run beside a live one is never promoted by the worker
unless `always` is set: the operator (or the Temporal Worker
Controller) does it with `temporal worker deployment set-current-version`, once the new
version runs (README *Upgrading raysize*)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from temporalio.api.workflowservice.v1 import (
    DescribeWorkerDeploymentRequest,
    DescribeWorkerDeploymentResponse,
    SetWorkerDeploymentCurrentVersionRequest,
)
from temporalio.client import Client
from temporalio.common import WorkerDeploymentVersion
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import WorkerDeploymentConfig

from raysize.worker.settings import Settings
from raysize.workflows.naming import DISCOVERY_WORKFLOW, RECONCILE_WORKFLOW
from raysize.workflows.versioning import WORKER_DEFAULT

if TYPE_CHECKING:
    from raysize.worker.takeover import Takeover

log = logging.getLogger("raysize.worker")

# how long a new worker waits for the server to list its version (it appears with the
# worker's first poll, within a second on the dev server)
REGISTERED_WITHIN_S = 30.0


# answers worth asking again: the server rate-limits each deployment's changes (a second
# worker starting just after the first one set its version current got RESOURCE_EXHAUSTED)
BUSY = (RPCStatusCode.RESOURCE_EXHAUSTED, RPCStatusCode.UNAVAILABLE)


def deployment_config(settings: Settings) -> WorkerDeploymentConfig | None:
    """Versioned (every workflow type PINNED: `workflows/versioning.py`) when a deployment
    name is set, else None: unversioned, as before."""
    version = settings.deployment_version()
    if version is None:
        return None
    return WorkerDeploymentConfig(
        version=version, use_worker_versioning=True, default_versioning_behavior=WORKER_DEFAULT
    )


def describe_versioning(settings: Settings) -> str:
    """One line for the start-up log: what this worker runs as, and from which settings."""
    version = settings.deployment_version()
    if version is None:
        return (
            "unversioned worker (RAYSIZE_DEPLOYMENT_NAME unset): every worker on the task "
            "queue runs every workflow; set it to upgrade with Worker Versioning"
        )
    source = (
        "RAYSIZE_BUILD_ID / TEMPORAL_WORKER_BUILD_ID"
        if settings.build_id
        else "the package version"
    )
    return (
        f"worker deployment version {version.to_canonical_string()} (build ID from {source}; "
        f"RAYSIZE_MAKE_CURRENT={settings.make_current})"
    )


@dataclass(frozen=True)
class Routing:
    current: str  # build ID of the current version; "" when there is none (unversioned)
    ramping: str
    manager: str  # the deployment's manager identity; "" when anyone may change it
    listed: bool  # this worker's version is one of the deployment's versions
    conflict_token: bytes


def _routing(resp: DescribeWorkerDeploymentResponse, build_id: str) -> Routing:
    info = resp.worker_deployment_info
    rc = info.routing_config
    return Routing(
        current=rc.current_deployment_version.build_id,
        ramping=rc.ramping_deployment_version.build_id,
        manager=info.manager_identity,
        listed=any(v.deployment_version.build_id == build_id for v in info.version_summaries),
        conflict_token=resp.conflict_token,
    )


async def describe_routing(client: Client, version: WorkerDeploymentVersion) -> Routing | None:
    try:
        resp = await client.workflow_service.describe_worker_deployment(
            DescribeWorkerDeploymentRequest(
                namespace=client.namespace, deployment_name=version.deployment_name
            )
        )
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:  # no worker of it has polled yet
            return None
        if exc.status in BUSY:  # "too many requests issued to Worker Deployment …"
            return None
        raise
    return _routing(resp, version.build_id)


async def _registered(client: Client, version: WorkerDeploymentVersion) -> Routing:
    deadline = time.monotonic() + REGISTERED_WITHIN_S
    while True:
        routing = await describe_routing(client, version)
        if routing is not None and routing.listed:
            return routing
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"the server does not list version {version.to_canonical_string()} "
                f"{REGISTERED_WITHIN_S:g}s after this worker started polling"
            )
        await asyncio.sleep(0.5)


async def make_current(client: Client, version: WorkerDeploymentVersion, routing: Routing) -> bool:
    """Make `version` the deployment's current one, against the routing it was decided
    from (`routing.conflict_token`); False when the server refused for a reason worth
    looking again at (the routing changed meanwhile, or it is busy)."""
    try:
        await client.workflow_service.set_worker_deployment_current_version(
            SetWorkerDeploymentCurrentVersionRequest(
                namespace=client.namespace,
                deployment_name=version.deployment_name,
                build_id=version.build_id,
                conflict_token=routing.conflict_token,
                identity=client.identity,
            )
        )
    except RPCError as exc:
        if exc.status in (RPCStatusCode.FAILED_PRECONDITION, RPCStatusCode.ABORTED, *BUSY):
            return False
        raise
    return True


def set_current_command(version: WorkerDeploymentVersion) -> str:
    return (
        "temporal worker deployment set-current-version --deployment-name "
        f"{version.deployment_name} --build-id {version.build_id}"
    )


async def settle_current_version(client: Client, settings: Settings) -> str:
    """Make this worker's version current if `RAYSIZE_MAKE_CURRENT` says so, and log what
    was done and why; returns that line. Call once the worker polls (the server lists a
    version from its first poll)."""
    version = settings.deployment_version()
    if version is None:
        return ""
    name = version.to_canonical_string()
    for _ in range(3):  # another replica of this version may set it at the same moment
        routing = await _registered(client, version)
        if routing.current == version.build_id:
            return _say(logging.INFO, f"{name} is the current version of its deployment")
        if routing.manager and routing.manager != client.identity:
            return _say(
                logging.INFO,
                f"{name} is not current (current: {routing.current or 'none'}); the "
                f"deployment is managed by {routing.manager!r} (the Temporal Worker "
                "Controller?), which promotes versions: left to it",
            )
        first = not routing.current
        if settings.make_current == "never" or (not first and settings.make_current == "if-none"):
            why = (
                "the deployment has no current version: new workflows wait for one"
                if first
                else f"new workflows go to the current version {routing.current}; this "
                "worker serves the workflows pinned to it"
                + (
                    ", and takes that version over once no worker of it has polled for "
                    f"{settings.takeover_after_s:g}s (a rolling update)"
                    if settings.make_current == "if-none"
                    else ""
                )
            )
            return _say(
                logging.WARNING if first else logging.INFO,
                f"{name} is not current ({why}; RAYSIZE_MAKE_CURRENT="
                f"{settings.make_current}). To promote it: {set_current_command(version)}",
            )
        if not await make_current(client, version, routing):
            await asyncio.sleep(1.0)
            continue  # the routing changed under us, or the server is busy: look again
        if first:
            return _say(
                logging.INFO,
                f"made {name} current: the deployment had no current version (a first "
                "install; RAYSIZE_MAKE_CURRENT=if-none); a later version takes over when "
                "this one's workers are gone (a rolling update), or is promoted by "
                "hand (docs/upgrading.md)",
            )
        return _say(
            logging.WARNING,
            f"made {name} current in place of {routing.current} (RAYSIZE_MAKE_CURRENT="
            "always): new workflows and the loops' next runs go to it; runs pinned to "
            f"{routing.current} stay there",
        )
    return _say(
        logging.WARNING,
        f"{name}: the deployment's routing kept changing; not promoted. To promote it: "
        f"{set_current_command(version)}",
    )


def _say(level: int, line: str) -> str:
    log.log(level, "%s", line)
    return line


def loops_elsewhere_query(
    settings: Settings, version: WorkerDeploymentVersion, ramping: str = ""
) -> str:
    """The running reconcile and discovery loops of this task queue that are neither on
    `version` nor on the ramping build (loops a ramp moved there stay), as the server
    writes a version: `<deployment>:<build>`."""
    builds = [version.build_id, *([ramping] if ramping else [])]
    here = ", ".join(f"'{version.deployment_name}:{b}'" for b in builds)
    return (
        f"TaskQueue = '{settings.task_queue}' AND ExecutionStatus = 'Running' AND "
        f"WorkflowType IN ('{RECONCILE_WORKFLOW}', '{DISCOVERY_WORKFLOW}') AND "
        f"(TemporalWorkerDeploymentVersion NOT IN ({here}) OR "
        "TemporalWorkerDeploymentVersion IS NULL)"
    )


async def wake_moved_loops(client: Client, settings: Settings) -> int:
    """When this worker's version is the deployment's current one, signal `wake` to every
    loop still on another version: its wait ends, its tick ends with `upgrade_due()`, and
    it continues-as-new onto this version (`workflows/versioning.py`). The server does not
    wake a waiting workflow when the current version changes, and a reconcile waits up to
    `tick_s`. Returns how many loops were woken (0 when this version is not current)."""
    version = settings.deployment_version()
    if version is None:
        return 0
    routing = await describe_routing(client, version)
    if routing is None or routing.current != version.build_id:
        return 0
    woken = 0
    query = loops_elsewhere_query(settings, version, routing.ramping)
    async for wf in client.list_workflows(query):
        try:
            await client.get_workflow_handle(wf.id, run_id=wf.run_id).signal("wake")
            woken += 1
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:  # NOT_FOUND: it moved meanwhile
                raise
    if woken:
        log.info(
            "%s is current: woke %d loop(s) on other versions so they continue on it",
            version.to_canonical_string(),
            woken,
        )
    return woken


async def keep_loops_on_current(
    client: Client, settings: Settings, takeover: Takeover | None = None
) -> None:
    """Every `RAYSIZE_UPGRADE_CHECK_S`, for the worker's life: `takeover.step` (a build
    whose workers are gone, after a rolling update: `worker/takeover.py`), then
    `wake_moved_loops`; a failed look is logged and tried again."""
    version = settings.deployment_version()
    while True:
        try:
            if takeover is not None and version is not None:
                routing = await describe_routing(client, version)
                if routing is not None and routing.listed:
                    await takeover.step(client, routing.current, routing.manager)
            await wake_moved_loops(client, settings)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("could not look for loops on other versions: %s", exc)
        await asyncio.sleep(settings.upgrade_check_s)
