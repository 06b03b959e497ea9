"""Small builders for planner tests: the seed's cluster shape and friends."""

from __future__ import annotations

from typing import Any

from raysize.workflows.model import (
    ClusterSnapshot,
    Demand,
    GroupSpec,
    IpprLimits,
    PlannerSettings,
    PodPhase,
    PodResize,
    PodView,
)
from raysize.workflows.resources import GIB, Resources


def cores(n: float) -> int:
    return round(n * 1000)


def res(cpu: float = 0, mem_gib: float = 0, **others: float) -> Resources:
    return Resources.of(
        cpu=cores(cpu),
        memory=int(mem_gib * GIB),
        **{k: round(v * 10_000) for k, v in others.items()},
    )


def group(
    name: str = "g1",
    cpu: float = 1,
    mem_gib: float = 2,
    *,
    max_cpu: float | None = 4,
    max_mem_gib: float = 8,
    min_workers: int = 0,
    max_workers: int | None = 10,
    labels: dict[str, str] | None = None,
    **others: float,
) -> GroupSpec:
    return GroupSpec(
        name=name,
        resources=res(cpu, mem_gib, **others),
        min_workers=min_workers,
        max_workers=max_workers,
        labels=labels or {"ray.io/node-group": name},
        ippr=None
        if max_cpu is None
        else IpprLimits(
            max_cpu=cores(max_cpu), max_memory=int(max_mem_gib * GIB), resize_timeout_s=60
        ),
    )


def pod(
    name: str,
    g: str = "g1",
    cpu: float = 1,
    mem_gib: float = 2,
    *,
    free_cpu: float | None = None,
    free_mem_gib: float | None = None,
    idle_s: float = 0,
    phase: PodPhase = PodPhase.RUNNING,
    resize: PodResize | None = None,
    suggested_cpu: float | None = None,
    failed: bool = False,
    **kw: Any,
) -> PodView:
    return PodView(
        name=name,
        group=g,
        phase=phase,
        raylet_id=kw.pop("raylet_id", None if phase == PodPhase.PENDING else f"raylet-{name}"),
        total=res(cpu, mem_gib),
        available=res(
            cpu if free_cpu is None else free_cpu, mem_gib if free_mem_gib is None else free_mem_gib
        ),
        idle_s=idle_s,
        resize=resize,
        suggested_max_cpu=None if suggested_cpu is None else cores(suggested_cpu),
        failed=failed,
        **kw,
    )


def head() -> PodView:
    return PodView(
        name="head",
        group="headgroup",
        raylet_id="raylet-head",
        total=res(0, 1),
        available=res(0, 1),
    )


def head_group() -> GroupSpec:
    return GroupSpec(name="headgroup", resources=res(0, 1), is_head=True)


def snapshot(
    groups: list[GroupSpec],
    pods: list[PodView],
    demands: list[tuple[Resources, int]] | None = None,
    **kw: Any,
) -> ClusterSnapshot:
    settings = kw.pop("settings", PlannerSettings())
    return ClusterSnapshot(
        groups={g.name: g for g in [head_group(), *groups]},
        pods=(head(), *pods),
        demands=tuple(Demand(shape=s, count=n) for s, n in (demands or [])),
        settings=settings,
        **kw,
    )
