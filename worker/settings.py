"""Every setting of the raysize worker, from `RAYSIZE_*` environment variables or flags."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

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


class Settings(BaseSettings):
    """The worker's configuration. Each field is `RAYSIZE_<NAME>` in the environment."""

    model_config = SettingsConfigDict(env_prefix="RAYSIZE_", extra="ignore")

    # --- Temporal ---
    temporal_address: str = Field("localhost:7233", description="Temporal frontend host:port")
    temporal_namespace: str = Field("default", description="Temporal namespace")
    task_queue: str = Field("raysize", min_length=1, description="task queue the worker polls")
    temporal_tls_cert: Path | None = Field(None, description="client certificate (mTLS)")
    temporal_tls_key: Path | None = Field(None, description="client private key (mTLS)")
    temporal_tls_ca: Path | None = Field(None, description="CA bundle of the server")
    temporal_api_key: str | None = Field(None, description="API key (Temporal Cloud)")
    register_search_attributes: bool = Field(
        True, description="register raysize's search attributes at start when allowed"
    )

    # --- Kubernetes ---
    kubeconfig: Path | None = Field(
        None, description="kubeconfig file; default: $KUBECONFIG, then in-cluster config"
    )
    namespaces: str = Field("", description="comma-separated namespaces to watch; empty: all")
    discover: bool = Field(True, description="manage every RayCluster with ray.io/ippr")
    discovery_interval_s: float = Field(
        15.0, gt=0, allow_inf_nan=False, description="seconds between discovery rounds"
    )

    # --- Ray ---
    gcs_address: str | None = Field(
        None,
        description="GCS host:port for every cluster (default: from the RayCluster status, "
        "else <cluster>-head-svc.<namespace>.svc:6379)",
    )
    ray_token: str | None = Field(
        None, description="Ray auth token (default: $RAY_AUTH_TOKEN / $RAY_AUTH_TOKEN_PATH)"
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
    max_concurrent_resizes: int = Field(100, ge=1, description="resize sagas per cluster at once")
    max_concurrent_activities: int = Field(
        2000,
        ge=10,
        description="activities this worker runs at once; every managed cluster holds one "
        "(its wait, mostly asleep), so a fleet needs more than Temporal's default of 100",
    )
    resize_policy: ResizePolicy = Field(ResizePolicy.RIGHT_SIZE, description="right-size or max")
    cpu_step: str = Field("1", description="CPU rounding step of a resize target (quantity)")
    memory_step: str = Field("1Gi", description="memory rounding step (quantity)")
    idle_timeout_s: float = Field(
        60.0, ge=0, allow_inf_nan=False, description="idle pods older than this shrink/go"
    )
    raylet_start_timeout_s: float = Field(
        600.0,
        gt=0,
        allow_inf_nan=False,
        description="a running worker pod whose Raylet has not registered after this long is "
        "replaced",
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

    @field_validator("temporal_tls_cert", "temporal_tls_key", "temporal_tls_ca", "kubeconfig")
    @classmethod
    def _readable_file(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"{str(value)!r} is not a file (give the path of an existing file)")
        return value

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
