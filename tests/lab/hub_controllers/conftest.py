"""Fixtures: one hub twin with the hub controllers (zero timings) for the whole session, a fresh
namespace per test, and agent faults that are cleared after the test that set them."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from lab.hub_controllers.faults import AgentFaults
from lab.hub_controllers.testing import Lab, start_lab
from lab.hub_controllers.timings import AgentTimings


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    running = start_lab(tmp_path_factory.mktemp("hub"), AgentTimings.zero())
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def faults(lab: Lab) -> Iterator[Callable[[AgentFaults], None]]:
    """Set agent faults for one test; they are cleared afterwards whatever happens."""
    try:
        yield lab.set_faults
    finally:
        lab.reset_faults()


@pytest.fixture
def ns(lab: Lab) -> str:
    return lab.new_namespace()
