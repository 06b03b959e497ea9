"""The chart's values in the KubeRay chart's manner (issue #45 item 3): names derived from
nameOverride/fullnameOverride (today's names by default), serviceAccount, rbac,
existingSecret for each Secret the worker reads, overridable security contexts,
scheduling, pod labels, metrics with a PodMonitor or a ServiceMonitor, alerts and dashboard
each optional, admissionPolicy, observeOnly; values.schema.json refusing a bad value by
name; all of it accepted by the real API server."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from raysize.sandbox.realworld import DEFAULT_KUBERNETES_VERSION
from tests.deploy.conftest import ADMISSION_KINDS, KUBECTL, find, one, run_kubectl
from tests.deploy.test_helm import CHART, docs_of, helm, release

MONITORING_KINDS = ("PodMonitor", "ServiceMonitor", "PrometheusRule", "Service")


def refused(*values: str) -> str:
    """`helm template` with these values fails: its error."""
    out = helm(
        "template", "raysize", str(CHART), "--namespace", "raysize",
        "--kube-version", DEFAULT_KUBERNETES_VERSION, *values,
    )  # fmt: skip
    assert out.returncode != 0, f"accepted: {values}"
    return out.stderr


def pod_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (deploy,) = find(docs, "Deployment")
    template: dict[str, Any] = deploy["spec"]["template"]
    return template


def env_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = pod_of(docs)["spec"]["containers"]
    return {e["name"]: e for e in container["env"]}


def names(docs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs}


def test_default_names_are_todays_whatever_the_release():
    """An upgrade renames nothing: the objects in the release's namespace keep deploy/'s
    names; the cluster-scoped ones follow the release (as before)."""
    for docs in (docs_of(), release("team-b", "ops")):
        assert {("Deployment", "raysize-worker"), ("ServiceAccount", "raysize"),
                ("ConfigMap", "raysize-config"),
                ("PodDisruptionBudget", "raysize-worker")} <= names(docs)  # fmt: skip
        assert pod_of(docs)["spec"]["serviceAccountName"] == "raysize"


def test_name_overrides_rename_every_object_and_reference():
    docs = release("team-b", "ops", "--set", "fullnameOverride=rs")
    assert {("Deployment", "rs-worker"), ("ServiceAccount", "rs"), ("ConfigMap", "rs-config"),
            ("Role", "rs"), ("ClusterRole", "rs-node-room"),
            ("ValidatingAdmissionPolicy", "rs-ray-pods")} <= names(docs)  # fmt: skip
    pod = pod_of(docs)["spec"]
    assert pod["serviceAccountName"] == "rs"
    assert pod["containers"][0]["envFrom"] == [{"configMapRef": {"name": "rs-config"}}]
    for binding in find(docs, "RoleBinding") + find(docs, "ClusterRoleBinding"):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rs", "namespace": "ops"}]
    (policy, _) = find(docs, "ValidatingAdmissionPolicy")
    assert "'system:serviceaccount:ops:rs'" in policy["spec"]["matchConditions"][0]["expression"]
    named = release("raysize", "raysize", "--set", "nameOverride=ippr")
    assert ("Deployment", "ippr-worker") in names(named)
    assert ("Role", "raysize-ippr") in names(named)  # the release's name does not hold it
    assert pod_of(named)["metadata"]["labels"]["app.kubernetes.io/name"] == "ippr"
    (deploy,) = find(named, "Deployment")
    assert deploy["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == "ippr"


def test_service_account_values():
    docs = docs_of("--set", "serviceAccount.name=ray-resizer",
                   "--set", "serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn=arn:x")  # fmt: skip
    sa = one(docs, "ServiceAccount", "ray-resizer")
    assert sa["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": "arn:x"}
    assert pod_of(docs)["spec"]["serviceAccountName"] == "ray-resizer"
    for binding in find(docs, "RoleBinding"):  # raysize's rules, reading Ray token Secrets
        assert binding["subjects"][0]["name"] == "ray-resizer"
    theirs = docs_of("--set", "serviceAccount.create=false,serviceAccount.name=platform-sa")
    assert not find(theirs, "ServiceAccount")
    assert pod_of(theirs)["spec"]["serviceAccountName"] == "platform-sa"
    for policy in find(theirs, "ValidatingAdmissionPolicy"):
        assert "system:serviceaccount:raysize:platform-sa" in str(policy["spec"])
    assert "serviceAccount.create is false: name the existing ServiceAccount" in refused(
        "--set", "serviceAccount.create=false"
    )


@pytest.mark.parametrize("mode", [[], ["--set", "clusterWide=true"]], ids=["roles", "cluster"])
def test_rbac_create_false_renders_no_grant(mode):
    docs = docs_of(*mode, "--set", "rbac.create=false")
    rbac = ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
    assert not [d for d in docs if d["kind"] in rbac]
    assert [d for d in docs_of(*mode) if d["kind"] in rbac]  # the default grants
    assert {d["kind"] for d in docs} >= {"Deployment", "ServiceAccount", *ADMISSION_KINDS}


def test_admission_policy_can_be_left_out():
    assert find(docs_of(), "ValidatingAdmissionPolicy")
    assert not [d for d in docs_of("--set", "admissionPolicy.enabled=false")
                if d["kind"] in ADMISSION_KINDS]  # fmt: skip


def test_observe_only_reaches_the_workers_settings(monkeypatch):
    from raysize.worker.settings import Settings

    (cm,) = find(docs_of("--set", "observeOnly=true"), "ConfigMap")
    assert cm["data"]["RAYSIZE_OBSERVE_ONLY"] == "true"
    monkeypatch.setenv("RAYSIZE_OBSERVE_ONLY", cm["data"]["RAYSIZE_OBSERVE_ONLY"])
    assert Settings().observe_only is True
    (default,) = find(docs_of(), "ConfigMap")
    assert "RAYSIZE_OBSERVE_ONLY" not in default["data"]


def test_existing_secrets_name_what_the_worker_reads():
    docs = docs_of(
        "--set", "temporal.existingSecret=tc,temporal.existingSecretKey=key",
        "--set", "rayToken.existingSecret=rt,rayToken.existingSecretKey=tok",
        "--set", "temporal.mtls=true,temporal.tlsExistingSecret=mtls",
    )  # fmt: skip
    env = env_of(docs)
    assert env["RAYSIZE_TEMPORAL_API_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "tc", "key": "key", "optional": True}  # fmt: skip
    assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "rt", "key": "tok", "optional": True}  # fmt: skip
    volumes = {v["name"]: v for v in pod_of(docs)["spec"]["volumes"]}
    assert volumes["temporal-tls"]["secret"]["secretName"] == "mtls"
    # the key file: the Secret's key is mounted where the worker reads it
    as_file = docs_of("--set", "temporal.apiKeyFile=true,temporal.existingSecret=tc",
                      "--set", "temporal.existingSecretKey=key")  # fmt: skip
    volume = {v["name"]: v for v in pod_of(as_file)["spec"]["volumes"]}["temporal-api-key"]
    assert volume["secret"]["secretName"] == "tc"
    assert volume["secret"]["items"] == [{"key": "key", "path": "api-key"}]
    path = env_of(as_file)["RAYSIZE_TEMPORAL_API_KEY_FILE"]["value"]
    assert path.endswith("/api-key")
    # defaults: today's names
    env = env_of(docs_of())
    assert (
        env["RAYSIZE_TEMPORAL_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "raysize-temporal"
    )
    assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "raysize-ray-token"


def test_security_contexts_are_values_a_platform_can_unset():
    default = pod_of(docs_of())["spec"]
    assert default["securityContext"]["runAsUser"] == 10001
    assert default["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    openshift = pod_of(docs_of(
        "--set", "podSecurityContext.runAsUser=null,podSecurityContext.runAsGroup=null",
        "--set", "podSecurityContext.fsGroup=null",
    ))["spec"]  # fmt: skip
    assert openshift["securityContext"] == {
        "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}  # fmt: skip
    hardened = pod_of(docs_of("--set", "securityContext.runAsNonRoot=true"))["spec"]
    assert hardened["containers"][0]["securityContext"]["runAsNonRoot"] is True
    assert hardened["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_scheduling_and_pod_labels(tmp_path: Path):
    values = {
        "priorityClassName": "system-cluster-critical",
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                       "whenUnsatisfiable": "ScheduleAnyway"}],
        "podLabels": {"team": "ml", "app.kubernetes.io/component": "not-worker"},
    }  # fmt: skip
    (tmp_path / "v.yaml").write_text(yaml.safe_dump(values))
    pod = pod_of(docs_of("--values", str(tmp_path / "v.yaml")))
    assert pod["spec"]["priorityClassName"] == "system-cluster-critical"
    assert pod["spec"]["topologySpreadConstraints"] == values["topologySpreadConstraints"]
    # podLabels are added; the selector's labels cannot be overridden
    assert pod["metadata"]["labels"] == {"team": "ml", "app.kubernetes.io/name": "raysize",
                                         "app.kubernetes.io/component": "worker"}  # fmt: skip
    default = pod_of(docs_of())["spec"]
    assert "priorityClassName" not in default and "topologySpreadConstraints" not in default


def kinds(docs: list[dict[str, Any]]) -> list[str]:
    return sorted(d["kind"] for d in docs if d["kind"] in MONITORING_KINDS) + sorted(
        d["metadata"]["name"]
        for d in find(docs, "ConfigMap")
        if "dashboard" in d["metadata"]["name"]
    )


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ("", []),
        ("monitoring.enabled=true", ["PodMonitor", "PrometheusRule", "raysize-grafana-dashboard"]),
        ("metrics.podMonitor.enabled=true", ["PodMonitor"]),
        ("metrics.serviceMonitor.enabled=true", ["Service", "ServiceMonitor"]),
        ("monitoring.enabled=true,metrics.serviceMonitor.enabled=true",
         ["PrometheusRule", "Service", "ServiceMonitor", "raysize-grafana-dashboard"]),
        ("monitoring.alerts.enabled=true", ["PrometheusRule"]),
        ("monitoring.dashboard.enabled=true", ["raysize-grafana-dashboard"]),
        ("metrics.enabled=false,monitoring.dashboard.enabled=true", ["raysize-grafana-dashboard"]),
    ],
)  # fmt: skip
def test_metrics_monitors_alerts_and_dashboard_each_on_their_own_switch(values, expected):
    assert kinds(docs_of(*(["--set", values] if values else []))) == expected


def test_the_service_monitor_scrapes_the_alerts_job():
    docs = release("raysize", "ops", "--set", "metrics.serviceMonitor.enabled=true",
                   "--set", "monitoring.alerts.enabled=true")  # fmt: skip
    (service,) = find(docs, "Service")
    (monitor,) = find(docs, "ServiceMonitor")
    assert service["spec"]["selector"] == pod_of(docs)["metadata"]["labels"]
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["relabelings"] == [{"targetLabel": "job", "replacement": "ops/raysize-worker"}]
    (rule,) = find(docs, "PrometheusRule")
    assert 'up{job="ops/raysize-worker"}' in str(rule["spec"])


def test_metrics_off_serves_no_endpoint():
    docs = docs_of("--set", "metrics.enabled=false,networkPolicy.enabled=true")
    pod = pod_of(docs)
    assert not [a for a in pod["metadata"]["annotations"] if a.startswith("prometheus.io/")]
    assert "ports" not in pod["spec"]["containers"][0]
    (cm,) = find(docs, "ConfigMap")
    assert "RAYSIZE_PROMETHEUS_BIND" not in cm["data"]
    (policy,) = find(docs, "NetworkPolicy")
    assert policy["spec"]["ingress"] == []


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ("observOnly=true", "additional properties 'observOnly' not allowed"),
        ("observeOnly=yes", "at '/observeOnly': got string, want boolean"),
        ("logLevel=LOUD", "at '/logLevel': value must be one of"),
        ("logFormat=xml", "at '/logFormat': value must be one of"),
        ("metrics.port=99999", "at '/metrics/port': maximum"),
        ("temporal.address=temporal.example.com", "at '/temporal/address'"),
        ("image.pullPolicy=Sometimes", "at '/image/pullPolicy'"),
        ("serviceAccount.create=maybe", "at '/serviceAccount/create'"),
        ("rbac.create=null", "at '/rbac'"),
        ("watchNamespaces={Team_A}", "at '/watchNamespaces/0'"),
        ("rayTokenSecrets.names={Bad_Name}", "at '/rayTokenSecrets/names/0'"),
        ("rayTokenSecrets.enabled=sometimes", "at '/rayTokenSecrets/enabled'"),
        ("metrics.podMonitor.interval=often", "at '/metrics/podMonitor/interval'"),
        ("topologySpreadConstraints[0].maxSkew=1", "at '/topologySpreadConstraints/0'"),
        ("metrics.podMonitor.enabled=true,metrics.serviceMonitor.enabled=true",
         "metrics.podMonitor.enabled and metrics.serviceMonitor.enabled are both true"),
        ("metrics.enabled=false,monitoring.enabled=true",
         "metrics.enabled is false, but a PodMonitor, ServiceMonitor or the alerts"),
    ],
)  # fmt: skip
def test_a_bad_value_is_refused_by_name(values, error):
    assert error in refused("--set", values)


@pytest.mark.parametrize(
    "values",
    [
        ["--set", "fullnameOverride=rs,serviceAccount.annotations.a=b,observeOnly=true"],
        ["--set", "serviceAccount.create=false,serviceAccount.name=x,rbac.create=false"],
        ["--set", "admissionPolicy.enabled=false,metrics.enabled=false"],
        ["--set", "metrics.serviceMonitor.enabled=true,monitoring.alerts.enabled=true"],
        ["--set", "podSecurityContext.runAsUser=null,priorityClassName=x,podLabels.a=b"],
    ],
    ids=["names", "their-account", "no-policy-no-metrics", "service-monitor", "openshift"],
)
def test_helm_lint_strict_passes(values):
    out = helm("lint", str(CHART), "--strict", *values)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout


@pytest.mark.parametrize(
    "values",
    [
        ["--set", "fullnameOverride=rs,observeOnly=true,serviceAccount.annotations.a=b"],
        ["--set", "metrics.serviceMonitor.enabled=true,monitoring.enabled=true"],
        ["--set", "podSecurityContext.runAsUser=null,priorityClassName=system-cluster-critical",
         "--set", "topologySpreadConstraints[0].maxSkew=1,podLabels.team=ml",
         "--set", "topologySpreadConstraints[0].topologyKey=kubernetes.io/hostname",
         "--set", "topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway"],
    ],
    ids=["names", "service-monitor", "scheduling"],
)  # fmt: skip
def test_the_real_api_server_accepts_the_new_values(dry_run_api, values):
    rendered = helm(
        "template", "raysize", str(CHART), "--namespace", "raysize",
        "--kube-version", DEFAULT_KUBERNETES_VERSION, *values,
    )  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    made = run_kubectl("create", "namespace", "default", kubeconfig=dry_run_api)
    assert made.returncode == 0 or "AlreadyExists" in made.stderr
    applied = subprocess.run(
        [KUBECTL, "apply", "--dry-run=server", "-f", "-"],
        input=rendered.stdout, capture_output=True, text=True, timeout=60,
        env={"HOME": str(dry_run_api.parent), "KUBECONFIG": str(dry_run_api)},
    )  # fmt: skip
    assert applied.returncode == 0, applied.stderr
    assert len(applied.stdout.splitlines()) == len(
        [d for d in yaml.safe_load_all(rendered.stdout) if d]
    )


def test_launch_at_size_is_on_by_default_and_can_be_turned_off():
    """launchAtSize.enabled (default true): the launch-size policy (named after the
    release) and the ConfigMap grant; false: neither, and the worker is told
    (RAYSIZE_LAUNCH_AT_SIZE=false) not to write the ConfigMap."""
    on, off = (
        release("team-b", "ops"),
        release("team-b", "ops", "--set", "launchAtSize.enabled=false"),
    )
    assert {("MutatingAdmissionPolicy", "team-b-raysize-launch-size"),
            ("MutatingAdmissionPolicyBinding", "team-b-raysize-launch-size")} <= names(on)  # fmt: skip
    (binding,) = find(on, "MutatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == "team-b-raysize-launch-size"
    assert binding["spec"]["paramRef"]["name"] == "raysize-launch-sizes"  # what the worker writes
    assert not find(off, "MutatingAdmissionPolicy") and not find(
        off, "MutatingAdmissionPolicyBinding"
    )

    def configmap_rules(docs):
        return [
            r
            for role in find(docs, "Role")
            for r in role["rules"]
            if "configmaps" in r["resources"]
        ]

    assert configmap_rules(on) and not configmap_rules(off)
    (cm_on,) = [c for c in find(on, "ConfigMap")]
    (cm_off,) = [c for c in find(off, "ConfigMap")]
    assert "RAYSIZE_LAUNCH_AT_SIZE" not in cm_on["data"]
    assert cm_off["data"]["RAYSIZE_LAUNCH_AT_SIZE"] == "false"
    assert "launchAtSize" in refused("--set", "launchAtSize.enabled=maybe")
