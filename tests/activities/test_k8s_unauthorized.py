"""A 401 says whose credentials were refused and what to check (it was only
"KubernetesError: Unauthorized")."""

from __future__ import annotations

import json

from raysize.activities.k8s_errors import Unauthorized, from_api_exception


def test_a_401_names_the_token_and_the_kubeconfig_and_is_retried() -> None:
    body = json.dumps({"kind": "Status", "message": "Unauthorized", "code": 401})
    err = from_api_exception(type("E", (), {"status": 401, "body": body})())
    assert isinstance(err, Unauthorized) and err.retryable
    text = str(err)
    assert "401 Unauthorized" in text
    assert "/var/run/secrets/kubernetes.io/serviceaccount/token" in text
    assert "ServiceAccount" in text and "RAYSIZE_KUBECONFIG" in text
    app = err.to_application_error()
    assert app.type == "KubernetesUnauthorized" and not app.non_retryable
