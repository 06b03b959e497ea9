"""Worker Versioning, as the workflows see it (docs/design/temporal-notes.md, *Upgrades and
Worker Versioning*).

A versioned worker (`RAYSIZE_DEPLOYMENT_NAME` set) runs every workflow type PINNED: a run
finishes on the build it started on, so a new build never replays an old build's history.
The two loops, reconcile and discovery, move to the deployment's current version at their
next continue-as-new (`ON_CONTINUE_AS_NEW`), and continue-as-new as soon as the server says
the current version changed (`upgrade_due`). The server does not wake a workflow for that:
it says so in the next workflow task, and a reconcile may sit in its wait activity for
`tick_s` (minutes). So the worker of the current version signals `wake` to every loop
still on another version (`worker/deployment.py` `wake_moved_loops`, every
`RAYSIZE_UPGRADE_CHECK_S`): a loop moves within that long, and an idle loop costs no
history for it (a timer in each loop would add a workflow task per loop and minute).

Why the behaviour is not in `@workflow.defn(versioning_behavior=…)`: Temporal Server 1.32
refuses a workflow task that carries a versioning behaviour from an unversioned worker
("versioning behavior cannot be specified without deployment options being set with
versioned mode"), so the tests, the demo and `raysize worker` without a deployment name
would stall. The worker sets it instead (`default_versioning_behavior=WORKER_DEFAULT`, only
when versioned), and `BEHAVIOR` records each type's, checked equal to it by the tests."""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import VersioningBehavior

with workflow.unsafe.imports_passed_through():
    from raysize.workflows.naming import DISCOVERY_WORKFLOW, RECONCILE_WORKFLOW, RESIZE_WORKFLOW

# Each type's behaviour, and why (docs/design/temporal-notes.md):
# - the resize saga: a saga finishes on the code it started on (its rollback included);
# - reconcile and discovery: pinned for the length of a run (no patch needed for what a new
#   build changes), and moved to the current version at each continue-as-new.
BEHAVIOR: dict[str, VersioningBehavior] = {
    RESIZE_WORKFLOW: VersioningBehavior.PINNED,
    RECONCILE_WORKFLOW: VersioningBehavior.PINNED,
    DISCOVERY_WORKFLOW: VersioningBehavior.PINNED,
}
WORKER_DEFAULT = VersioningBehavior.PINNED

# a loop's next run starts on the deployment's current (or ramping) version, not on the
# version this run is pinned to; an unversioned worker's run ignores it
ON_CONTINUE_AS_NEW = workflow.ContinueAsNewVersioningBehavior.AUTO_UPGRADE


def upgrade_due() -> bool:
    """The deployment's current (or ramping) version is no longer the one this run is
    pinned to: continue-as-new now (with `ON_CONTINUE_AS_NEW`) to move there. Always False
    on an unversioned worker. Up to date as of the last workflow task."""
    return workflow.info().is_target_worker_deployment_version_changed()
