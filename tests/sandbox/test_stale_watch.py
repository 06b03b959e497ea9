"""A stale read must never shrink a busy pod (issue #43 item 2), in both worlds.

The pod watch's stream is stalled by the sandbox's fault proxy (`watch_stall_after_s`: it
stops forwarding and keeps the connection open, as an idle load balancer or NAT that
dropped the connection without closing it), and the pod is grown behind it. Before the
fix the watch stayed "synced" for up to ~330 s and every read answered from the frozen
cache (the pod at 1 CPU while it ran at 2); a settle resize decided on that read
(`from = to = 1 CPU`) patched the live 2-CPU pod down to 1 CPU under its work.

Now the watch is not synced once it has heard nothing for its bound, the read lists the
pod as it is and the cache takes that list, and the saga's patch is a compare-and-set:
a pod not at `from` is not patched, and the saga ends `Superseded` without a rollback.

The embedded server gets a fault proxy of its own in front of it (http upstream); the
real world's sandbox has one in front of the real kube-apiserver."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes import client, config
from temporalio import activity
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from raysize.activities.k8s import Kube
from raysize.activities.k8s_activities import K8sActivities
from raysize.activities.k8s_objects import ContainerSize, Obj
from raysize.activities.pod_watch import CLUSTER_LABEL, PodWatch
from raysize.sandbox.cluster import Sandbox
from raysize.sandbox.faultproxy import FaultProxy
from raysize.sandbox.faults import FaultRule, Faults
from raysize.sandbox.kubeconfig import write_kubeconfig
from raysize.sandbox.realworld import RealSandbox
from raysize.worker.run import workflow_runner
from raysize.workflows.contracts import (
    Act,
    ApplyResizeInput,
    FinishResizeInput,
    FinishResizeResult,
    RayletResizeInput,
    RayletResizeResult,
    ResizeRequest,
)
from raysize.workflows.ippr_status import IPPR_STATUS_ANNOTATION, IpprStatus
from raysize.workflows.naming import resize_workflow_id
from raysize.workflows.resize_workflow import PodResizeWorkflow
from raysize.workflows.resources import GIB
from tests.orchestration.temporal_env import start_time_skipping
from tests.sandbox.conftest import wait_for
from tests.sandbox.test_conformance import running_pod

CLUSTER = "stale"
# Guaranteed: the size is the limit, and the request moves with it
ONE_CPU = {
    "requests": {"cpu": "1", "memory": "1Gi"},
    "limits": {"cpu": "1", "memory": "1Gi"},
    "labels": {CLUSTER_LABEL: CLUSTER},
}
STALE_S = 1.5  # the watch's bound on silence here (a small one: no long sleeps)


@contextlib.contextmanager
def through_proxy(
    world_sandbox: Sandbox | RealSandbox, tmp_path: Path
) -> Iterator[tuple[client.ApiClient, Faults, FaultProxy]]:
    """A client of the world's API server through the fault proxy, and the proxy's faults
    (their rules added by the test are taken away after it)."""
    own: FaultProxy | None = None
    if isinstance(world_sandbox, RealSandbox):
        assert world_sandbox.fault_proxy is not None
        proxy, faults = world_sandbox.fault_proxy, world_sandbox.faults
        path = world_sandbox.write_kubeconfig(tmp_path / "proxied", faults=True)
    else:
        faults = Faults()
        proxy = own = FaultProxy(world_sandbox.url, None, faults, tmp_path).start()
        path = write_kubeconfig(tmp_path / "proxied", proxy.url, ca_pem=proxy.ca_pem)
    rules = faults.rules()
    api = config.new_client_from_config(config_file=str(path))
    try:
        yield api, faults, proxy
    finally:
        for rule in faults.rules():
            if not any(rule is r for r in rules):
                faults.remove(rule)
        api.close()
        if own is not None:
            own.close()


def silent_watch(api: client.ApiClient) -> tuple[Kube, PodWatch]:
    """A `Kube` whose cached reads come from a pod watch with a small bound on silence."""
    kube = Kube(api, timeout_s=5.0)
    watch = PodWatch(kube.core)
    watch.stale_after_s = STALE_S
    kube.pod_watch = watch
    return kube, watch


def running_size(pod: Obj) -> tuple[int, int]:
    """The Ray container's (cpu, memory) as the kubelet reports it running (else the
    spec's), as Ray reads a size: the limit where there is one."""
    spec = ((pod.get("spec") or {}).get("containers") or [{}])[0]
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    running = next((c for c in statuses if c.get("resources") is not None), spec)
    size = ContainerSize.of(running.get("resources"))
    return size.cpu, size.memory


def sizes(records: list[Obj]) -> list[tuple[int, int]]:
    return [running_size(r) for r in records]


def spec_and_actual(core: client.CoreV1Api, ns: str, name: str) -> list[tuple[int, int]]:
    """The Ray container's size in the spec, and as the kubelet reports it running."""
    pod = core.api_client.sanitize_for_serialization(core.read_namespaced_pod(name, ns))
    spec_only = {**pod, "status": {}}
    return [running_size(spec_only), running_size(pod)]


def grown_behind(direct: Kube, core: client.CoreV1Api, ns: str, name: str) -> None:
    """Grow the pod to 2 CPU with a client the stalled watch knows nothing of, and wait
    until the kubelet runs it so."""
    direct.patch_resize(ns, name, 2000, GIB)
    wait_for(lambda: spec_and_actual(core, ns, name) == [(2000, GIB)] * 2, 60, 0.1)


class Sizes:
    """Samples the pod's spec and running size until stopped: the smallest CPU seen."""

    def __init__(self, core: client.CoreV1Api, ns: str, name: str) -> None:
        self.core, self.ns, self.name = core, ns, name
        self.least = 1 << 40
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        seen = spec_and_actual(self.core, self.ns, self.name)
        self.least = min(self.least, *(cpu for cpu, _ in seen))

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self._sample()

    def __enter__(self) -> Sizes:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(10)
        self._sample()


def test_a_silent_watch_is_not_synced_and_a_read_lists_the_pod_behind_it(
    kube: client.ApiClient, ns: str, world_sandbox: Sandbox | RealSandbox, tmp_path: Path
) -> None:
    """(a) The watch connects, then hears nothing (the proxy stops forwarding). Past its
    bound it is not synced; a read lists the pod as it runs (grown behind the watch), and
    the cache takes that list. The stream's read times out and the watch reconnects; once
    the proxy forwards again it is heard from, synced, and its cache answers again."""
    core = client.CoreV1Api(kube)
    running_pod(core, ns, "w", **ONE_CPU)
    direct = Kube(kube, timeout_s=5.0)
    with through_proxy(world_sandbox, tmp_path) as (api, faults, proxy):
        stalled = proxy.stalled
        rule = faults.add(FaultRule(verb="watch", resource="pods", watch_stall_after_s=0.0))
        k8s, watch = silent_watch(api)
        try:
            first, _ = k8s.cluster_pods(ns, CLUSTER, cached=True)  # starts the watch: a LIST
            assert sizes(first) == [(1000, GIB)]
            wait_for(lambda: proxy.stalled > stalled)  # connected, and silent from here
            grown_behind(direct, core, ns, "w")

            wait_for(lambda: not watch.synced(ns), STALE_S + 10)
            listed = watch.uncached_reads
            pods, mark = k8s.cluster_pods(ns, CLUSTER, cached=True)
            assert watch.uncached_reads == listed + 1  # a LIST, not the frozen cache
            assert sizes(pods) == [(2000, GIB)]
            # the LIST's pods are the cache's now (the wait compares the same mark)
            assert watch.cluster_pods_mark(ns, CLUSTER) == mark
            assert watch.refreshed >= 1

            # the stream's read timed out: the watch reconnected, silent again, not synced
            wait_for(lambda: proxy.stalled >= stalled + 2, STALE_S * 3 + 15)
            assert not watch.synced(ns)

            faults.remove(rule)  # the proxy forwards again
            core.patch_namespaced_pod("w", ns, {"metadata": {"labels": {"i": "1"}}})
            wait_for(lambda: watch.synced(ns), 40)
            cached = watch.cached_reads
            pods, _ = k8s.cluster_pods(ns, CLUSTER, cached=True)
            assert watch.cached_reads == cached + 1
            assert sizes(pods) == [(2000, GIB)]
            assert pods[0]["metadata"]["labels"]["i"] == "1"
        finally:
            watch.close()


def test_an_apply_whose_from_is_not_the_live_pod_writes_nothing(
    kube: client.ApiClient, ns: str
) -> None:
    """(b) The apply is a compare-and-set: a pod that does not run at `from` is not
    patched and not annotated, and the result says `superseded` with the pod's size. A
    pod already at the target (a retry of an apply that landed) goes on; a pod at `from`
    is resized as before."""
    core = client.CoreV1Api(kube)
    uid = running_pod(core, ns, "w", **ONE_CPU).metadata.uid
    direct = Kube(kube, timeout_s=5.0)
    grown_behind(direct, core, ns, "w")
    before = core.read_namespaced_pod("w", ns)
    acts = K8sActivities(direct)

    def apply(cpu: int, expect: tuple[tuple[int, int], ...]) -> Any:
        inp = ApplyResizeInput(
            namespace=ns,
            pod="w",
            cpu=cpu,
            memory=GIB,
            status=IpprStatus(raylet_id="ab" * 28, resizing_at=1_700_000_000),
            poll_interval_s=0.2,
            window_s=20,
            pod_uid=uid,
            expect=expect,
        )
        return asyncio.run(ActivityEnvironment().run(acts.apply_resize, inp))

    # the settle a stale read decided: from = to = 1 CPU, the pod runs at 2
    stale = apply(1000, ((1000, GIB),))
    assert stale.progress.state == "superseded", stale
    assert (stale.progress.cpu, stale.progress.memory) == (2000, GIB)
    assert "runs at 2 CPU/1Gi, not at 1 CPU/1Gi" in stale.progress.message
    now = core.read_namespaced_pod("w", ns)
    assert now.metadata.generation == before.metadata.generation  # no patch
    assert IPPR_STATUS_ANNOTATION not in (now.metadata.annotations or {})  # no status
    assert spec_and_actual(core, ns, "w") == [(2000, GIB)] * 2

    # a retry of an apply that landed: the pod at the target is no mismatch
    again = apply(2000, ((1000, GIB),))
    assert again.progress.state == "done", again
    # at `from`: resized as before
    shrunk = apply(1500, ((2000, GIB),))
    assert shrunk.progress.state == "done", shrunk
    assert spec_and_actual(core, ns, "w") == [(1500, GIB)] * 2


class StandInRaylet:
    """The saga's Ray activities, recorded: the Raylet takes any size it is given."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []

    def activities(self) -> list[Any]:
        @activity.defn(name=Act.RESIZE_RAYLET)
        async def raylet(inp: RayletResizeInput) -> RayletResizeResult:
            self.calls.append(("raylet", inp.cpu, inp.memory))
            return RayletResizeResult(cpu=inp.cpu, memory=inp.memory)

        @activity.defn(name=Act.FINISH_RESIZE)
        async def finish(inp: FinishResizeInput) -> FinishResizeResult:
            self.calls.append(("finish", inp.cpu, inp.memory))
            return FinishResizeResult(cpu=inp.cpu, memory=inp.memory)

        return [raylet, finish]


async def test_a_settle_decided_on_a_stale_read_never_shrinks_the_grown_pod(
    kube: client.ApiClient, ns: str, world_sandbox: Sandbox | RealSandbox, tmp_path: Path
) -> None:
    """(b, c) The issue's sequence: the watch goes silent, the pod grows to 2 CPU behind
    it, and the settle its frozen cache made (`from = to = 1 CPU`: "Raylet out of step")
    runs as a real `PodResizeWorkflow` on Temporal's test server with the worker's
    Kubernetes activities (through the proxy, with the silent watch). The saga does not
    patch, ends `Superseded` without a rollback, and the pod runs at 2 CPU throughout;
    and the read an observe makes now lists the pod at 2 CPU, so the next decision is
    made on the pod as it is."""
    core = client.CoreV1Api(kube)
    uid = running_pod(core, ns, "w", **ONE_CPU).metadata.uid
    direct = Kube(kube, timeout_s=5.0)
    ray = StandInRaylet()
    env = await start_time_skipping()
    with through_proxy(world_sandbox, tmp_path) as (api, faults, proxy):
        stalled = proxy.stalled
        faults.add(FaultRule(verb="watch", resource="pods", watch_stall_after_s=0.0))
        k8s, watch = silent_watch(api)
        try:
            first, _ = await asyncio.to_thread(k8s.cluster_pods, ns, CLUSTER, True)
            assert sizes(first) == [(1000, GIB)]
            await asyncio.to_thread(wait_for, lambda: proxy.stalled > stalled)
            await asyncio.to_thread(grown_behind, direct, core, ns, "w")
            req = ResizeRequest(
                namespace=ns,
                cluster=CLUSTER,
                pod="w",
                group="small",
                node_id="ab" * 28,
                from_cpu=1000,
                from_memory=GIB,
                cpu=1000,
                memory=GIB,
                timeout_s=30,
                reason="Raylet out of step: the pod has 1 CPU/1Gi, its Raylet reports 2 CPU/1Gi",
                pod_uid=uid,
                poll_interval_s=0.2,
                poll_window_s=5.0,
            )
            queue = f"q-{uuid.uuid4()}"
            with Sizes(core, ns, "w") as seen:
                async with Worker(
                    env.client,
                    task_queue=queue,
                    workflows=[PodResizeWorkflow],
                    activities=[*K8sActivities(k8s, watch).activities(), *ray.activities()],
                    workflow_runner=workflow_runner(),
                ):
                    handle = await env.client.start_workflow(
                        PodResizeWorkflow.run,
                        req,
                        id=f"{resize_workflow_id(ns, 'w')}-{uuid.uuid4().hex[:6]}",
                        task_queue=queue,
                    )
                    state = await asyncio.wait_for(handle.result(), 120)
            assert str(state.outcome) == "Superseded", state
            assert [a.result for a in state.attempts] == ["superseded"]
            assert "runs at 2 CPU/1Gi" in state.detail, state.detail
            assert ray.calls == []  # no Raylet step, no rollback, no finish
            assert seen.least == 2000  # never shrunk while the saga ran
            assert spec_and_actual(core, ns, "w") == [(2000, GIB)] * 2
            now = core.read_namespaced_pod("w", ns)
            assert IPPR_STATUS_ANNOTATION not in (now.metadata.annotations or {})

            # the next observe's read: the watch has been silent past its bound, so it
            # lists, and sees the pod as it runs
            await asyncio.to_thread(wait_for, lambda: not watch.synced(ns), STALE_S + 10)
            pods, _ = await asyncio.to_thread(k8s.cluster_pods, ns, CLUSTER, True)
            assert sizes(pods) == [(2000, GIB)]
        finally:
            watch.close()
            await env.shutdown()
