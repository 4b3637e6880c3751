"""The Agent watches behind watch_agent_for_macs: background waits in the worker process, each
ending in one `agent_registered` signal to the worker workflow that asked for it.

A worker waiting for its Agent waits on a durable workflow timer (so a time-skipping server can
skip the 30-minute registration timeout, and no activity slot or heartbeat is held for it); the
watch is how it hears of the Agent early. A watch lives only in this process: the workflow renews
it every `agent_watch_renewal`, which also covers a restart of this process.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from contracts.hub import AgentMatch, HubErrorType, WatchAgentInput
from contracts.worker import FailureReason
from contracts.workflows import AgentRegistered

log = logging.getLogger(__name__)

AGENT_REGISTERED_SIGNAL = "agent_registered"
MAX_SIGNAL_BACKOFF = 30.0


class AgentWatches:
    """At most one watch per worker workflow: a renewal for the same BMI keeps the running watch,
    a watch for a new attempt's BMI replaces the old one."""

    def __init__(self) -> None:
        self._running: dict[str, tuple[str, asyncio.Task[None]]] = {}

    def watch(
        self, input: WatchAgentInput, client: Client, wait: Callable[[], Awaitable[AgentMatch]]
    ) -> None:
        current = self._running.get(input.worker_workflow_id)
        if current is not None:
            bmi_id, task = current
            if bmi_id == input.bmi_id and not task.done():
                return
            task.cancel()
        task = asyncio.create_task(
            self._run(input, client, wait), name=f"agent watch for {input.worker_workflow_id}"
        )
        self._running[input.worker_workflow_id] = (input.bmi_id, task)
        task.add_done_callback(lambda done: self._forget(input.worker_workflow_id, done))

    async def aclose(self) -> None:
        tasks = [task for _, task in self._running.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _forget(self, workflow_id: str, done: asyncio.Task[None]) -> None:
        current = self._running.get(workflow_id)
        if current is not None and current[1] is done:
            del self._running[workflow_id]

    async def _run(
        self, input: WatchAgentInput, client: Client, wait: Callable[[], Awaitable[AgentMatch]]
    ) -> None:
        try:
            match = await wait()
            report = AgentRegistered(bmi_id=input.bmi_id, match=match)
        except ApplicationError as err:
            if err.type != HubErrorType.AMBIGUOUS_AGENT_MATCH:
                return  # the deadline passed: the worker's own timer decides, not this watch
            report = AgentRegistered(
                bmi_id=input.bmi_id,
                failure_reason=FailureReason.AMBIGUOUS_AGENT_MATCH,
                failure_message=err.message,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the worker renews its watch: log and let the renewal retry
            log.warning("agent watch for %s stopped: %s", input.worker_workflow_id, type(exc).__name__)
            return
        await self._signal(client, input, report)

    @staticmethod
    async def _signal(client: Client, input: WatchAgentInput, report: AgentRegistered) -> None:
        """Deliver the report, retrying an unreachable Temporal until the registration deadline (then
        the worker has timed out on its own and the news is moot)."""
        handle = client.get_workflow_handle(input.worker_workflow_id)
        delay = 0.5
        while True:
            try:
                await handle.signal(AGENT_REGISTERED_SIGNAL, report)
                return
            except RPCError as err:
                if err.status == RPCStatusCode.NOT_FOUND:
                    return  # the worker has finished: nobody to tell
                if datetime.now(UTC) >= input.deadline:
                    log.warning(
                        "could not tell %s about its Agent before the deadline: %s",
                        input.worker_workflow_id,
                        err.status.name if err.status else "error",
                    )
                    return
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_SIGNAL_BACKOFF)
