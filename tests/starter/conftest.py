"""Each test module of the starter gets a stack of its own and a controller running against it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.starter.harness import RunningController, start_controller
from tests.workflows.stack import Stack, running_stack


@pytest.fixture(scope="module")
async def stack(
    temporal_env: WorkflowEnvironment,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> AsyncIterator[Stack]:
    name = request.module.__name__.rsplit(".", 1)[-1]
    async with running_stack(temporal_env.client, tmp_path_factory.mktemp(name)) as running:
        yield running


@pytest.fixture(scope="module")
async def ctl(stack: Stack) -> AsyncIterator[RunningController]:
    running = await start_controller(stack)
    try:
        yield running
    finally:
        await running.stop()
