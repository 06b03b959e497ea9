"""The two bases of raysize's value types: immutable pydantic models.

- `Value`: what crosses Temporal (workflow and activity inputs and results, memos): a
  field a newer release added is ignored by an older one, so an upgrade never stops a
  running workflow from decoding its history.
- `StrictValue`: what is built in-process (the planner's world): a misspelt field is an
  error, not a silent default.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Value(BaseModel):
    model_config = ConfigDict(frozen=True)


class StrictValue(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
