"""deploy/overlays/namespaced on the real world: kube-apiserver v1.36 with RBAC enforced
and the real KubeRay operator. raysize's ServiceAccount token can do everything raysize
does in a watched namespace, and is refused (403) in one it does not watch."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import config
from kubernetes.client.exceptions import ApiException

from raysize.activities.discovery import list_rayclusters
from raysize.activities.k8s import Kube
from raysize.activities.k8s_errors import Forbidden
from raysize.sandbox.cluster import SandboxConfig
from raysize.sandbox.kubelet import KubeletTiming
from raysize.sandbox.realworld import RealSandbox
from raysize.worker.settings import Settings
from raysize.workflows.resources import GIB
from tests.deploy.conftest import EXAMPLE, NAMESPACED, SA_USER, find, render, run_kubectl
from tests.deploy.test_apply_sandbox import does_what_raysize_does
from tests.sandbox.conftest import wait_for

WATCHED = "team-a"
UNWATCHED = "default"


class World:
    def __init__(self, sb: RealSandbox, admin: Path, worker: Path) -> None:
        self.sb, self.admin, self.worker = sb, admin, worker

    def kubectl(self, *args: str) -> Any:
        return run_kubectl(*args, kubeconfig=self.admin)

    def worker_kube(self) -> Kube:
        return Kube(config.new_client_from_config(config_file=str(self.worker)), timeout_s=5.0)


def example_in(namespace: str, tmp: Path) -> Path:
    rc = yaml.safe_load(EXAMPLE.read_text())
    rc["metadata"]["namespace"] = namespace
    path = tmp / f"example-{namespace}.yaml"
    path.write_text(yaml.safe_dump(rc))
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """The watched namespaces created, then the overlay applied as admin (as a user would:
    the overlay does not create the namespaces it grants in, nor raysize's); the example RayCluster in a
    watched and in an unwatched namespace."""
    tmp = tmp_path_factory.mktemp("namespaced")
    sb = RealSandbox(SandboxConfig(nodes=1, timing=KubeletTiming(actuation_delay_s=0.0))).start()
    try:
        w = World(sb, sb.write_kubeconfig(tmp / "admin"), tmp / "worker")
        # the overlay makes nothing cluster-scoped: raysize's namespace too exists first
        for ns in ("raysize", "team-a", "team-b"):
            made = w.kubectl("create", "namespace", ns)
            assert made.returncode == 0, made.stderr
        applied = w.kubectl("apply", "-k", str(NAMESPACED))
        assert applied.returncode == 0, applied.stderr
        assert "role.rbac.authorization.k8s.io/raysize created" in applied.stdout
        assert "clusterrole" not in applied.stdout
        for ns in (WATCHED, UNWATCHED):
            example = w.kubectl("apply", "-f", str(example_in(ns, tmp)))
            assert example.returncode == 0, example.stderr
        sb.control_plane.service_account_kubeconfig(w.worker, "raysize", "raysize")
        yield w
    finally:
        sb.close()


def running_pods(w: World, ns: str) -> list[str]:
    out = w.kubectl(
        "get", "pods", "-n", ns, "-l", "ray.io/cluster=raysize-example", "-o",
        "jsonpath={range .items[*]}{.metadata.name}={.status.phase} {end}",
    )  # fmt: skip
    return [p for p in out.stdout.split() if p.endswith("=Running")]


def test_the_overlay_applied_without_any_cluster_wide_grant(world):
    got = world.kubectl("get", "clusterrole,clusterrolebinding", "-o", "name")
    assert got.returncode == 0, got.stderr
    assert not [n for n in got.stdout.split() if n.endswith("/raysize")]
    for ns in ("team-a", "team-b"):
        stored = json.loads(world.kubectl("get", "role/raysize", "-n", ns, "-o", "json").stdout)
        rendered = next(
            r
            for r in find(render(NAMESPACED), "Role", "raysize")
            if r["metadata"]["namespace"] == ns
        )
        assert stored["rules"] == rendered["rules"]
    # what the worker will watch is what the overlay granted
    cm = json.loads(world.kubectl("get", "configmap", "-n", "raysize", "-o", "json").stdout)[
        "items"
    ]
    (data,) = [c["data"] for c in cm if c["metadata"]["name"].startswith("raysize-config-")]
    assert Settings(namespaces=data["RAYSIZE_NAMESPACES"]).namespace_list() == ["team-a", "team-b"]


def test_in_a_watched_namespace_the_service_account_can_do_what_raysize_does(world):
    wait_for(lambda: len(running_pods(world, WATCHED)) >= 2, timeout=60)
    does_what_raysize_does(world.worker_kube(), WATCHED, every_namespace=False, node_room=False)


def test_discovery_lists_the_watched_namespaces_clusters(world):
    kube = world.worker_kube()
    for ns in Settings(namespaces="team-a,team-b").namespace_list():
        names = [rc["metadata"]["name"] for rc in list_rayclusters(kube, ns)]
        assert names == (["raysize-example"] if ns == WATCHED else [])


def test_in_an_unwatched_namespace_every_call_is_refused(world):
    wait_for(lambda: len(running_pods(world, UNWATCHED)) >= 2, timeout=60)
    admin = Kube(config.new_client_from_config(config_file=str(world.admin)), timeout_s=5.0)
    pod = next(p for p in admin.read_cluster(UNWATCHED, "raysize-example").pods if p.group == "cpu")
    kube = world.worker_kube()
    with pytest.raises(Forbidden) as refused:
        kube.read_cluster(UNWATCHED, "raysize-example")
    assert refused.value.status == 403
    with pytest.raises(Forbidden) as refused:
        kube.patch_resize(UNWATCHED, pod.name, 2000, 4 * GIB)
    # a resize reads the pod first: that is the call refused, and the rule it names
    assert refused.value.rule == {
        "apiGroups": [""],
        "resources": ["pods"],
        "verbs": ["get"],
        "namespace": UNWATCHED,
    }
    with pytest.raises(Forbidden):
        kube.scale(UNWATCHED, "raysize-example", {"cpu": 2}, {})
    for call in (
        lambda: list_rayclusters(kube, UNWATCHED),
        lambda: list_rayclusters(kube, ""),  # every namespace: only a ClusterRole allows it
        lambda: kube.core.list_namespaced_pod(UNWATCHED),
        # the node room's reads: the overlay has no deploy/components/node-room
        lambda: kube.core.list_node(),
        lambda: kube.core.list_pod_for_all_namespaces(),
    ):
        with pytest.raises((ApiException, Forbidden)) as err:
            call()
        assert getattr(err.value, "status", None) == 403
        assert SA_USER in str(err.value)  # the server names who was refused
    # and the pod was not touched
    after = next(
        p for p in admin.read_cluster(UNWATCHED, "raysize-example").pods if p.name == pod.name
    )
    assert after.total == pod.total


async def test_a_namespace_raysize_may_not_read_does_not_stop_discovery_elsewhere(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """RAYSIZE_NAMESPACES naming a namespace without its Role (403) made every discovery
    round fail, so no cluster was found in any namespace. It is skipped, and said so."""
    from raysize.activities.discovery import DiscoveryActivities
    from raysize.workflows.contracts import ReconcileInput

    discovery = DiscoveryActivities(
        kube=world.worker_kube(),
        temporal=None,  # type: ignore[arg-type]  # listing needs no Temporal
        task_queue="unused",
        start_input=lambda ns, name: ReconcileInput(namespace=ns, cluster=name),
    )
    found = await discovery.list_rayclusters([UNWATCHED, WATCHED])
    assert found == [(WATCHED, "raysize-example")]
    skipped = [r.getMessage() for r in caplog.records if "discovery skips" in r.getMessage()]
    assert len(skipped) == 1 and f"namespace {UNWATCHED!r}" in skipped[0]
    assert "forbidden" in skipped[0].lower()
