"""What the user set in rayStartParams is not raysize's to change, in both worlds.

Seen on the real control plane with deploy/examples/raycluster-ippr.yaml: the head (a
1 CPU/2Gi pod with `num-cpus: "0"`, not in ray.io/ippr) registered 0 CPU, and raysize
"settled" it 31 s later (`Raylet out of step … → Raylet to 1 CPU/2Gi`); tasks then ran on
the head. The embedded world hid it: its Raylets were sized from the pod."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from temporalio.service import RPCError

from raysize.activities.ray_gcs import RayGcsClient
from raysize.workflows import deadlines
from raysize.workflows.naming import reconcile_workflow_id
from raysize.workflows.reconcile_workflow import ReconcileWorkflow
from raysize.workflows.resources import CPU

from .conftest import Stack

EXAMPLE = Path(__file__).parents[2] / "deploy" / "examples" / "raycluster-ippr.yaml"
DRIFT_S = 1.0  # RAYLET_DRIFT_S (30 s) shortened, so the test runs well past it in seconds


def example(name: str) -> dict[str, Any]:
    rc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    rc["metadata"]["name"] = name
    assert rc["spec"]["headGroupSpec"]["rayStartParams"] == {"num-cpus": "0"}
    return rc


async def test_a_head_with_num_cpus_0_keeps_0_cpu_under_raysize(
    any_stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example cluster runs under raysize for several drift windows: its head's Raylet
    registers 0 CPU in both worlds (KubeRay's `ray start --num-cpus=0`) and keeps it, and
    raysize neither settles nor resizes the head."""
    monkeypatch.setattr(deadlines, "RAYLET_DRIFT_S", DRIFT_S)
    s = any_stack
    name = s.unique("params")
    s.create(example(name))
    gcs = await s.gcs_address(name)
    await s.running_workers(name)  # a worker has joined: the head's Raylet is registered
    (head,) = s.core.list_namespaced_pod(
        s.namespace, label_selector=f"ray.io/cluster={name},ray.io/node-type=head"
    ).items
    reconcile = s.temporal.get_workflow_handle_for(
        ReconcileWorkflow.run, reconcile_workflow_id(s.namespace, name)
    )

    async def ticks() -> int:
        try:
            return (await reconcile.query(ReconcileWorkflow.status)).ticks
        except RPCError:
            return 0  # discovery has not started it yet

    await eventually_async(ticks, 60)  # raysize manages the cluster
    first, since = await ticks(), time.monotonic()

    async def looked_past_the_window() -> bool:
        """raysize has looked at the cluster again and again for 3 drift windows (a
        `wake` makes it look at once, as a change would)."""
        await reconcile.signal(ReconcileWorkflow.wake)
        return await ticks() >= first + 3 and time.monotonic() - since > 3 * DRIFT_S

    await eventually_async(looked_past_the_window, 60)
    status = await reconcile.query(ReconcileWorkflow.status)
    assert [d.summary for d in status.decisions if head.metadata.name in d.summary] == []
    resizes = [
        wf
        async for wf in s.temporal.list_workflows(
            f"WorkflowId='resize/{s.namespace}/{head.metadata.name}'"
        )
    ]
    assert resizes == []
    with RayGcsClient(gcs, timeout=5) as ray:
        (node,) = [n for n in ray.cluster_state().nodes if n.pod == head.metadata.name]
    assert node.total.get_units(CPU) == 0


async def eventually_async(
    check: Callable[[], Awaitable[object]], timeout: float, every: float = 0.3
) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if await check():
            return
        await asyncio.sleep(every)
    raise AssertionError(f"not reached in {timeout}s")
