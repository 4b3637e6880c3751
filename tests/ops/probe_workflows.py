"""Small workflows for the operations tests (a module of its own so the sandbox can import it)."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contracts.refs import OrderRef
    from workflows.metrics import (
        record_correlation_duration,
        record_order_counts,
        record_provisioning_duration,
    )


class MetricsProbeInput(BaseModel):
    order: OrderRef


@workflow.defn
class MetricsProbeWorkflow:
    """Records each product metric once, waits for a signal (so, with no cache, the next task replays
    the recordings), then records final gauge values."""

    def __init__(self) -> None:
        self._go = False

    @workflow.signal
    def go(self) -> None:
        self._go = True

    @workflow.run
    async def run(self, inp: MetricsProbeInput) -> None:
        record_order_counts(inp.order, desired=3, ready=1, failed=1)
        record_provisioning_duration(inp.order, timedelta(seconds=90))
        record_correlation_duration(inp.order, 42.0)
        await workflow.wait_condition(lambda: self._go)
        record_order_counts(inp.order, desired=3, ready=2, failed=0)


class SecretInput(BaseModel):
    note: str


@workflow.defn
class EchoWorkflow:
    """Carries a recognisable text through its input, an activity and its result."""

    @workflow.run
    async def run(self, inp: SecretInput) -> str:
        shout = await workflow.execute_activity(
            "shout", inp.note, start_to_close_timeout=timedelta(seconds=30), summary="Shout the note"
        )
        return f"echo: {shout}"
