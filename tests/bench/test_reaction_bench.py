"""How the reaction benchmark finds the step that resized the Raylet in a saga's history."""

from __future__ import annotations

from temporalio.api.common.v1 import Payloads
from temporalio.contrib.pydantic import pydantic_data_converter

from bench.reaction_bench import brought_the_raylet_up
from raysize.workflows.contracts import (
    Act,
    ApplyResizeResult,
    FinishResizeResult,
    ProgressState,
    ResizeProgress,
)


def payloads(value: object) -> Payloads:
    """`value` as the worker's data converter puts it in the history."""
    return Payloads(payloads=[pydantic_data_converter.payload_converter.to_payload(value)])


def test_the_raylet_was_resized_by_finish_resize_or_by_an_apply_that_finished() -> None:
    done = ResizeProgress(state=ProgressState.DONE)
    finished = ApplyResizeResult(
        generation=2, progress=done, finished=FinishResizeResult(cpu=4000, memory=1)
    )
    assert brought_the_raylet_up(Act.APPLY_RESIZE, payloads(finished))
    left = ApplyResizeResult(generation=2, progress=done)  # the saga's finish_resize does it
    assert not brought_the_raylet_up(Act.APPLY_RESIZE, payloads(left))
    assert brought_the_raylet_up(Act.FINISH_RESIZE, payloads(FinishResizeResult(cpu=1, memory=1)))
    assert not brought_the_raylet_up(Act.OBSERVE, payloads(None))
