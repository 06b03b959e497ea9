"""Launching at size, on the worker's side (issue #44): after raysize wrote the size a
group's new pods start at, the first new pod of the group is looked at once; at its
template's size (the admission policy not in force) it is said once per cluster."""

from __future__ import annotations

import logging

import pytest
from kubernetes import client

from raysize.activities import k8s
from raysize.activities.k8s import Kube
from raysize.workflows.model import GroupSpec, IpprLimits, PodView
from raysize.workflows.raycluster_spec import GroupSpecs
from raysize.workflows.resources import GIB, Resources

GROUPS = GroupSpecs(
    groups={
        "small": GroupSpec(
            name="small",
            resources=Resources.of(cpu=1000, memory=GIB),
            ippr=IpprLimits(max_cpu=4000, max_memory=4 * GIB, resize_timeout_s=60),
        )
    }
)


def view(name: str, uid: str, cpu: int, resized: bool = False) -> PodView:
    return PodView(
        name=name, uid=uid, group="small", total=Resources.of(cpu=cpu, memory=GIB), resized=resized
    )


@pytest.fixture
def kube(monkeypatch: pytest.MonkeyPatch) -> Kube:
    monkeypatch.setattr(k8s, "_LAUNCH_SIZE_NOT_IN_FORCE", set())
    return Kube(client.ApiClient(client.Configuration()))


def test_a_new_pod_at_its_templates_size_says_the_policy_is_not_in_force(
    kube: Kube, caplog: pytest.LogCaptureFixture
) -> None:
    kube._launch_asked[("ns", "c", "small")] = ((4000, GIB), frozenset({"old"}))
    with caplog.at_level(logging.WARNING, logger="raysize.activities"):
        # the pod that was there before the write says nothing
        kube._launched_as_asked("ns", "c", (view("w0", "old", 1000),), GROUPS)
        assert not caplog.records and kube._launch_asked
        kube._launched_as_asked(
            "ns", "c", (view("w0", "old", 1000), view("w1", "new", 1000)), GROUPS
        )
        (said,) = caplog.records
        assert (
            "new pod w1 of group small started at its template's 1 CPU/1Gi, not the 4 CPU/1Gi"
            in (said.getMessage())
        )
        assert "install deploy/components/launch-size" in said.getMessage()
        assert not kube._launch_asked  # looked at once
        # said once per cluster
        kube._launch_asked[("ns", "c", "small")] = ((4000, GIB), frozenset({"old", "new"}))
        kube._launched_as_asked("ns", "c", (view("w2", "newer", 1000),), GROUPS)
        assert len(caplog.records) == 1


def test_a_new_pod_at_the_size_asked_says_nothing(
    kube: Kube, caplog: pytest.LogCaptureFixture
) -> None:
    kube._launch_asked[("ns", "c", "small")] = ((4000, GIB), frozenset())
    with caplog.at_level(logging.WARNING, logger="raysize.activities"):
        kube._launched_as_asked("ns", "c", (view("w1", "new", 4000),), GROUPS)
        # one raysize resized since (it has ray.io/ippr-status) says nothing either
        kube._launch_asked[("ns", "c", "small")] = ((4000, GIB), frozenset({"new"}))
        kube._launched_as_asked("ns", "c", (view("w2", "newer", 1000, resized=True),), GROUPS)
    assert not caplog.records
