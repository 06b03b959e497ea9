"""Tenant churn: what the worker keeps per Ray cluster is freed when clusters are deleted.

    python -m bench.tenant_churn_bench [--clusters 1000] [--rounds 2]

The embedded API server alone (`sandbox/server.py`, in this process: no kubelet, no
KubeRay stand-in) and a GCS stand-in per cluster (`sandbox/ray_standin.py`,
`StandInFleet`). Each round creates `--clusters` RayClusters, each with its own token
Secret (`authOptions.secretName`) and a worker pod, and runs the loop's observe activity
(`ClusterActivities.observe_cluster`: the RayCluster and its pods from the pod watch, the
Secret's token, the GCS's state, the plan) once for each, as a reconcile's first tick
does; then it deletes them all (RayClusters, Secrets, pods), and the observe of each finds
its RayCluster gone (`Observation(found=False)`), as the loop's next tick would.

It prints, before anything, after creating and after deleting (each round): the process's
RSS, the Python heap (tracemalloc, after a full collection: the whole process, so the
embedded API server's store and watch history, which keep every object and its events up
to WATCH_HISTORY, count in it), and the size of every per-cluster map the worker keeps
(`ClusterActivities.cluster_state`: GCS clients and their bindings, GCS addresses, token
sources, cached Secrets, the pod watch's RayCluster marks, change counts, pods by
cluster, subscriptions; and the GCS targets' threads, `Targets.load`). After deletion
every map must be back where it started (they grew with every cluster ever seen before
#43 item 6b); the heap's growth between rounds is printed by file.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gc
import logging
import os
import re
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

from kubernetes import config
from temporalio.testing import ActivityEnvironment

from bench.clusters import small_raycluster
from bench.idle_bench import rss_mib
from bench.observe_bench import kuberay_pod
from raysize.activities.cluster import ClusterActivities
from raysize.activities.k8s import Kube
from raysize.activities.targets import Targets
from raysize.sandbox.cluster import Sandbox, SandboxConfig
from raysize.sandbox.kubeconfig import write_kubeconfig
from raysize.sandbox.ray_standin import StandInFleet
from raysize.workflows.contracts import ObserveInput

NS = "tenants"
# events the embedded server keeps: a round makes 6,000 at 1,000 clusters; three rounds
# fit, so its watches never relist (a 410) while the bench runs
WATCH_HISTORY = 20_000
# a round of clusters created and deleted may leave this much more heap in the worker
# (caches bounded by count, not by cluster, fill in the first rounds)
FLAT_MIB = 1.0
TRACE_DEPTH = 16  # frames kept per allocation (`world_made`)
BATCH = 50  # observes at once (a worker runs many loops' observes side by side)
Obj = dict[str, Any]


def tenant(name: str) -> tuple[Obj, Obj]:
    """A RayCluster with a token of its own (Secret `<name>-token`), and that Secret."""
    rc = small_raycluster(name, workers=1)
    rc["metadata"]["namespace"] = NS
    rc["spec"]["rayVersion"] = "2.60.0"
    rc["spec"]["authOptions"] = {"mode": "token", "secretName": f"{name}-token"}
    token = base64.b64encode(os.urandom(16).hex().encode()).decode()
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"{name}-token", "namespace": NS},
        "data": {"auth_token": token},
    }
    return rc, secret


def sizes(acts: ClusterActivities) -> dict[str, int]:
    out = acts.cluster_state()
    out["gcs targets"] = sum(1 for n in acts.targets.load() if n.startswith("gcs "))
    return out


def world_made(trace: tracemalloc.Trace) -> bool:
    """Was this allocation made by the test world (the embedded API server, its store and
    watch history, the GCS stand-ins) or by this bench, not by the worker's code? Its
    traceback has a frame in `sandbox/` or `bench/`."""
    known = _world_of.get(trace.traceback)
    if known is None:
        known = _world_of[trace.traceback] = any(_WORLD.search(f.filename) for f in trace.traceback)
    return known


# each traceback's answer (many allocations share one): the snapshots are walked whole
_world_of: dict[tracemalloc.Traceback, bool] = {}


_WORLD = re.compile(r"[/\\](sandbox|bench)[/\\]")


def worker_heap_mib(heap: tracemalloc.Snapshot) -> float:
    """The heap the worker's own code holds: every live allocation not the world's."""
    return sum(t.size for t in heap.traces if not world_made(t)) / 2**20


def worker_sites(heap: tracemalloc.Snapshot) -> Counter[str]:
    """The worker's part of the heap by the code that holds it: the innermost frame of
    raysize's own (else the allocation's own frame), as `file:line`."""
    sites: Counter[str] = Counter()
    for t in heap.traces:
        if world_made(t):
            continue
        frames = list(t.traceback)  # innermost first
        ours = next((f for f in frames if "raysize" in f.filename), frames[0])
        sites[f"{Path(ours.filename).name}:{ours.lineno}"] += t.size
    return sites


def line(stage: str, acts: ClusterActivities) -> tuple[dict[str, int], tracemalloc.Snapshot]:
    now = sizes(acts)
    maps = ", ".join(f"{k} {v}" for k, v in now.items())
    gc.collect()
    heap = tracemalloc.take_snapshot()
    total = tracemalloc.get_traced_memory()[0] / 2**20
    print(
        f"{stage:<18} RSS {rss_mib(os.getpid()):6.1f} MiB, Python heap {total:6.1f} MiB "
        f"(the worker's part {worker_heap_mib(heap):6.1f} MiB)\n"
        f"{'':<18} {maps}"
    )
    return now, heap


async def observe_all(acts: ClusterActivities, names: list[str], addresses: list[str]) -> int:
    """Each cluster's observe activity once; how many found their RayCluster."""
    found = 0
    for i in range(0, len(names), BATCH):
        ticks = await asyncio.gather(
            *(
                ActivityEnvironment().run(
                    acts.observe_cluster, ObserveInput(namespace=NS, cluster=n, gcs_address=a)
                )
                for n, a in zip(names[i : i + BATCH], addresses[i : i + BATCH], strict=True)
            )
        )
        found += sum(1 for t in ticks if t.found)
    return found


def until(predicate: Any, what: str, timeout_s: float = 120.0) -> bool:
    """Wait for `predicate`; False (and a line) when it did not come within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            print(f"{'':<18} not within {timeout_s:g} s: {what}")
            return False
        time.sleep(0.05)
    return True


def run(clusters: int, rounds: int, workdir: Path) -> int:
    # deep enough that an allocation made for the API server (its handler threads) or a
    # GCS stand-in shows a frame of theirs, so the worker's part is told apart
    tracemalloc.start(TRACE_DEPTH)
    # the API server alone (its store and watch history count in the process's heap,
    # not in the worker's part of it)
    sb = Sandbox(SandboxConfig(watch_history=WATCH_HISTORY))
    sb.server.start()
    fleet = StandInFleet(clusters)
    api = None
    acts: ClusterActivities | None = None
    try:
        fleet.__enter__()
        addresses = [ray.address for ray in fleet.stand_ins]
        sb.store.create("namespaces", "", {"metadata": {"name": NS}})
        api = config.new_client_from_config(
            config_file=str(write_kubeconfig(workdir / "kubeconfig", sb.url))
        )
        # GCS threads retire after 1 s idle (10 s in the worker): the bench need not wait
        acts = ClusterActivities(kube=Kube(api, timeout_s=30.0), targets=Targets(idle_s=1.0))
        print(
            f"{clusters} clusters a round, {rounds} round(s): each its own token Secret, a "
            "worker pod and a GCS stand-in"
        )
        start, _ = line("before", acts)
        ok = True
        last: tracemalloc.Snapshot | None = None
        growth: list[float] = []  # the worker's heap, round over round (MiB)
        for r in range(1, rounds + 1):
            names = [f"t{r}-{i:04d}" for i in range(clusters)]
            for name in names:
                rc, secret = tenant(name)
                sb.store.create("secrets", NS, secret)
                sb.store.create("rayclusters", NS, rc)
                sb.store.create("pods", NS, kuberay_pod(name, "small", 0))
            began = time.monotonic()
            found = asyncio.run(observe_all(acts, names, addresses))
            took = time.monotonic() - began
            if found != clusters:
                raise SystemExit(f"round {r}: {found} of {clusters} observes found their cluster")
            line(f"round {r}: created", acts)
            print(f"{'':<18} ({clusters} observes in {took:.1f} s)")
            for name in names:
                sb.store.remove("pods", NS, kuberay_pod(name, "small", 0)["metadata"]["name"])
                sb.store.remove("rayclusters", NS, name)
                sb.store.remove("secrets", NS, f"{name}-token")
            # the pod watch delivers the deletions; each loop's next observe finds it gone
            assert acts.pods is not None
            if not until(
                lambda: acts.pods.cluster_state()["pod_watch.by_cluster"] == 0,
                "the pod watch delivered every pod's deletion",
            ):
                print(
                    f"{'':<18} pod watch synced: {acts.pods.synced(NS)}; pods in the server: "
                    f"{len(sb.store.list('pods', NS)[0])}"
                )
            if asyncio.run(observe_all(acts, names, addresses)):
                raise SystemExit(f"round {r}: an observe found a deleted cluster")
            until(lambda: sizes(acts)["gcs targets"] == 0, "GCS threads retired", 30)
            after, snap = line(f"round {r}: deleted", acts)
            left = {k: v for k, v in after.items() if v != start[k]}
            if left:
                ok = False
                print(f"{'':<18} NOT freed: {left}")
            if last is not None:
                grew = snap.compare_to(last, "filename")[:3]
                worker = worker_heap_mib(snap) - worker_heap_mib(last)
                print(
                    f"{'':<18} the heap since round {r - 1} deleted: the worker's part "
                    f"{worker * 1024:+.0f} KiB; all of it, by file: "
                    + "; ".join(
                        f"{Path(d.traceback[0].filename).name} {d.size_diff / 1024:+.0f} KiB"
                        for d in grew
                    )
                )
                growth.append(worker)
                grown = worker_sites(snap)
                grown.subtract(worker_sites(last))
                print(
                    f"{'':<18} the worker's part, by the code that holds it: "
                    + "; ".join(f"{site} {n / 1024:+.0f} KiB" for site, n in grown.most_common(5))
                )
            last = snap
        print("every per-cluster map back to its start after deletion:", "yes" if ok else "NO")
        if growth:
            flat = max(growth) <= FLAT_MIB
            print(
                f"the worker's heap after each round's deletion, round over round: "
                f"{', '.join(f'{g * 1024:+.0f} KiB' for g in growth)} (target ≤ "
                f"{FLAT_MIB * 1024:.0f} KiB a round of {clusters} clusters): "
                + ("flat" if flat else "GROWS")
            )
            ok &= flat
        return 0 if ok else 1
    finally:
        if acts is not None:
            acts.close()
            acts.targets.close()
        if api is not None:
            api.close()
        fleet.__exit__()
        sb.server.stop()
        tracemalloc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clusters", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    # the queues' "all threads busy" lines: a batch of observes is meant to queue
    logging.getLogger("raysize").setLevel(logging.ERROR)
    if os.environ.get("CHURN_DEBUG"):
        logging.basicConfig(level=logging.INFO)
        logging.getLogger("raysize").setLevel(logging.INFO)
    with tempfile.TemporaryDirectory(prefix="raysize-churn-") as tmp:
        raise SystemExit(run(args.clusters, args.rounds, Path(tmp)))


if __name__ == "__main__":
    main()
