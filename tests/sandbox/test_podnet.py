"""What the real world's container runtime does that a user of KubeRay relies on without
seeing it: the kubelet's `$(VAR)` expansion (KubeRay's autoscaler sidecar runs
`ray kuberay-autoscaler --cluster-name $(RAY_CLUSTER_NAME) …`)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from raysize.sandbox.cluster import SandboxConfig
from raysize.sandbox.podnet import expand
from raysize.sandbox.realworld import RealSandbox
from tests.orchestration.temporal_env import venv_binary
from tests.sandbox.conftest import KUBERNETES_VERSION, wait_for

KUBECTL = venv_binary("kubectl")


def test_defined_variables_are_expanded_and_the_rest_kept_as_written() -> None:
    env = {"RAY_CLUSTER_NAME": "demo", "RAY_CLUSTER_NAMESPACE": "team-a"}
    line = "ray kuberay-autoscaler --cluster-name $(RAY_CLUSTER_NAME) --cluster-namespace $(RAY_CLUSTER_NAMESPACE)"
    assert expand(line, env) == (
        "ray kuberay-autoscaler --cluster-name demo --cluster-namespace team-a"
    )
    # undefined: left as written; `$$` escapes; a shell's own `$VAR` is not the kubelet's
    assert expand("$(MISSING) $$(RAY_CLUSTER_NAME) $RAY_CLUSTER_NAME $", env) == (
        "$(MISSING) $(RAY_CLUSTER_NAME) $RAY_CLUSTER_NAME $"
    )


# --- init containers, as the kubelet runs them ----------------------------------------------
# A pod waits Pending (`Init:0/1`) while its init containers run, one after the other, each
# to its end; only then do its containers start. The sandbox's kubelet used to mark every
# pod Running at once, its init containers `Completed` before they had run.


@pytest.fixture(scope="module")
def real_pods(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[client.CoreV1Api, str]]:
    """The real API server, and the kubelet simulator running each pod's own commands in
    the pod's own network namespace."""
    config_ = SandboxConfig(nodes=1, node_cpu=8000, node_memory=16 * 1024**3, with_ray=True)
    sandbox = RealSandbox(config_, version=KUBERNETES_VERSION).start()
    try:
        path = tmp_path_factory.mktemp("kube") / "config"
        sandbox.write_kubeconfig(path)
        api = config.new_client_from_config(config_file=str(path))
        try:
            yield client.CoreV1Api(api), str(path)
        finally:
            api.close()
    finally:
        sandbox.close()


def pod_with_init(name: str, init_command: str, restart_policy: str = "Always") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": restart_policy,
            "initContainers": [
                {"name": "setup", "image": "busybox", "command": ["sh", "-c", init_command]}
            ],
            "containers": [{"name": "main", "image": "busybox", "command": ["sleep", "600"]}],
        },
    }


def kubectl_status(kubeconfig: str, name: str) -> str:
    """The STATUS column of `kubectl get pod`, which kubectl derives from the statuses."""
    out = subprocess.run(
        [KUBECTL, "--kubeconfig", kubeconfig, "get", "pod", name, "--no-headers"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return out[2]


def condition(pod: Any, ctype: str) -> Any:
    return next(c for c in pod.status.conditions or [] if c.type == ctype)


def test_a_pod_waits_for_its_init_container_to_complete(
    real_pods: tuple[client.CoreV1Api, str], tmp_path: Path
) -> None:
    core, kubeconfig = real_pods
    flag = tmp_path / "go"
    core.create_namespaced_pod(
        "default", pod_with_init("init-waits", f"while [ ! -e {flag} ]; do sleep 0.1; done")
    )
    wait_for(lambda: kubectl_status(kubeconfig, "init-waits") == "Init:0/1", timeout=30)
    pod = core.read_namespaced_pod("init-waits", "default")
    assert pod.status.phase == "Pending" and pod.status.pod_ip
    initialized = condition(pod, "Initialized")
    assert (initialized.status, initialized.reason, initialized.message) == (
        "False",
        "ContainersNotInitialized",
        "containers with incomplete status: [setup]",
    )
    assert pod.status.init_container_statuses[0].state.running is not None
    assert pod.status.container_statuses[0].state.waiting.reason == "PodInitializing"
    time.sleep(1)  # it keeps waiting: nothing starts the container before the init ends
    assert kubectl_status(kubeconfig, "init-waits") == "Init:0/1"

    flag.touch()
    wait_for(lambda: kubectl_status(kubeconfig, "init-waits") == "Running", timeout=30)
    pod = core.read_namespaced_pod("init-waits", "default")
    done = pod.status.init_container_statuses[0].state.terminated
    assert (done.exit_code, done.reason) == (0, "Completed")
    assert condition(pod, "Initialized").status == "True"
    assert pod.status.container_statuses[0].state.running is not None


def test_a_failed_init_container_fails_a_pod_that_never_restarts(
    real_pods: tuple[client.CoreV1Api, str],
) -> None:
    core, kubeconfig = real_pods
    core.create_namespaced_pod("default", pod_with_init("init-fails", "exit 3", "Never"))
    wait_for(lambda: kubectl_status(kubeconfig, "init-fails") == "Init:Error", timeout=30)
    pod = core.read_namespaced_pod("init-fails", "default")
    assert pod.status.phase == "Failed"
    failed = pod.status.init_container_statuses[0].state.terminated
    assert (failed.exit_code, failed.reason) == (3, "Error")
    assert pod.status.container_statuses[0].state.waiting.reason == "PodInitializing"


def test_a_failed_init_container_is_run_again_after_a_back_off(
    real_pods: tuple[client.CoreV1Api, str],
) -> None:
    core, kubeconfig = real_pods
    core.create_namespaced_pod("default", pod_with_init("init-retries", "exit 1"))
    wait_for(
        lambda: kubectl_status(kubeconfig, "init-retries") == "Init:CrashLoopBackOff", timeout=30
    )
    pod = core.read_namespaced_pod("init-retries", "default")
    assert pod.status.phase == "Pending"
    cs = pod.status.init_container_statuses[0]
    # 1, or more if the 10 s back-off has passed by now and it failed again
    assert cs.restart_count >= 1 and cs.last_state.terminated.exit_code == 1
    # the kubelet posts its Event after the status write: wait for it
    wait_for(
        lambda: (
            "BackOff"
            in [
                e.reason
                for e in core.list_namespaced_event(
                    "default", field_selector="involvedObject.name=init-retries"
                ).items
            ]
        ),
        timeout=30,
    )
