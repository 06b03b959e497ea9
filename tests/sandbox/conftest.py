"""Fixtures: an in-process sandbox, or a real cluster when RAYSIZE_TEST_KUBECONFIG is set.

The conformance tests use only `kube` (a real `kubernetes` client from a kubeconfig) and
`ns` (a fresh namespace), so they run unchanged against a real kube-apiserver.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from raysize.sandbox.cluster import Sandbox, SandboxConfig
from raysize.sandbox.kubelet import KubeletTiming
from raysize.sandbox.realworld import DEFAULT_KUBERNETES_VERSION, RealSandbox

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll until `predicate()` is truthy; fail with the last value at the deadline."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s (last: {last!r})")


def pod_body(
    name: str,
    *,
    requests: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    containers: int = 1,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = dict(requests)
    if limits:
        resources["limits"] = dict(limits)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": labels or {"app": "conformance"},
            "annotations": annotations or {},
        },
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {"name": f"c{i}", "image": PAUSE_IMAGE, "resources": resources}
                for i in range(containers)
            ],
        },
    }


# RAYSIZE_TEST_KUBECONFIG names one cluster to run the suite against instead;
# RAYSIZE_TEST_WORLDS=real (or sandbox) runs one of the two (make conformance-1.33)
WORLDS = (
    ("external",)
    if os.environ.get("RAYSIZE_TEST_KUBECONFIG")
    else tuple(os.environ.get("RAYSIZE_TEST_WORLDS", "sandbox,real").split(","))
)
KUBERNETES_VERSION = os.environ.get("RAYSIZE_TEST_KUBERNETES_VERSION", DEFAULT_KUBERNETES_VERSION)


@pytest.fixture(scope="package", params=WORLDS)
def world(request: pytest.FixtureRequest) -> str:
    """Which API server the conformance tests talk to: the embedded sandbox, or the real
    kube-apiserver + etcd (with the kubelet simulator as its client). Both run in make test;
    where they differ, the real server is the judge."""
    return str(request.param)


@pytest.fixture(scope="package")
def world_sandbox(world: str) -> Iterator[Sandbox | RealSandbox | None]:
    """The world's API server itself (None for an external one): for the few tests that
    act as another user (`Sandbox.api.authorizer`, `RealSandbox.service_account_kubeconfig`)."""
    if world == "external":
        yield None
        return
    config_ = SandboxConfig(
        nodes=2,
        node_cpu=8000,
        node_memory=16 * 1024**3,
        timing=KubeletTiming(actuation_delay_s=0.05, retry_initial_s=0.5, retry_interval_s=0.5),
        kubernetes_minor=36,  # the rules of the real server beside it
    )
    sandbox: Sandbox | RealSandbox = (
        Sandbox(config_) if world == "sandbox" else RealSandbox(config_, version=KUBERNETES_VERSION)
    )
    sandbox.start()
    try:
        yield sandbox
    finally:
        sandbox.close()


@pytest.fixture(scope="package")
def kubeconfig(
    world_sandbox: Sandbox | RealSandbox | None, tmp_path_factory: pytest.TempPathFactory
) -> str:
    if world_sandbox is None:
        return os.environ["RAYSIZE_TEST_KUBECONFIG"]
    path = tmp_path_factory.mktemp("kube") / "config"
    world_sandbox.write_kubeconfig(path)
    return str(path)


@pytest.fixture(scope="package")
def kube(kubeconfig: str) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(config_file=kubeconfig)
    try:
        yield api
    finally:
        api.close()


@pytest.fixture
def core(kube: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(kube)


# A Node no kubelet runs: a pod bound to it is never started or written to by anyone but
# the test, so its resourceVersion moves only when the test writes. It exists (1.36 refuses
# resizes of pods whose Node is missing) and is large, so its room never limits a resize;
# it declares no optional features. Its NoSchedule taint keeps a scheduler from binding
# other pods to it (a node lifecycle controller would taint it so too, as not Ready); the
# tests bind pods to it by `spec.nodeName`, which no taint stops.
PARKED_NODE = "raysize-conformance-parked"
PARKED_TAINT = {"key": "raysize.test/no-kubelet", "effect": "NoSchedule"}


@pytest.fixture(scope="package")
def parked_node(kube: client.ApiClient) -> str:
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": PARKED_NODE},
        "spec": {"taints": [PARKED_TAINT]},
        "status": {
            "capacity": {"cpu": "64", "memory": "256Gi", "pods": "110"},
            "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"},
        },
    }
    try:
        client.CoreV1Api(kube).create_node(body)
    except client.exceptions.ApiException as err:
        if err.status != 409:
            raise
    return PARKED_NODE


@pytest.fixture(scope="package")
def server_minor(kube: client.ApiClient) -> int:
    """The API server's Kubernetes minor version (36 for v1.36.x): where the rules changed,
    a test says which version it expects what of."""
    return int(str(client.VersionApi(kube).get_code().minor).rstrip("+"))


@pytest.fixture(scope="package")
def tracked(server_minor: int) -> Callable[[int | None], int | None]:
    """The observedGeneration the server keeps of what the kubelet writes (on the pod's
    status and its resize conditions): 1.33 drops it (PodObservedGenerationTracking is
    alpha there, off; beta and on from 1.34)."""
    return lambda generation: generation if server_minor >= 34 else None


@pytest.fixture(scope="package")
def keeps_allocated(server_minor: int) -> bool:
    """Whether the server keeps the kubelet's `allocatedResources` in container statuses:
    1.33 drops them (InPlacePodVerticalScalingAllocatedStatus is alpha there, off)."""
    return server_minor >= 34


@pytest.fixture
def ns(core: client.CoreV1Api, parked_node: str) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    try:
        yield name
    finally:
        empty_namespace(core.api_client, name)


def empty_namespace(kube: client.ApiClient, name: str) -> None:
    """Delete namespace `name` and what a test left in it, without waiting for the real
    world's namespace controller and garbage collector to get to it (the embedded server
    empties a deleted namespace at once).

    Its RayClusters first: one left in a terminating namespace is reconciled by the shared
    KubeRay operator for the rest of the run, failing each time ("unable to create new
    content … being terminated") and backing off (140 such errors in one run of this
    package's real tier); a later test's head pod came later than 120 s in CI beside them.
    Then the pods, at once (left running, they hold
    their node's room); then the namespace; then the pods again, for one the operator made
    between the two deletes (a terminating namespace takes no new one)."""
    core = client.CoreV1Api(kube)
    co = client.CustomObjectsApi(kube)
    try:
        co.delete_collection_namespaced_custom_object("ray.io", "v1", name, "rayclusters")
    except client.exceptions.ApiException as err:
        if err.status != 404:  # an external cluster without KubeRay's CRDs has none
            raise
    core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    core.delete_namespace(name)
    core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    with contextlib.suppress(client.exceptions.ApiException):
        left = co.list_namespaced_custom_object("ray.io", "v1", name, "rayclusters")["items"]
        assert not left, f"RayClusters left in {name}: {[o['metadata'] for o in left]}"


@pytest.fixture
def make_sandbox(tmp_path: Path) -> Iterator[Callable[..., Sandbox]]:
    """Build a private sandbox (own nodes and timing); every one is closed after the test."""
    made: list[Sandbox] = []

    def make(**kwargs: Any) -> Sandbox:
        sb = Sandbox(SandboxConfig(**kwargs)).start()
        made.append(sb)
        sb.write_kubeconfig(tmp_path / f"kubeconfig-{len(made)}")
        return sb

    try:
        yield make
    finally:
        for sb in made:
            sb.close()


def client_for(sb: Sandbox, tmp_path: Path) -> client.ApiClient:
    path = tmp_path / f"kc-{sb.server.port}"
    sb.write_kubeconfig(path)
    return config.new_client_from_config(config_file=str(path))
