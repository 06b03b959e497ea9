"""The fault proxy in front of the real API server names each request as the embedded
server does, so one `FaultRule` means the same in both worlds."""

from __future__ import annotations

import pytest

from raysize.sandbox.faultproxy import FaultProxy, request_of
from raysize.sandbox.faults import Faults


@pytest.mark.parametrize(
    ("method", "target", "expected"),
    [
        (
            "GET",
            "/api/v1/namespaces/default/pods?watch=true&resourceVersion=5",
            ("watch", "pods", ""),
        ),
        ("GET", "/api/v1/namespaces/default/pods", ("list", "pods", "")),
        ("GET", "/api/v1/namespaces/default/pods/w1", ("get", "pods", "w1")),
        ("PATCH", "/api/v1/namespaces/default/pods/w1/resize", ("patch", "pods/resize", "w1")),
        ("PATCH", "/api/v1/namespaces/default/pods/w1", ("patch", "pods", "w1")),
        ("PUT", "/api/v1/namespaces/default/pods/w1/status", ("update", "pods/status", "w1")),
        ("POST", "/api/v1/namespaces/default/events", ("create", "events", "")),
        (
            "PATCH",
            "/apis/ray.io/v1/namespaces/team-a/rayclusters/demo",
            ("patch", "rayclusters", "demo"),
        ),
        ("GET", "/apis/ray.io/v1/rayclusters?watch=1", ("watch", "rayclusters", "")),
        ("GET", "/api/v1/namespaces/default", ("get", "namespaces", "default")),
        ("GET", "/api/v1/nodes/node-a", ("get", "nodes", "node-a")),
        ("DELETE", "/api/v1/namespaces/default/pods/w1", ("delete", "pods", "w1")),
    ],
)
def test_requests_are_named_as_the_embedded_server_names_them(method, target, expected):
    assert request_of(method, target) == expected


def test_an_upstream_and_its_ca_must_agree(tmp_path):
    """https:// needs the upstream's CA; http:// (the embedded server's HTTPS front) none."""
    with pytest.raises(ValueError, match="an https:// upstream needs its CA"):
        FaultProxy("https://127.0.0.1:6443", None, Faults(), tmp_path)
    with pytest.raises(ValueError, match="an http:// one none"):
        FaultProxy("http://127.0.0.1:8080", b"-----BEGIN CERTIFICATE-----", Faults(), tmp_path)
    plain = FaultProxy("http://127.0.0.1:8080", None, Faults(), tmp_path)
    assert (plain.upstream_port, plain.upstream_tls) == (8080, None)
