"""deploy/worker/admission-policy.yaml, offline: it names every field of KubeRay's RayCluster
spec that raysize must not change (CEL cannot say "all but these"), so a KubeRay upgrade
that adds a field fails here instead of slipping through; it applies to raysize's
ServiceAccount in every install; the Helm chart ships the same file. What the real API
server makes of it is in test_apply_real.py."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from raysize.sandbox.realworld import parts
from tests.deploy.conftest import DEPLOY, SA_USER, find, render

POLICY = DEPLOY / "worker" / "admission-policy.yaml"
CHART_COPY = DEPLOY / "helm" / "raysize" / "files" / "admission-policy.yaml"
# what raysize writes (Kube.scale): everything else in a worker group must stay
MAY_CHANGE = {"replicas", "scaleStrategy"}


def policies() -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in find(render(DEPLOY), "ValidatingAdmissionPolicy")}


def rayclusters_spec_schema() -> dict[str, Any]:
    crd = yaml.safe_load((parts(build=False).kuberay_crds / "ray.io_rayclusters.yaml").read_text())
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return dict(v1["schema"]["openAPIV3Schema"]["properties"]["spec"])


def expressions(policy: dict[str, Any]) -> str:
    return "\n".join(v["expression"] for v in policy["spec"]["validations"])


def test_every_field_of_the_raycluster_spec_but_workergroupspecs_is_kept():
    text = expressions(policies()["raysize-rayclusters"])
    kept = set(re.findall(r"object\.spec\.\?(\w+) == oldObject\.spec\.\?\1\b", text))
    assert kept == set(rayclusters_spec_schema()["properties"]) - {"workerGroupSpecs"}


def test_every_field_of_a_worker_group_but_replicas_and_scale_strategy_is_kept():
    text = expressions(policies()["raysize-rayclusters"])
    kept = set(re.findall(r"o\.\?(\w+) == g\.\?\1\b", text)) | {"groupName"}
    assert "o.groupName == g.groupName" in text  # groups are matched by name
    group = rayclusters_spec_schema()["properties"]["workerGroupSpecs"]["items"]
    assert kept == set(group["properties"]) - MAY_CHANGE
    # and scaleStrategy holds nothing but the workersToDelete raysize writes
    assert set(group["properties"]["scaleStrategy"]["properties"]) == {"workersToDelete"}


@pytest.mark.parametrize("name", ["raysize-ray-pods", "raysize-rayclusters"])
def test_each_policy_binds_denying_and_applies_to_raysize_only(name):
    docs = render(DEPLOY)
    policy = policies()[name]
    (binding,) = [
        b for b in find(docs, "ValidatingAdmissionPolicyBinding") if b["spec"]["policyName"] == name
    ]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert "matchResources" not in binding["spec"]  # every namespace
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"  # a policy that cannot run refuses
    (condition,) = spec["matchConditions"]
    assert condition["expression"] == f"request.userInfo.username == '{SA_USER}'"
    account = one_service_account(docs)
    assert f"system:serviceaccount:{account['namespace']}:{account['name']}" == SA_USER
    for rule in spec["matchConstraints"]["resourceRules"]:
        assert rule["operations"] == ["UPDATE"]  # RBAC grants no create or delete
        assert any(r.endswith("/*") for r in rule["resources"])  # every subresource too
    for validation in spec["validations"]:
        assert validation["reason"] == "Forbidden" and validation["message"]


def one_service_account(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (sa,) = find(docs, "ServiceAccount")
    return dict(sa["metadata"])


def test_the_chart_ships_the_same_policy_file():
    assert CHART_COPY.read_text() == POLICY.read_text()
