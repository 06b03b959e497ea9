"""Values that cross Temporal tolerate fields they do not know.

Two versions of the worker run side by side during an upgrade, and a rollback runs the
older one on what the newer wrote: a field one release adds must never fail the other's
decoding (pydantic's `extra="forbid"` would). Every model reachable from a workflow's or
an activity's input, result, signal or query is checked, and a payload with new fields at
every level is decoded by the worker's own data converter.
"""

from __future__ import annotations

import inspect
import json
import typing
from collections.abc import Iterator

from pydantic import BaseModel
from temporalio import activity, workflow
from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import pydantic_data_converter

from raysize.activities.cluster import ClusterActivities
from raysize.activities.discovery import DiscoveryActivities
from raysize.activities.k8s_activities import K8sActivities
from raysize.workflows.contracts import ReconcileInput, Tick
from raysize.workflows.discovery_workflow import DiscoveryWorkflow
from raysize.workflows.reconcile_workflow import ReconcileWorkflow
from raysize.workflows.resize_workflow import PodResizeWorkflow

WORKFLOWS = (ReconcileWorkflow, PodResizeWorkflow, DiscoveryWorkflow)
ACTIVITY_CLASSES = (ClusterActivities, K8sActivities, DiscoveryActivities)


def _signatures() -> Iterator[object]:
    for cls in WORKFLOWS:
        defn = workflow._Definition.must_from_class(cls)
        yield from typing.get_type_hints(defn.run_fn).values()
        for handler in (*defn.signals.values(), *defn.queries.values()):
            if handler.fn is not None:
                yield from typing.get_type_hints(handler.fn).values()
    for cls in ACTIVITY_CLASSES:
        for _, fn in inspect.getmembers(cls, inspect.isfunction):
            defn = activity._Definition.from_callable(fn)
            if defn is not None:
                yield from defn.arg_types or ()
                yield defn.ret_type


def _models(tp: object, seen: set[type[BaseModel]]) -> None:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        if tp in seen:
            return
        seen.add(tp)
        for f in tp.model_fields.values():
            _models(f.annotation, seen)
        return
    for arg in typing.get_args(tp):
        _models(arg, seen)


def wire_models() -> set[type[BaseModel]]:
    seen: set[type[BaseModel]] = set()
    for tp in _signatures():
        _models(tp, seen)
    return seen


def test_the_walk_finds_the_values_that_cross_the_wire() -> None:
    names = {m.__name__ for m in wire_models()}
    # inputs, results and what is inside them: the plan, the planner's settings
    assert {"ReconcileInput", "Tick", "Plan", "ResizeAction", "PlannerSettings"} <= names
    assert {"ResizeRequest", "ReconcileStatus", "Memory", "DrainedPod", "ScaleInput"} <= names
    # the snapshot stays inside the observe activity
    assert "ClusterSnapshot" not in names and "PodView" not in names


def test_no_value_on_the_wire_forbids_a_field_it_does_not_know() -> None:
    strict = sorted(m.__name__ for m in wire_models() if m.model_config.get("extra") == "forbid")
    assert strict == [], f"{strict}: make them `Value` (workflows/values.py), not `StrictValue`"


def _decode(tp: type[BaseModel], doc: dict[str, object]) -> BaseModel:
    payload = Payload(metadata={"encoding": b"json/plain"}, data=json.dumps(doc).encode())
    (value,) = pydantic_data_converter.payload_converter.from_payloads([payload], [tp])
    assert isinstance(value, tp)
    return value


def test_a_newer_releases_fields_are_ignored_at_every_level() -> None:
    new = {"added_in_a_later_release": 1}
    inp = _decode(
        ReconcileInput,
        {
            "namespace": "ns",
            "cluster": "c",
            **new,
            "settings": {"idle_timeout_s": 30, **new},
            "carry": {"ticks": 3, **new, "memory": {"drift_since": {"w1": 1.0}, **new}},
        },
    )
    assert isinstance(inp, ReconcileInput)
    assert inp.settings.idle_timeout_s == 30 and inp.carry.memory.drift_since == {"w1": 1.0}
    tick = _decode(
        Tick,
        {
            **new,
            "plan": {
                **new,
                "resize": [
                    {
                        "pod": "w1",
                        "group": "g1",
                        "cpu": 2000,
                        "memory": 1,
                        "from_cpu": 1000,
                        "from_memory": 1,
                        "reason": "r",
                        **new,
                    }
                ],
            },
            "refs": {"w1": {"group": "g1", **new}},
        },
    )
    assert isinstance(tick, Tick) and tick.plan is not None
    assert tick.plan.resize[0].cpu == 2000 and tick.refs["w1"].group == "g1"
