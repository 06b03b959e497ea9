"""A Raylet resize that finds no Raylet says why when it can: the pod it was decided on
is gone, or another pod now has its name (deleted and created again: a new Raylet). Then
the saga ends as for a gone pod, not "the pod is there, its Raylet is not"."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from raysize.activities.cluster import ClusterActivities, RaySettings
from raysize.activities.k8s import Kube
from raysize.activities.k8s_errors import PodGone
from raysize.activities.ray_errors import RayletNotFound
from raysize.workflows.contracts import Err, RayletResizeInput


class NoRaylet:
    def resize_raylet(self, *args: Any) -> Any:
        raise RayletNotFound("Raylet 1d0e not found")


class OnePod(Kube):
    """The API server's answer for pod ns/p: one pod with `uid`, or none."""

    host = "https://fake"  # the key of its calls' threads (activities/targets.py)
    timeout_s = 10.0

    def __init__(self, uid: str | None) -> None:
        self.uid = uid

    def get_pod(self, namespace: str, pod: str) -> dict[str, Any]:
        if self.uid is None:
            raise PodGone(f'pods "{pod}" not found', status=404)
        return {"metadata": {"name": pod, "namespace": namespace, "uid": self.uid}}


@pytest.mark.parametrize(
    ("pod_now", "error"),
    [
        ("uid-1", Err.RAYLET_GONE),  # the pod decided on is there: its Raylet is gone
        ("uid-2", Err.POD_GONE),  # another pod under its name
        (None, Err.POD_GONE),  # deleted
    ],
)
def test_a_missing_raylet_of_a_replaced_or_deleted_pod_is_the_pod_gone(
    pod_now: str | None, error: str
) -> None:
    acts = ClusterActivities(
        kube=OnePod(pod_now),
        ray=RaySettings(gcs_override="127.0.0.1:1"),
        pods=object(),  # type: ignore[arg-type]
    )
    acts.gcs = lambda address, source=None, cluster=None: NoRaylet()  # type: ignore[method-assign,assignment,return-value]
    acts._sources[("ns", "c")] = None  # no token of its own: no RayCluster read
    inp = RayletResizeInput(
        namespace="ns", cluster="c", pod="p", node_id="1d0e", cpu=2000, memory=2**30,
        pod_uid="uid-1",
    )  # fmt: skip
    with pytest.raises(ApplicationError) as caught:
        asyncio.run(ActivityEnvironment().run(acts.resize_raylet, inp))
    assert (caught.value.type, caught.value.non_retryable) == (error, True)
