"""The two bases of raysize's value types: immutable pydantic models.

- `Value`: what crosses Temporal (workflow and activity inputs and results, memos,
  queries, and every model inside one: the planner's settings and its `Plan`): a field a
  newer release added is ignored by an older one, so two versions of the worker side by
  side, or a rollback, never fail on each other's values.
- `StrictValue`: what is built in-process and never crosses the wire (the planner's
  world: `ClusterSnapshot` stays inside the observe activity): a misspelt field is an
  error, not a silent default. tests/workflows/test_wire_values.py keeps the two apart.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Value(BaseModel):
    model_config = ConfigDict(frozen=True)


class StrictValue(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
