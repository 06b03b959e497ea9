"""A throttling API server, as kube-apiserver's API Priority and Fairness answers: the
embedded server turns requests away with 429, a `Retry-After` and a plain-text line
(`sandbox/errors.py` `too_many_requests`). raysize's `Kube` raises KubernetesThrottled
with that Retry-After, hands it to Temporal as the retry delay, and holds its next calls
to the server until it has passed; its pod watch does the same. The limiter's clock is a
fake one that moves when it sleeps: nothing here waits out a Retry-After."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from raysize.activities.k8s import Kube
from raysize.activities.k8s_activities import K8sActivities
from raysize.activities.k8s_errors import Throttled
from raysize.activities.kube_limits import KubeLimits
from raysize.activities.pod_watch import PodWatch
from raysize.sandbox.faults import FaultRule
from raysize.workflows.contracts import Err, SetStatusInput
from raysize.workflows.ippr_status import IpprStatus
from tests.activities.test_kube_limits import Clock
from tests.sandbox.conftest import client_for, pod_body, wait_for


@pytest.fixture
def throttled(make_sandbox, tmp_path):
    sb = make_sandbox()
    api = client_for(sb, tmp_path)
    client.CoreV1Api(api).create_namespaced_pod("default", pod_body("w1"))
    clock = Clock()
    host = api.configuration.host
    kube = Kube(api, timeout_s=5.0, limits=KubeLimits(host, clock=clock, sleep=clock.sleep))
    yield sb, kube, clock
    api.close()


def test_the_embedded_server_turns_requests_away_as_apf_does(throttled) -> None:
    sb, kube, _ = throttled
    rule = FaultRule(verb="get", resource="pods", error_rate=1.0, codes=(429,), retry_after_s=4)
    sb.faults.add(rule)
    with pytest.raises(ApiException) as exc:
        kube.core.read_namespaced_pod("w1", "default")
    assert exc.value.status == 429
    assert exc.value.body == "Too many requests, please try again later.\n"
    headers = exc.value.headers
    assert headers["Retry-After"] == "4"
    assert headers["Content-Type"] == "text/plain; charset=utf-8"
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["X-Kubernetes-PF-FlowSchema-UID"]
    assert headers["X-Kubernetes-PF-PriorityLevel-UID"]


def test_a_429_is_throttled_with_its_retry_after_and_holds_the_next_calls(
    throttled, caplog: pytest.LogCaptureFixture
) -> None:
    sb, kube, clock = throttled
    sb.faults.add(
        FaultRule(
            verb="get", resource="pods", error_rate=1.0, codes=(429,), times=1, retry_after_s=3
        )
    )
    with caplog.at_level(logging.INFO, logger="raysize.activities"):
        with pytest.raises(Throttled) as exc:
            kube.get_pod("default", "w1")
        assert exc.value.retry_after == 3.0 and exc.value.server == kube.host
        assert f"the Kubernetes API server at {kube.host} is throttling raysize" in str(exc.value)
        assert exc.value.to_application_error().next_retry_delay == timedelta(seconds=3)
        assert clock.slept == []
        # the next call waits out the server's 3 s first
        assert kube.get_pod("default", "w1")["metadata"]["name"] == "w1"
        assert clock.slept == [3.0]
        # and the ones after go at QPS, without a burst (a token apart: 0.01 s at 100/s)
        kube.get_pod("default", "w1")
        assert clock.slept == pytest.approx([3.0, 0.01])
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said  # the episode's start and end, once each
    assert "is throttling raysize" in said[0] and "Retry-After: 3 s" in said[0]
    assert "takes raysize's calls again: 1 turned away with 429" in said[1]


def test_the_activity_tells_temporal_to_retry_after_the_servers_delay(throttled) -> None:
    sb, kube, _ = throttled
    sb.faults.add(
        FaultRule(verb="patch", resource="pods", error_rate=1.0, codes=(429,), retry_after_s=5)
    )
    acts = K8sActivities(kube)
    inp = SetStatusInput(namespace="default", pod="w1", status=IpprStatus())
    with pytest.raises(ApplicationError) as exc:
        asyncio.run(ActivityEnvironment().run(acts.set_status, inp))
    assert exc.value.type == Err.KUBE_THROTTLED == "KubernetesThrottled"
    assert not exc.value.non_retryable
    assert exc.value.next_retry_delay == timedelta(seconds=5)


def test_a_5xx_is_not_taken_for_throttling(throttled) -> None:
    sb, kube, clock = throttled
    sb.faults.add(FaultRule(verb="get", resource="pods", error_rate=1.0, codes=(500,), times=1))
    with pytest.raises(Exception) as exc:
        kube.get_pod("default", "w1")
    assert not isinstance(exc.value, Throttled)
    assert exc.value.to_application_error().type == "KubernetesUnavailable"  # type: ignore[attr-defined]
    kube.get_pod("default", "w1")
    assert clock.slept == [] and not kube.limits.throttling


def test_the_pod_watch_takes_tokens_and_honours_a_429(throttled) -> None:
    sb, kube, clock = throttled
    sb.faults.add(
        FaultRule(
            verb="watch", resource="pods", error_rate=1.0, codes=(429,), times=1, retry_after_s=2
        )
    )
    watch = PodWatch(kube.core, limits=kube.limits)

    async def wait_for_the_list() -> None:
        with watch.subscribe("default", "w1"):
            # the list went through; its watch was turned away, and the reconnect waited 2 s
            await asyncio.to_thread(wait_for, lambda: 2.0 in clock.slept)

    try:
        asyncio.run(wait_for_the_list())
    finally:
        watch.close()
    assert sb.faults.rules()[0].injected == 1
    assert kube.limits.hold_until <= clock.now
