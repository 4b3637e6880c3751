"""The twins' process runs at the niceness the harness asks for (`--twins-nice`)."""

from __future__ import annotations

import os
from pathlib import Path

from bench.profiles import ZERO
from bench.twins import TwinsProcess


def _thread_niceness(pid: int) -> set[int]:
    """Niceness is per thread on Linux: that of every thread of `pid` (field 19 of its stat)."""
    values = set()
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        fields = stat.read_text().rpartition(")")[2].split()
        values.add(int(fields[16]))  # field 19 overall; fields[0] is field 3 (the state)
    return values


def test_the_twins_and_all_their_threads_run_at_the_niceness_asked_for(tmp_path: Path) -> None:
    twins = TwinsProcess(ZERO, 1, tmp_path / "twins", tmp_path / "twins.log", nice=5)
    twins.start()  # returns once both servers, on threads of their own, answer
    try:
        assert twins.pid is not None
        expected = min(19, os.getpriority(os.PRIO_PROCESS, 0) + 5)
        threads = _thread_niceness(twins.pid)
        assert threads == {expected}, threads
    finally:
        twins.stop()
