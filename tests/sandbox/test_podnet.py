"""What the real world's container runtime does that a user of KubeRay relies on without
seeing it: the kubelet's `$(VAR)` expansion (KubeRay's autoscaler sidecar runs
`ray kuberay-autoscaler --cluster-name $(RAY_CLUSTER_NAME) …`)."""

from __future__ import annotations

from raysize.sandbox.podnet import expand


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
