"""A workflow that holds a resize saga's ID until told to end (tests/orchestration/
test_scale_in.py): its own module, with nothing but temporalio, so Temporal's workflow
sandbox can import it."""

from __future__ import annotations

from temporalio import workflow


@workflow.defn(name="resize-stand-in")
class Saga:
    """Holds `resize/<ns>/w1` until `end`: the running saga a retarget is sent to."""

    def __init__(self) -> None:
        self.over = False

    @workflow.signal
    def end(self) -> None:
        self.over = True

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: self.over)
