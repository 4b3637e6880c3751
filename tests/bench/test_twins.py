"""The twins' process runs at the niceness the harness asks for (`--twins-nice`)."""

from __future__ import annotations

import os
from pathlib import Path

from bench.profiles import ZERO
from bench.twins import TwinsProcess


def test_the_twins_run_at_the_niceness_asked_for(tmp_path: Path) -> None:
    twins = TwinsProcess(ZERO, 1, tmp_path / "twins", tmp_path / "twins.log", nice=5)
    twins.start()
    try:
        assert twins.pid is not None
        assert os.getpriority(os.PRIO_PROCESS, twins.pid) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 5)
    finally:
        twins.stop()
