"""GPU pods are kept for GPU work (Ray's `RAY_scheduler_avoid_gpu_nodes`): each placing
step runs in up to three stages (`gpu_stages`), each a `GpuGate` that says which pods
work may use and which groups it may launch."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import IntEnum

from raysize.workflows.model import PodPhase
from raysize.workflows.planner.bins import Bin
from raysize.workflows.planner.vectors import ResourceIndex


class GpuStage(IntEnum):
    """How far work that needs no GPU may go onto GPU pods (`gpu_stages`)."""

    OWN_PODS = 0  # pods without GPUs only
    SPARE_GPU = 1  # also the spare room of GPU pods, and new pods without GPUs
    ANY_GPU = 2  # anywhere


@dataclass(frozen=True, slots=True)
class GpuGate:
    """Where work may go at one stage."""

    stage: GpuStage
    # GPU work is still waiting after its pick (unknown: assume so); SPARE_GPU asks
    gpu_waiting: bool = True

    def may_use(self, b: Bin, needs_gpu: bool, idle_timeout_s: float) -> bool:
        """May work place on this pod at this stage?"""
        if not b.gpu or needs_gpu or self.stage == GpuStage.ANY_GPU:
            return True
        if self.stage == GpuStage.OWN_PODS:
            return False
        # SPARE_GPU: the spare room of a GPU pod, running, pending (counted empty at its
        # maximum) or launched by this plan (for GPU work, or min_workers), once GPU work
        # has had its pick: Ray too fills the nodes it has, and the GPU node it launches
        # for GPU work, before it buys one (issue #29: CPU pods bought beside the spare
        # CPUs of new GPU pods). While GPU work waits, a GPU pod the plan does not use
        # comes last if it is pending or idle past the timeout: once free it goes (idle
        # removal) and makes room under the group's maximum for a GPU pod that work fits
        p = b.pod
        if p is None:
            return True  # launched by this plan: it stays
        may_go = p.phase != PodPhase.RUNNING or (p.idle_s > 0 and idle_timeout_s <= p.idle_s)
        return not (self.gpu_waiting and may_go and not b.used)

    def may_launch(self, group_has_gpu: bool, needs_gpu: bool) -> bool:
        """May work launch a pod of such a group at this stage?"""
        if needs_gpu or self.stage == GpuStage.ANY_GPU:
            return True
        return self.stage == GpuStage.SPARE_GPU and not group_has_gpu


def gpu_stages(
    index: ResourceIndex, left: Callable[[], bool], gpu_left: Callable[[], bool] = lambda: True
) -> Iterator[GpuGate]:
    """GPU work may go anywhere from the start. Work that needs no GPU goes first to
    pods without GPUs (free room, growth: OWN_PODS); what is left then to the spare
    room of GPU pods and to new pods without GPUs (SPARE_GPU, see `GpuGate.may_use`);
    only what is still `left` to new GPU pods and any GPU pod (ANY_GPU). `gpu_left` is
    asked once OWN_PODS is done."""
    if index.gpu_i is None:  # no GPUs anywhere: one pass with everything allowed
        yield GpuGate(GpuStage.ANY_GPU)
        return
    gpu_waiting = True
    for stage in (GpuStage.OWN_PODS, GpuStage.SPARE_GPU, GpuStage.ANY_GPU):
        if stage != GpuStage.OWN_PODS and not left():
            break
        if stage == GpuStage.SPARE_GPU:
            gpu_waiting = gpu_left()
        yield GpuGate(stage, gpu_waiting)
