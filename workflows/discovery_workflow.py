"""DiscoveryWorkflow (`discovery/<task queue>`): every RayCluster with `ray.io/ippr` (or
opted in with `raysize.io/enabled: "true"`) in the watched namespaces gets its reconcile
workflow. A reconcile workflow ends by itself when its RayCluster is deleted."""

from __future__ import annotations

import contextlib
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from raysize.workflows.contracts import Act
    from raysize.workflows.naming import DISCOVERY_WORKFLOW
    from raysize.workflows.values import Value
    from raysize.workflows.versioning import ON_CONTINUE_AS_NEW, upgrade_due
    from raysize.workflows.waiting import raise_if_cancelled


class DiscoveryInput(Value):
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    interval_s: float = 15.0
    max_rounds_per_run: int = 200


@workflow.defn(name=DISCOVERY_WORKFLOW)
class DiscoveryWorkflow:
    def __init__(self) -> None:
        self.clusters: list[tuple[str, str]] = []
        self.woken = False
        self.last_error = ""
        # the namespaces and interval a worker started with (`configure`): a worker whose
        # RAYSIZE_NAMESPACES or RAYSIZE_DISCOVERY_INTERVAL_S changed sends its own, and
        # the loop uses them from its next round on (issue #43 item 5)
        self.configured: DiscoveryInput | None = None
        self.in_force: DiscoveryInput | None = None

    @workflow.signal
    def wake(self) -> None:
        self.woken = True

    @workflow.signal
    def configure(self, settings: DiscoveryInput) -> None:
        """A starting worker's namespaces and interval: in force from the next round."""
        self.configured = settings
        self.woken = True

    @workflow.query
    def settings(self) -> DiscoveryInput | None:
        """The namespaces and interval in force (None before the first round)."""
        return self.in_force

    @workflow.query
    def clusters_seen(self) -> list[str]:
        return [f"{ns}/{name}" for ns, name in self.clusters]

    @workflow.run
    async def run(self, inp: DiscoveryInput) -> None:
        for _ in range(inp.max_rounds_per_run):
            self.woken = False
            if self.configured is not None:
                new = self.configured.model_copy(
                    update={"max_rounds_per_run": inp.max_rounds_per_run}
                )
                if new != inp:
                    workflow.logger.info(
                        "discovery: a worker's settings, in force from this round: "
                        "namespaces %s, every %g s",
                        ", ".join(new.namespaces) or "(all)",
                        new.interval_s,
                    )
                inp, self.configured = new, None
            self.in_force = inp
            try:
                found: list[tuple[str, str]] = await workflow.execute_activity(
                    Act.LIST_CLUSTERS,
                    list(inp.namespaces),
                    result_type=list[tuple[str, str]],
                    start_to_close_timeout=timedelta(seconds=30),
                    retry_policy=RetryPolicy(maximum_attempts=3),
                )
                self.clusters = [tuple(c) for c in found]  # type: ignore[misc]
                await workflow.execute_activity(
                    Act.ENSURE_RECONCILERS,
                    self.clusters,
                    start_to_close_timeout=timedelta(seconds=60),
                    retry_policy=RetryPolicy(maximum_attempts=3),
                )
                self.last_error = ""
            except ActivityError as exc:
                raise_if_cancelled(exc)
                self.last_error = str(exc.cause or exc)
                workflow.logger.warning("discovery round failed: %s", self.last_error)
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(lambda: self.woken, timeout=inp.interval_s)
            if upgrade_due():  # to the new current version (workflows/versioning.py)
                break
        workflow.continue_as_new(inp, initial_versioning_behavior=ON_CONTINUE_AS_NEW)
