"""Amounts as integer vectors indexed by resource name (`ResourceIndex`); a shape is
stored sparsely as ((index, amount), ...) because Ray shapes name one to three resources."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from raysize.workflows.model import ClusterSnapshot, Demand, GroupSpec
from raysize.workflows.resources import CPU, MEMORY, Resources

Shape = tuple[tuple[int, int], ...]

GPU = "GPU"


class ResourceIndex:
    """Every resource name one plan deals in, each an index into the vectors; fixed once
    built from the snapshot."""

    def __init__(self, snap: ClusterSnapshot, demands: Iterable[Demand]) -> None:
        names: set[str] = {CPU, MEMORY}
        for g in snap.groups.values():
            names.update(g.resources)
        for p in snap.pods:
            names.update(p.total)
            names.update(p.available)
        for d in demands:
            names.update(d.shape)
        for c in snap.constraints:
            names.update(c.shape)
        for gang in snap.gangs:
            for b in gang.bundles:
                names.update(b)
        self.names = sorted(names)
        self.idx = {n: i for i, n in enumerate(self.names)}
        self.cpu_i = self.idx[CPU]
        self.mem_i = self.idx[MEMORY]
        self.gpu_i = self.idx.get(GPU)
        self.width = len(self.names)
        # reference size per resource, to compare shapes of different kinds
        self.ref = [1] * self.width
        for g in snap.groups.values():
            for i, v in enumerate(self.new_pod_capacity(g)):
                self.ref[i] = max(self.ref[i], v)

    def vec(self, res: Mapping[str, int]) -> list[int]:
        out = [0] * self.width
        for n, v in res.items():
            out[self.idx[n]] = v
        return out

    def shape(self, res: Mapping[str, int]) -> Shape:
        return tuple((self.idx[n], v) for n, v in sorted(res.items()) if v > 0)

    def res(self, shape: Shape) -> Resources:
        return Resources({self.names[i]: a for i, a in shape})

    def size_key(self, shape: Shape) -> tuple[float, Shape]:
        return (-sum(a / self.ref[i] for i, a in shape), shape)

    def new_pod_capacity(self, g: GroupSpec) -> list[int]:
        """A new pod counts at its IPPR maximum: it will be grown once it runs."""
        cap = self.vec(g.resources)
        if g.ippr is not None:
            cap[self.cpu_i] = max(cap[self.cpu_i], g.ippr.max_cpu)
            cap[self.mem_i] = max(cap[self.mem_i], g.ippr.max_memory)
        return cap

    def new_pod_size(self, g: GroupSpec) -> tuple[float, float]:
        """How big a new pod of the group is, to tell groups apart when work fits them
        alike: its size at launch, then at its IPPR maximum (each summed over resources
        relative to the cluster's largest)."""
        return (
            sum(v / self.ref[i] for i, v in enumerate(self.vec(g.resources))),
            sum(v / self.ref[i] for i, v in enumerate(self.new_pod_capacity(g))),
        )

    def special(self, capacity: list[int]) -> frozenset[int]:
        """The resources other than CPU and memory (GPU, …) a capacity has."""
        return frozenset(
            i for i, v in enumerate(capacity) if v and i != self.cpu_i and i != self.mem_i
        )

    def has_gpu(self, capacity: list[int]) -> bool:
        return self.gpu_i is not None and capacity[self.gpu_i] > 0

    def needs_gpu(self, shape: Shape) -> bool:
        return self.gpu_i is not None and any(i == self.gpu_i for i, _ in shape)
