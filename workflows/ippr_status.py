"""The `ray.io/ippr-status` pod annotation: the per-pod resize record raysize shares with
Ray's own autoscaler, in Ray's field names and units."""

from __future__ import annotations

import json

from raysize.workflows.resources import CPU, float_to_units, units_to_float
from raysize.workflows.values import Value

IPPR_STATUS_ANNOTATION = "ray.io/ippr-status"


class IpprStatus(Value):
    """Per-pod resize record, in Ray's field names, shared with Ray's own autoscaler."""

    raylet_id: str | None = None
    resizing_at: int | None = None
    suggested_max_cpu: int | None = None  # millicores
    suggested_max_memory: int | None = None  # bytes
    last_failed_at: int | None = None
    last_failed_reason: str | None = None

    @classmethod
    def from_annotation(cls, raw: str | None) -> IpprStatus:
        """Read Ray's JSON; unreadable or missing fields are treated as unset."""
        if not raw:
            return cls()
        try:
            doc = json.loads(raw)
        except json.JSONDecodeError:
            return cls()
        if not isinstance(doc, dict):
            return cls()

        def num(key: str) -> float | None:
            v = doc.get(key)
            if isinstance(v, bool) or not isinstance(v, int | float):
                return None
            return v

        def text(key: str) -> str | None:
            v = doc.get(key)
            return v if isinstance(v, str) else None

        cpu = num("suggested-max-cpu")
        mem = num("suggested-max-memory")
        at = num("resizing-at")
        failed_at = num("last-failed-at")
        return cls(
            raylet_id=text("raylet-id"),
            resizing_at=int(at) if at is not None else None,
            suggested_max_cpu=float_to_units(cpu, CPU) if cpu is not None and cpu >= 0 else None,
            suggested_max_memory=int(mem) if mem is not None and mem >= 0 else None,
            last_failed_at=int(failed_at) if failed_at is not None else None,
            last_failed_reason=text("last-failed-reason"),
        )

    def to_annotation(self) -> str:
        """Ray's JSON: CPU in cores (float), memory in bytes, times in Unix seconds."""
        return json.dumps(
            {
                "raylet-id": self.raylet_id,
                "resizing-at": self.resizing_at,
                "suggested-max-cpu": (
                    units_to_float(self.suggested_max_cpu, CPU)
                    if self.suggested_max_cpu is not None
                    else None
                ),
                "suggested-max-memory": self.suggested_max_memory,
                "last-failed-at": self.last_failed_at,
                "last-failed-reason": self.last_failed_reason,
            }
        )
