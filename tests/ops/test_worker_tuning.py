"""The workflow worker's capacity options come from the settings and are ones the SDK's Worker takes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tests.ops.probe_workflows import EchoWorkflow
from worker.settings import Settings


async def test_the_tuning_is_read_from_the_environment_and_taken_by_the_worker(
    temporal_env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OSAC_STICKY_QUEUE_TIMEOUT_SECONDS", "45")
    monkeypatch.setenv("OSAC_MAX_CACHED_WORKFLOWS", "7")
    tuning = Settings().workflow_worker_tuning()
    assert tuning["sticky_queue_schedule_to_start_timeout"] == timedelta(seconds=45)
    assert tuning["max_cached_workflows"] == 7
    worker = Worker(temporal_env.client, task_queue="tuning-probe", workflows=[EchoWorkflow], **tuning)
    config = worker.config()
    for option, value in tuning.items():
        assert config[option] == value  # type: ignore[literal-required]
    monkeypatch.setenv("OSAC_STICKY_QUEUE_TIMEOUT_SECONDS", "0")
    with pytest.raises(ValueError, match="sticky_queue_timeout_seconds"):
        Settings()
