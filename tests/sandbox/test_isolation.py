"""One blackholed GCS delays only its own cluster (activities/targets.py): the blocking
calls of each API server and each GCS run on threads of their own.

Five RayClusters whose GCS address blackholes (a TCP listener that accepts and never
answers, as a GCS behind a NetworkPolicy that drops its traffic) hang their observe and
seven Raylet resizes each: 40 calls, more than asyncio's default executor holds on any
machine (min(32, cores + 4) threads), which is where every blocking call of the worker
ran before. Fifty healthy RayClusters (one GCS stand-in answering at fifty addresses) are
then observed through the same `ClusterActivities`: every healthy observe must end while
every blackholed call still hangs. On the shared default executor the healthy observes
queued behind the blackholed calls and ended only after those timed out (the ordering
assertion below failed).

No timed assertion: the blackholed calls' own limits (gRPC gives up on a connection that
sends no SETTINGS after 20 s; the call timeout is 30 s) only bound how long the test takes
when isolation breaks; the listeners are closed at the end, which ends the calls at once.
"""

from __future__ import annotations

import asyncio
import selectors
import socket
import threading

from kubernetes import client
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from raysize.activities.cluster import ClusterActivities, RaySettings
from raysize.activities.k8s import Kube
from raysize.activities.k8s_objects import gcs_address
from raysize.activities.targets import Load
from raysize.sandbox.kubelet import KubeletTiming
from raysize.sandbox.ray_standin import RayStandIn
from raysize.workflows.contracts import ObserveInput, RayletResizeInput, Tick
from raysize.workflows.resources import GIB

from .conftest import client_for, wait_for
from .test_kubectl_and_operator import raycluster

HEALTHY = 50
BLACKHOLED = 5
RESIZES = 7  # Raylet resizes in flight per blackholed cluster, besides its observe
NS = "default"


class Blackhole:
    """TCP listeners on 127.0.0.1 that accept every connection and never answer."""

    def __init__(self, count: int) -> None:
        self._listeners = []
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sock.listen(64)
            sock.setblocking(False)
            self._listeners.append(sock)
        self.ports = [s.getsockname()[1] for s in self._listeners]
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="blackhole", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        with selectors.DefaultSelector() as sel:
            for sock in self._listeners:
                sel.register(sock, selectors.EVENT_READ)
            while not self._stop.is_set():
                for key, _ in sel.select(0.1):
                    listener: socket.socket = key.fileobj  # type: ignore[assignment]
                    try:
                        conn, _ = listener.accept()
                    except BlockingIOError:
                        continue
                    self._held.append(conn)

    def close(self) -> None:
        """Close every listener and connection: the calls on them fail at once."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        for sock in [*self._held, *self._listeners]:
            sock.close()


def test_blackholed_gcs_addresses_delay_only_their_own_clusters(make_sandbox, tmp_path):
    sb = make_sandbox(
        node_cpu=200_000,
        node_memory=512 * GIB,
        max_pods=200,
        timing=KubeletTiming(actuation_delay_s=0.0),
    )
    api = client_for(sb, tmp_path)
    custom = client.CustomObjectsApi(api)
    ray = RayStandIn()
    healthy = {f"ok-{i:02d}": ray.listen() for i in range(HEALTHY)}
    hole = Blackhole(BLACKHOLED)
    blackholed = {f"bh-{i}": port for i, port in enumerate(hole.ports)}
    acts: ClusterActivities | None = None
    try:
        ray.__enter__()
        for name, port in {**healthy, **blackholed}.items():
            sb.serve_gcs(NS, name, port)  # the RayCluster's status reports 127.0.0.1:port
            custom.create_namespaced_custom_object(
                "ray.io", "v1", NS, "rayclusters", raycluster(name, replicas=0)
            )

        def reported() -> int:
            items = custom.list_namespaced_custom_object("ray.io", "v1", NS, "rayclusters")
            return sum(1 for rc in items["items"] if gcs_address(rc))

        wait_for(lambda: reported() == HEALTHY + BLACKHOLED, timeout=60)
        acts = ClusterActivities(kube=Kube(api, timeout_s=10.0), ray=RaySettings(timeout_s=30.0))
        targets = acts.targets

        def activity(fn, inp) -> asyncio.Future:
            return asyncio.ensure_future(ActivityEnvironment().run(fn, inp))

        def hanging_load() -> dict[str, Load]:
            return {
                name: load
                for name, load in targets.load().items()
                if name in {f"gcs 127.0.0.1:{port}" for port in hole.ports}
            }

        async def scenario() -> None:
            hanging = []
            for name in blackholed:
                hanging.append(
                    activity(acts.observe_cluster, ObserveInput(namespace=NS, cluster=name))
                )
                for r in range(RESIZES):
                    inp = RayletResizeInput(
                        namespace=NS, cluster=name, pod=f"{name}-w{r}", node_id="ab" * 28,
                        cpu=2000, memory=2 * GIB,
                    )  # fmt: skip
                    hanging.append(activity(acts.resize_raylet, inp))
            # every blackholed call is on its GCS's threads, running or waiting for one
            per_target = 1 + RESIZES
            want = Load(
                running=min(per_target, targets.gcs_threads),
                waiting=max(0, per_target - targets.gcs_threads),
                threads=min(per_target, targets.gcs_threads),
            )
            while set(hanging_load().values()) != {want} or len(hanging_load()) != BLACKHOLED:
                assert not any(t.done() for t in hanging), [t for t in hanging if t.done()]
                await asyncio.sleep(0.05)

            observed = asyncio.gather(
                *(
                    activity(acts.observe_cluster, ObserveInput(namespace=NS, cluster=name))
                    for name in healthy
                )
            )
            done, _ = await asyncio.wait([observed, *hanging], return_when=asyncio.FIRST_COMPLETED)
            assert observed in done, "a blackholed call ended before the healthy observes"
            assert not any(t.done() for t in hanging)
            ticks = observed.result()
            assert all(isinstance(t, Tick) and t.read_ray for t in ticks)
            assert ray.counts()[3] >= HEALTHY  # each healthy observe read its GCS
            assert set(hanging_load().values()) == {want}  # and the blackholed still hang

            hole.close()  # the blackholed calls now fail at once, the waiting ones too
            outcomes = await asyncio.gather(*hanging, return_exceptions=True)
            assert all(isinstance(o, ApplicationError) for o in outcomes), outcomes

        asyncio.run(scenario())
    finally:
        hole.close()
        ray.__exit__(None, None, None)
        if acts is not None:
            acts.close()
            acts.targets.close()
        api.close()
