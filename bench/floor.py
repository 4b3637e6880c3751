"""Temporal's own floor: N trivial workflows, each running K trivial activities one after the other.

K is the number of activities a worker lifecycle really ran (counted from the lifecycle histories),
so the floor does the same number of Temporal round trips with none of our logic or backends. The
floor's worker is a process of its own (`python -m bench.floor --task-queue Q`), like ours, with the
same data converter and the default workflow sandbox.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import time
import uuid
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

# Passed through: the sandbox re-imports this module for every workflow instance, and importing the
# worker's settings (pydantic-settings) afresh each time made the baseline itself CPU-bound.
with workflow.unsafe.imports_passed_through():
    from worker.settings import Settings


@activity.defn
async def trivial(step: int) -> int:
    return step + 1


@workflow.defn
class TrivialWorkflow:
    @workflow.run
    async def run(self, activities: int) -> int:
        done = 0
        for step in range(activities):
            done = await workflow.execute_activity(
                trivial, step, start_to_close_timeout=timedelta(seconds=60)
            )
        return done


async def serve(address: str, namespace: str, task_queue: str) -> None:
    client = await Client.connect(address, namespace=namespace, data_converter=pydantic_data_converter)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[TrivialWorkflow],
        activities=[trivial],
        # Tuned as our worker is by default. With the SDK's own defaults (100 workflow tasks at
        # once) 500 trivial workflows at once drove this worker past its task timeouts too.
        **Settings.model_construct().workflow_worker_tuning(),  # the defaults, not the environment
        graceful_shutdown_timeout=timedelta(seconds=1),
    ):
        await stop.wait()


async def run_floor(client: Client, task_queue: str, workflows: int, activities: int) -> float:
    """Start `workflows` trivial workflows at once and wait for all; the wall time in seconds."""
    prefix = f"floor-{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    handles = await asyncio.gather(
        *(
            client.start_workflow(TrivialWorkflow.run, activities, id=f"{prefix}-{i}", task_queue=task_queue)
            for i in range(workflows)
        )
    )
    await asyncio.gather(*(h.result() for h in handles))
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The floor baseline's worker process.")
    parser.add_argument("--address", required=True)
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--task-queue", required=True)
    args = parser.parse_args(argv)
    asyncio.run(serve(args.address, args.namespace, args.task_queue))


if __name__ == "__main__":
    main()
