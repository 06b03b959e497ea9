"""Every setting of the raysize worker, from `RAYSIZE_*` environment variables or flags."""

from __future__ import annotations

import importlib.metadata
import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from temporalio.common import WorkerDeploymentVersion

import raysize
from raysize.activities.kube_limits import DEFAULT_BURST, DEFAULT_QPS
from raysize.activities.ray_tokens import FallbackScope
from raysize.activities.targets import KUBE_THREADS
from raysize.workflows.contracts import POLL_INTERVAL_S
from raysize.workflows.model import PlannerSettings, ResizePolicy
from raysize.workflows.resources import CPU, MEMORY, QuantityError, quantity_to_units

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def check_log_level(value: str) -> str:
    """The log level in capitals, or ValueError naming the accepted ones."""
    if value.upper() not in LOG_LEVELS:
        raise ValueError(f"{value!r}: expected one of {', '.join(LOG_LEVELS)}")
    return value.upper()


def check_host_port(value: str, example_port: str) -> None:
    """`host:port`, nothing else: a host alone would be dialled on port 80 (or 443) by
    the gRPC clients, silently; a URL's scheme is not theirs to take."""
    if "://" in value:
        raise ValueError(f"{value!r} is a URL: give host:port, e.g. localhost:{example_port}")
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ValueError(
            f"{value!r} has no port: give host:port, e.g. {value or 'localhost'}:{example_port}"
        )
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r}: the port {port!r} is not a number from 1 to 65535")


# what the Temporal Worker Controller sets on the pods of each version it runs; raysize reads
# them when its own RAYSIZE_DEPLOYMENT_NAME / RAYSIZE_BUILD_ID are not set
CONTROLLER_DEPLOYMENT_NAME = "TEMPORAL_DEPLOYMENT_NAME"
CONTROLLER_BUILD_ID = "TEMPORAL_WORKER_BUILD_ID"
MAX_VERSION_PART = 255  # the server's limit for a deployment name and a build ID


def package_build_id() -> str:
    """The installed package's version (what `pip` sees), else `raysize.__version__`."""
    try:
        return importlib.metadata.version("raysize")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
        return raysize.__version__


def check_version_part(value: str, what: str, example: str) -> str:
    """A deployment name or build ID the server and the SDK take, or ValueError saying
    how to fix it."""
    if not value.strip():
        raise ValueError(f"{what} is empty: give one (e.g. {example}), or unset it")
    if value != value.strip() or any(c.isspace() for c in value):
        raise ValueError(f"{value!r}: {what} may not contain spaces (e.g. {example})")
    if len(value) > MAX_VERSION_PART:
        raise ValueError(f"{what} is {len(value)} characters long: at most {MAX_VERSION_PART}")
    if value.startswith("__"):
        raise ValueError(f"{value!r}: {what} may not start with '__' (reserved by Temporal)")
    return value


CLUSTER_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def check_cluster_name(value: str) -> str:
    """ "" or a DNS label (what a Kubernetes cluster is called in kubeconfigs and fleet
    tools, and safe in a workflow ID and a visibility query), else ValueError saying how."""
    if value and (len(value) > 63 or not CLUSTER_NAME.fullmatch(value)):
        raise ValueError(
            f"{value!r} is not a DNS label: lower-case letters, digits and '-', starting and "
            "ending with a letter or digit, at most 63 characters (e.g. prod-eu1)"
        )
    return value


class Settings(BaseSettings):
    """The worker's configuration. Each field is `RAYSIZE_<NAME>` in the environment."""

    model_config = SettingsConfigDict(env_prefix="RAYSIZE_", extra="ignore")

    # --- Temporal ---
    temporal_address: str = Field("localhost:7233", description="Temporal frontend host:port")
    temporal_namespace: str = Field(
        "default",
        description="Temporal namespace; one that does not exist stops every command, with "
        "the command that creates it",
    )
    cluster_name: str = Field(
        "",
        description="this Kubernetes cluster's name, when several share one Temporal "
        "namespace: it becomes part of the workflow IDs (reconcile/<name>/<ns>/<raycluster>), "
        "the KubeCluster search attribute and the default task queue (raysize-<name>); "
        "a DNS label, e.g. prod-eu1; default: none (one Kubernetes cluster per namespace)",
    )
    task_queue: str = Field(
        "raysize",
        min_length=1,
        description="task queue the worker polls; default: raysize, or raysize-<cluster "
        "name> when RAYSIZE_CLUSTER_NAME is set",
    )
    temporal_tls_cert: Path | None = Field(None, description="client certificate (mTLS)")
    temporal_tls_key: Path | None = Field(None, description="client private key (mTLS)")
    temporal_tls_ca: Path | None = Field(None, description="CA bundle of the server")
    temporal_api_key: str | None = Field(None, description="API key (Temporal Cloud)")
    temporal_api_key_file: Path | None = Field(
        None,
        description="file holding the API key (a mounted Secret): read again when it "
        "changes, so a rotated key is used without a restart",
    )
    temporal_tls: bool = Field(
        False,
        description="TLS to Temporal with the system's CAs, no files needed (the TLS files, "
        "an API key and a server name turn it on too)",
    )
    temporal_tls_server_name: str | None = Field(
        None,
        description="the name the Temporal server's certificate is checked against (and the "
        "TLS SNI), when it is not the host of RAYSIZE_TEMPORAL_ADDRESS",
    )
    temporal_check_s: float = Field(
        5.0,
        gt=0,
        allow_inf_nan=False,
        description="seconds between the worker's looks at its Temporal connection and at "
        "its credential files (RAYSIZE_TEMPORAL_TLS_*, RAYSIZE_TEMPORAL_API_KEY_FILE)",
    )
    register_search_attributes: bool = Field(
        True,
        description="register raysize's search attributes at start when allowed; with false, "
        "a worker that finds them missing stops and prints the command to run",
    )
    deployment_name: str | None = Field(
        None,
        description="Temporal Worker Deployment this worker is a version of (Worker "
        "Versioning); default: $TEMPORAL_DEPLOYMENT_NAME, else unversioned",
    )
    build_id: str | None = Field(
        None,
        description="build ID of this worker's version; default: $TEMPORAL_WORKER_BUILD_ID, "
        "else the package version",
    )
    make_current: Literal["if-none", "always", "never"] = Field(
        "if-none",
        description="when a versioned worker makes its version current: if-none (when the "
        "deployment has no current version, a first install, or when its current version "
        "has had no worker polling for RAYSIZE_TAKEOVER_AFTER_S, a rolling update), always, "
        "never",
    )
    takeover_after_s: float = Field(
        90.0,
        gt=0,
        allow_inf_nan=False,
        description="seconds without a worker polling after which a versioned worker takes "
        "over a build of its deployment (a rolling update replaced it): it makes its own "
        "version current in place of it, and moves that build's running workflows to "
        "itself once their histories replay on its code; keep it above the server's long "
        "poll (60 s on Temporal's default)",
    )
    upgrade_check_s: float = Field(
        15.0,
        gt=0,
        allow_inf_nan=False,
        description="seconds between a versioned worker's looks at whether its version is "
        "current, to move the reconcile loops still on another version to it",
    )

    # --- Kubernetes ---
    kubeconfig: Path | None = Field(
        None, description="kubeconfig file; default: $KUBECONFIG, then in-cluster config"
    )
    namespaces: str = Field(
        "",
        description="comma-separated namespaces to watch; empty: all (needs a ClusterRole: "
        "deploy/components/cluster-wide). A listed namespace raysize cannot act in (missing, "
        "or no raysize Role) gets one WARNING at start; the worker keeps running",
    )
    discover: bool = Field(
        True,
        description="manage every RayCluster with ray.io/ippr (or raysize.io/enabled: "
        '"true", to scale out and in only); false: only clusters started with raysize start',
    )
    discovery_interval_s: float = Field(
        15.0, gt=0, allow_inf_nan=False, description="seconds between discovery rounds"
    )
    # the defaults and the busy worker's measured rate: activities/kube_limits.py
    kube_qps: float = Field(
        DEFAULT_QPS,
        gt=0,
        allow_inf_nan=False,
        description="requests a second the worker sends the Kubernetes API server at most, "
        "as client-go's QPS (a token bucket: each call, and each list or (re)connect of a "
        "watch, takes a token; watch events take none)",
    )
    kube_burst: int = Field(
        DEFAULT_BURST,
        ge=1,
        description="requests the worker may send at once, above RAYSIZE_KUBE_QPS, after a "
        "quiet spell (client-go's burst: the bucket's size)",
    )
    kube_threads: int = Field(
        KUBE_THREADS,
        ge=1,
        le=256,
        description="calls the worker has in flight to the Kubernetes API server at once, "
        "each on a thread (and a pooled connection) of its own; a call waits at most 10 s "
        "for one, then fails unsent. The GCS's and the planner's threads are apart",
    )

    # --- Ray ---
    gcs_address: str | None = Field(
        None,
        description="GCS host:port for every cluster (default: from the RayCluster status, "
        "else <cluster>-head-svc.<namespace>.svc:6379)",
    )
    ray_token: str | None = Field(
        None,
        description="Ray auth token of clusters without one of their own (a cluster's "
        "authOptions Secret or head RAY_AUTH_TOKEN wins; default: $RAY_AUTH_TOKEN / "
        "$RAY_AUTH_TOKEN_PATH), sent only to the clusters RAYSIZE_RAY_TOKEN_FOR names",
    )
    ray_token_for: str = Field(
        "",
        description="where the worker's own Ray token may be sent: a comma-separated list "
        "of namespaces and <namespace>/<raycluster>, or * for every cluster without a "
        "token of its own (one tenant); empty: nowhere (a cluster without its own token "
        "gets none)",
    )

    # --- decisions ---
    tick_s: float = Field(
        300.0,
        gt=0,
        allow_inf_nan=False,
        description="longest wait between two reconciles of a cluster where nothing changes: "
        "a safety net (a change of its pods, its RayCluster or Ray's demands, and the plan's "
        "own deadlines such as an idle pod's expiry, wake it at once)",
    )
    max_concurrent_resizes: int = Field(
        100,
        ge=1,
        description="resize sagas per cluster at once; the rest are held and retried next tick",
    )
    max_concurrent_activities: int = Field(
        2000,
        ge=10,
        description="activities this worker runs at once; every managed cluster holds one "
        "(its wait, mostly asleep), so a fleet needs more than Temporal's default of 100",
    )
    max_concurrent_workflow_tasks: int = Field(
        300,
        ge=2,
        description="workflow tasks this worker runs at once (at most "
        "RAYSIZE_MAX_CACHED_WORKFLOWS); a cluster's loop holds its task through each observe "
        "(a local activity that waits on the API server and Ray). In a 1,000-cluster burst, "
        "Temporal's default of 100 left new resizes' first tasks queued for 100 s behind the "
        "loops' observes, and 1,000 let so many observes run at once that thousands outlived "
        "their task's 10 s timeout and ran again",
    )
    workflow_task_polls: int = Field(
        10,
        ge=2,
        description="workflow-task polls the worker keeps on the task queue (and one more on "
        "its sticky queue); each new resize's first task and every task of a loop whose "
        "worker died wait there",
    )
    max_cached_workflows: int = Field(
        4000,
        ge=100,
        description="workflows this worker keeps in memory between their steps; one evicted "
        "is replayed from its whole history at its next step. Every cluster holds one (its "
        "loop) and one per pod resizing, so a fleet in a burst needs many more than "
        "Temporal's default of 1,000",
    )
    resize_policy: ResizePolicy = Field(
        ResizePolicy.RIGHT_SIZE,
        description="right-size: the smallest step-rounded size that fits what waits; max: "
        "one step to the group's maximum, as Ray's autoscaler does",
    )
    cpu_step: str = Field(
        "1", description="CPU rounding step of a resize target (a positive quantity: 1, 500m)"
    )
    memory_step: str = Field(
        "1Gi", description="memory rounding step of a resize target (a positive quantity)"
    )
    idle_timeout_s: float = Field(
        60.0,
        ge=0,
        allow_inf_nan=False,
        description="idle pods older than this shrink back to their template size, then go; "
        "the RayCluster's idleTimeoutSeconds wins",
    )
    raylet_start_timeout_s: float = Field(
        600.0,
        gt=0,
        allow_inf_nan=False,
        description="a worker pod Kubernetes has run this long (since its status.startTime) "
        "whose Raylet has not registered is removed, and replaced if the minimum or the work "
        "asks; until then it counts as room that is coming",
    )
    observe_only: bool = Field(
        False,
        description="plan, record decisions and say what would be done (Would* Events on "
        "the RayCluster), but write to no pod, Raylet or RayCluster: to run raysize beside "
        "another autoscaler and compare",
    )
    launch_at_size: bool = Field(
        True,
        description="a pod launched for work starts at the size that work needs (written to "
        "the namespace's raysize-launch-sizes ConfigMap, which the raysize-launch-size "
        "admission policy applies as KubeRay creates the pod), so the scheduler places it "
        "where it fits and a node autoscaler sees its real size; false: pods start at their "
        "template's size and grow once they run",
    )
    resize_poll_interval_s: float = Field(
        POLL_INTERVAL_S,
        gt=0,
        allow_inf_nan=False,
        description="seconds of silence from the pod watch after which a resizing pod is "
        "read again (the watch itself wakes a resize at once)",
    )

    # --- telemetry (traces and OTLP metrics: the standard OTEL_EXPORTER_OTLP_* variables) ---
    prometheus_bind: str | None = Field(
        None,
        description="host:port to serve Prometheus metrics on at /metrics (raysize_* and "
        "Temporal SDK metrics), e.g. 0.0.0.0:9464; default: off",
    )
    log_level: str = Field("INFO", description="DEBUG, INFO, WARNING or ERROR")

    @field_validator("log_level")
    @classmethod
    def _log_level(cls, value: str) -> str:
        return check_log_level(value)

    log_format: Literal["text", "json"] = Field(
        "text", description="text: time level logger message key=value; json: one object a line"
    )

    @field_validator("cpu_step", "memory_step")
    @classmethod
    def _quantity(cls, value: str, info: object) -> str:
        name = getattr(info, "field_name", "")
        try:
            units = quantity_to_units(value, CPU if name == "cpu_step" else MEMORY, what=name)
        except QuantityError as exc:
            raise ValueError(str(exc)) from exc
        if units <= 0:
            raise ValueError(f"{name}: {value!r} must be positive")
        return value

    @field_validator("temporal_address", "gcs_address")
    @classmethod
    def _host_port(cls, value: str | None, info: object) -> str | None:
        if value is not None:
            check_host_port(
                value, "7233" if getattr(info, "field_name", "") == "temporal_address" else "6379"
            )
        return value

    @field_validator(
        "temporal_tls_cert",
        "temporal_tls_key",
        "temporal_tls_ca",
        "temporal_api_key_file",
        "kubeconfig",
    )
    @classmethod
    def _readable_file(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"{str(value)!r} is not a file (give the path of an existing file)")
        return value

    @model_validator(mode="before")
    @classmethod
    def _controller_env(cls, data: Any) -> Any:
        # the Temporal Worker Controller names the version in its own variables
        if isinstance(data, dict):
            for field, variable in (
                ("deployment_name", CONTROLLER_DEPLOYMENT_NAME),
                ("build_id", CONTROLLER_BUILD_ID),
            ):
                if data.get(field) is None and os.environ.get(variable):
                    data = {**data, field: os.environ[variable]}
        return data

    @field_validator("deployment_name")
    @classmethod
    def _deployment_name(cls, value: str | None) -> str | None:
        if value is None:
            return None
        check_version_part(value, "the deployment name", "raysize")
        if "." in value:  # the SDK splits "<deployment>.<build ID>" at the first dot
            raise ValueError(
                f"{value!r}: a deployment name may not contain '.' (e.g. raysize or "
                "raysize-prod; the build ID may)"
            )
        return value

    @field_validator("ray_token_for")
    @classmethod
    def _ray_token_for(cls, value: str) -> str:
        FallbackScope.parse(value)  # a ValueError names the entry
        return value

    def ray_token_scope(self) -> FallbackScope:
        return FallbackScope.parse(self.ray_token_for)

    @field_validator("build_id")
    @classmethod
    def _build_id(cls, value: str | None) -> str | None:
        if value is None:
            return None
        return check_version_part(value, "the build ID", "0.2.0 or the image tag")

    def deployment_version(self) -> WorkerDeploymentVersion | None:
        """The Worker Deployment Version this worker runs as, or None: unversioned
        (no deployment name)."""
        if self.deployment_name is None:
            return None
        return WorkerDeploymentVersion(
            deployment_name=self.deployment_name, build_id=self.build_id or package_build_id()
        )

    @field_validator("cluster_name")
    @classmethod
    def _cluster_name(cls, value: str) -> str:
        return check_cluster_name(value)

    @model_validator(mode="after")
    def _cluster_task_queue(self) -> Settings:
        # the activities of a loop must run on a worker of its own Kubernetes cluster: two
        # clusters' workers on one queue would take each other's pod reads and resizes
        if self.cluster_name and "task_queue" not in self.model_fields_set:
            self.task_queue = f"raysize-{self.cluster_name}"
        return self

    @model_validator(mode="after")
    def _tasks_cached(self) -> Settings:
        # a workflow task in flight is of a cached workflow: more tasks than the cache holds
        # would evict the workflows they run
        if self.max_concurrent_workflow_tasks > self.max_cached_workflows:
            raise ValueError(
                f"RAYSIZE_MAX_CONCURRENT_WORKFLOW_TASKS ({self.max_concurrent_workflow_tasks}) "
                f"is above RAYSIZE_MAX_CACHED_WORKFLOWS ({self.max_cached_workflows}): raise "
                "the cache, or lower the tasks to at most the cache"
            )
        return self

    @model_validator(mode="after")
    def _tls_pair(self) -> Settings:
        # half a client certificate would quietly leave the connection in plain text
        if (self.temporal_tls_cert is None) != (self.temporal_tls_key is None):
            given, missing = (
                ("TEMPORAL_TLS_CERT", "TEMPORAL_TLS_KEY")
                if self.temporal_tls_key is None
                else ("TEMPORAL_TLS_KEY", "TEMPORAL_TLS_CERT")
            )
            raise ValueError(
                f"RAYSIZE_{given} is set without RAYSIZE_{missing}: mTLS needs both "
                "(set both, or neither; RAYSIZE_TEMPORAL_TLS_CA alone turns on TLS "
                "without a client certificate)"
            )
        if self.temporal_api_key is not None and self.temporal_api_key_file is not None:
            raise ValueError(
                "RAYSIZE_TEMPORAL_API_KEY and RAYSIZE_TEMPORAL_API_KEY_FILE are both set: set "
                "one (the file is read again when it changes; the variable cannot change)"
            )
        return self

    def planner(self) -> PlannerSettings:
        return PlannerSettings(
            idle_timeout_s=self.idle_timeout_s,
            raylet_start_timeout_s=self.raylet_start_timeout_s,
            resize_policy=self.resize_policy,
            cpu_step=quantity_to_units(self.cpu_step, CPU),
            memory_step=quantity_to_units(self.memory_step, MEMORY),
        )

    def namespace_list(self) -> list[str]:
        return [n.strip() for n in self.namespaces.split(",") if n.strip()]
