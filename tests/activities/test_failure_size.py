"""An activity's failure carries its message, not the chain of errors under it: the
Temporal server keeps at most 4 KB of an activity's last failure and replaces a larger
one with "Failure exceeds size limit." (then `temporal workflow describe`, the UI and the
tests that read the pending activity lose the reason). A gRPC error's text and traceback
under a RayUnavailable made it cross that line."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from temporalio.api.failure.v1 import Failure
from temporalio.converter import DataConverter
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from raysize.activities.cluster import ClusterActivities, RaySettings
from raysize.activities.ray_errors import RayUnavailable
from raysize.workflows.contracts import RayletResizeInput

SERVER_LIMIT = 4 * 1024


class DarkGcs:
    """A GCS that cannot be reached, with the long error text gRPC gives."""

    def resize_raylet(self, *args: Any) -> Any:
        try:
            raise ConnectionError("debug_error_string = " + "x" * 8000)
        except ConnectionError as inner:
            raise RayUnavailable(
                "resize Raylet 1d0e: cannot reach Ray GCS 127.0.0.1:1: Socket closed"
            ) from inner


def test_a_ray_failure_keeps_its_message_and_stays_small() -> None:
    acts = ClusterActivities(kube=None, ray=RaySettings(gcs_override="127.0.0.1:1"), pods=object())  # type: ignore[arg-type]
    acts.gcs = lambda address, source=None, cluster=None: DarkGcs()  # type: ignore[method-assign,assignment,return-value]
    acts._sources[("ns", "c")] = None  # no token of its own: no RayCluster read

    async def pod_still_there(inp: RayletResizeInput) -> None:
        return None

    acts._raise_if_pod_gone = pod_still_there  # type: ignore[method-assign]
    inp = RayletResizeInput(
        namespace="ns", cluster="c", pod="p", node_id="1d0e", cpu=2000, memory=2**30
    )
    with pytest.raises(ApplicationError) as caught:
        asyncio.run(ActivityEnvironment().run(acts.resize_raylet, inp))
    err = caught.value
    assert err.message == "resize Raylet 1d0e: cannot reach Ray GCS 127.0.0.1:1: Socket closed"
    assert err.type == "RayUnavailable" and not err.non_retryable
    failure = Failure()
    converter = DataConverter.default
    converter.failure_converter.to_failure(err, converter.payload_converter, failure)
    assert failure.ByteSize() < SERVER_LIMIT // 2, failure.ByteSize()
