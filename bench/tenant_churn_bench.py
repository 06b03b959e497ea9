"""Tenant churn: what the worker keeps per Ray cluster is freed when clusters are deleted.

    python -m bench.tenant_churn_bench [--clusters 1000] [--rounds 4]

The test world runs in a process of its own (`--serve-world`, started by this one and
stopped by its process group): the embedded API server alone (`sandbox/server.py`: no
kubelet, no KubeRay stand-in) and a GCS stand-in per cluster (`sandbox/ray_standin.py`,
`StandInFleet`). So this process holds the worker's part only, and its Python heap
(tracemalloc) is the worker's. Each round creates `--clusters` RayClusters through the API
server, each with its own token Secret (`authOptions.secretName`) and a worker pod, and
runs the loop's observe activity (`ClusterActivities.observe_cluster`: the RayCluster and
its pods from the pod watch, the Secret's token, the GCS's state, the plan) once for each,
as a reconcile's first tick does; then it deletes them all (RayClusters, Secrets, pods),
and the observe of each finds its RayCluster gone (`Observation(found=False)`), as the
loop's next tick would.

It prints, before anything, after creating and after deleting (each round): the process's
RSS, the Python heap (after a full collection), and the size of every per-cluster map the
worker keeps (`ClusterActivities.cluster_state`: GCS clients and their bindings, GCS
addresses, token sources, cached Secrets, the pod watch's RayCluster marks, change counts,
pods by cluster, subscriptions; and the GCS targets' threads, `Targets.load`). After
deletion every map must be back where it started (they grew with every cluster ever seen
before #43 item 6b), and from the second round on the heap after a round's deletion may
grow by at most `FLAT_MIB` a round: caches bounded by count, not by cluster (the records'
shared parts, the pod views, the deletions a read compares with) fill in the first
rounds. The growth is printed by the raysize line that holds it.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import concurrent.futures
import contextlib
import functools
import gc
import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kubernetes import client, config
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
# fit, so its watches rarely relist (a 410) while the bench runs
WATCH_HISTORY = 20_000
# from the second round on, a round of clusters created and deleted may leave this much
# more heap in the worker (caches bounded by count, not by cluster, fill in the first)
FLAT_MIB = 1.0
TRACE_DEPTH = 8  # frames kept per allocation: enough to find raysize's own line
BATCH = 50  # observes at once (a worker runs many loops' observes side by side)
WRITERS = 16  # the bench's own writes to the API server, at once
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


def heap_sites(heap: tracemalloc.Snapshot) -> Counter[str]:
    """The heap by the code that holds it: the innermost frame of raysize's own (else the
    allocation's own frame), as `file:line`."""
    sites: Counter[str] = Counter()
    for t in heap.traces:
        frames = list(reversed(t.traceback))  # the most recent first
        ours = next((f for f in frames if "raysize" in f.filename), frames[0])
        sites[f"{Path(ours.filename).name}:{ours.lineno}"] += t.size
    return sites


def grown_text(before: Path, after: Path) -> str:
    """The five lines of code whose heap grew most from one snapshot file to the next."""
    grown = heap_sites(tracemalloc.Snapshot.load(str(after)))
    grown.subtract(heap_sites(tracemalloc.Snapshot.load(str(before))))
    return "; ".join(f"{site} {n / 1024:+.0f} KiB" for site, n in grown.most_common(5))


def line(stage: str, acts: ClusterActivities) -> tuple[dict[str, int], float]:
    """The line of one stage; the maps' sizes and the heap (MiB)."""
    now = sizes(acts)
    maps = ", ".join(f"{k} {v}" for k, v in now.items())
    gc.collect()
    heap = tracemalloc.get_traced_memory()[0] / 2**20
    print(
        f"{stage:<18} RSS {rss_mib(os.getpid()):6.1f} MiB, Python heap {heap:6.1f} MiB\n"
        f"{'':<18} {maps}",
        flush=True,
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


@contextlib.contextmanager
def world(clusters: int) -> Iterator[tuple[str, list[str]]]:
    """The test world in a process of its own (this module's `--serve-world`): the API
    server's URL and each GCS stand-in's address. Stopped by its process group, always."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.tenant_churn_bench", "--serve-world", str(clusters)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        if not first:
            raise SystemExit(f"the world's process ended before it served (exit {proc.wait()})")
        ready = json.loads(first)
        yield ready["url"], ready["addresses"]
    finally:
        with contextlib.suppress(OSError):
            if proc.stdin is not None:
                proc.stdin.close()  # it stops at the end of its input
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def serve_world(clusters: int) -> None:
    """`--serve-world`: the API server and the GCS stand-ins until stdin ends."""
    sb = Sandbox(SandboxConfig(watch_history=WATCH_HISTORY))
    sb.server.start()
    try:
        with StandInFleet(clusters) as fleet:
            sb.store.create("namespaces", "", {"metadata": {"name": NS}})
            addresses = [ray.address for ray in fleet.stand_ins]
            print(json.dumps({"url": sb.url, "addresses": addresses}), flush=True)
            sys.stdin.read()
    finally:
        sb.server.stop()


def write_all(jobs: list[Callable[[], Any]]) -> float:
    """Each job (one call of the API) WRITERS at once, the first error raised; seconds."""
    began = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(WRITERS) as pool:
        for f in [pool.submit(job) for job in jobs]:
            f.result()
    return time.monotonic() - began


def creations(core: Any, custom: Any, names: list[str]) -> list[Callable[[], Any]]:
    jobs: list[Callable[[], Any]] = []
    for name in names:
        rc, secret = tenant(name)
        pod = kuberay_pod(name, "small", 0)
        pod["metadata"]["namespace"] = NS
        jobs.append(functools.partial(core.create_namespaced_secret, NS, secret))
        jobs.append(
            functools.partial(
                custom.create_namespaced_custom_object, "ray.io", "v1", NS, "rayclusters", rc
            )
        )
        jobs.append(functools.partial(core.create_namespaced_pod, NS, pod))
    return jobs


def deletions(core: Any, custom: Any, names: list[str]) -> list[Callable[[], Any]]:
    jobs: list[Callable[[], Any]] = []
    for name in names:
        pod = kuberay_pod(name, "small", 0)["metadata"]["name"]
        jobs.append(functools.partial(core.delete_namespaced_pod, pod, NS, grace_period_seconds=0))
        jobs.append(
            functools.partial(
                custom.delete_namespaced_custom_object, "ray.io", "v1", NS, "rayclusters", name
            )
        )
        jobs.append(functools.partial(core.delete_namespaced_secret, f"{name}-token", NS))
    return jobs


def run(clusters: int, rounds: int, workdir: Path) -> int:
    acts: ClusterActivities | None = None
    apis: list[client.ApiClient] = []
    try:
        with world(clusters) as (url, addresses):
            kubeconfig = str(write_kubeconfig(workdir / "kubeconfig", url))
            api = config.new_client_from_config(config_file=kubeconfig)
            # the bench's own writes: a client of their own, a connection per writer
            writer = config.new_client_from_config(config_file=kubeconfig)
            apis += [api, writer]
            writer.rest_client.pool_manager.connection_pool_kw["maxsize"] = WRITERS
            core, custom = client.CoreV1Api(writer), client.CustomObjectsApi(writer)
            # GCS threads retire after 1 s idle (10 s in the worker): the bench need not wait
            acts = ClusterActivities(kube=Kube(api, timeout_s=30.0), targets=Targets(idle_s=1.0))
            # traced from here: the client's API modules are imported (traced, importing
            # CoreV1Api's annotations took minutes), and the worker is made
            tracemalloc.start(TRACE_DEPTH)
            print(
                f"{clusters} clusters a round, {rounds} round(s): each its own token Secret, "
                "a worker pod and a GCS stand-in (the world in a process of its own)",
                flush=True,
            )
            start, _ = line("before", acts)
            ok = True
            heaps: list[float] = []  # the heap after each round's deletion (MiB)
            for r in range(1, rounds + 1):
                names = [f"t{r}-{i:04d}" for i in range(clusters)]
                made = write_all(creations(core, custom, names))
                began = time.monotonic()
                found = asyncio.run(observe_all(acts, names, addresses))
                took = time.monotonic() - began
                if found != clusters:
                    raise SystemExit(f"round {r}: {found} of {clusters} observes found theirs")
                line(f"round {r}: created", acts)
                print(
                    f"{'':<18} ({3 * clusters} objects made in {made:.1f} s; {clusters} "
                    f"observes in {took:.1f} s)",
                    flush=True,
                )
                write_all(deletions(core, custom, names))
                # the pod watch delivers the deletions; each loop's next observe finds it gone
                until(
                    lambda: sizes(acts)["pod_watch.by_cluster"] == 0,
                    "the pod watch delivered every pod's deletion",
                )
                if asyncio.run(observe_all(acts, names, addresses)):
                    raise SystemExit(f"round {r}: an observe found a deleted cluster")
                until(lambda: sizes(acts)["gcs targets"] == 0, "GCS threads retired", 30)
                after, heap = line(f"round {r}: deleted", acts)
                left = {k: v for k, v in after.items() if v != start[k]}
                if left:
                    ok = False
                    print(f"{'':<18} NOT freed: {left}")
                # the snapshot goes to a file, and is compared with the last one from files:
                # nothing of it is held when the next round's heap is measured
                snap = workdir / f"heap-{r}.snapshot"
                tracemalloc.take_snapshot().dump(str(snap))
                if heaps:
                    print(
                        f"{'':<18} the heap since round {r - 1} deleted: "
                        f"{(heap - heaps[-1]) * 1024:+.0f} KiB; by the code that holds it: "
                        + grown_text(workdir / f"heap-{r - 1}.snapshot", snap),
                        flush=True,
                    )
                heaps.append(heap)
            print("every per-cluster map back to its start after deletion:", "yes" if ok else "NO")
            growth = [b - a for a, b in itertools.pairwise(heaps[1:])]
            if growth:
                flat = max(growth) <= FLAT_MIB
                print(
                    "the heap after each round's deletion: "
                    + ", ".join(f"{h:.1f}" for h in heaps)
                    + " MiB; from round 2 on, round over round: "
                    + ", ".join(f"{g * 1024:+.0f} KiB" for g in growth)
                    + f" (target ≤ {FLAT_MIB * 1024:.0f} KiB a round of {clusters} clusters): "
                    + ("flat" if flat else "GROWS")
                )
                ok &= flat
            return 0 if ok else 1
    finally:
        if acts is not None:
            acts.close()
            acts.targets.close()
        for c in apis:
            c.close()
        tracemalloc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clusters", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--serve-world", type=int, metavar="CLUSTERS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_world:
        serve_world(args.serve_world)
        return
    # the queues' "all threads busy" lines: a batch of observes is meant to queue
    logging.getLogger("raysize").setLevel(logging.ERROR)
    if os.environ.get("CHURN_DEBUG"):
        logging.basicConfig(level=logging.INFO)
        logging.getLogger("raysize").setLevel(logging.INFO)
    with tempfile.TemporaryDirectory(prefix="raysize-churn-") as tmp:
        raise SystemExit(run(args.clusters, args.rounds, Path(tmp)))


if __name__ == "__main__":
    main()
