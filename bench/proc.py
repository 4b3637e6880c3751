"""Resident memory and CPU seconds of a process, read from /proc (Linux), and the machine's facts."""

from __future__ import annotations

import contextlib
import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcSample:
    rss_mb: float
    cpu_s: float  # user + system


def sample(pids: Sequence[int]) -> ProcSample:
    """Summed over `pids`: the worker may run as two processes (`OSAC_WORKER_ROLE`)."""
    return ProcSample(rss_mb=sum(_rss_mb(p) for p in pids), cpu_s=sum(_cpu_seconds(p) for p in pids))


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _cpu_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    # The command name (field 2) may hold spaces: split after its closing parenthesis.
    fields = stat[stat.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / _CLOCK_TICKS


def children_named(name: str, parent: int | None = None) -> list[int]:
    """Pids of the direct children of `parent` (default: this process) whose command is `name`."""
    parent = os.getpid() if parent is None else parent
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        if ppid == parent and comm == name:
            found.append(int(entry.name))
    return found


def cpu_or_zero(*pids: int | None) -> float:
    """CPU seconds summed over `pids`; a process gone (or None) counts 0."""
    total = 0.0
    for pid in pids:
        if pid is not None:
            with contextlib.suppress(OSError):
                total += _cpu_seconds(pid)
    return total


def machine() -> dict[str, object]:
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    total_kb = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal:"))
    model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    load1, load5, _ = os.getloadavg()
    return {
        "cores": os.cpu_count() or 0,
        "usable_cores": len(os.sched_getaffinity(0)),
        "memory_mb": round(total_kb / 1024),
        "cpu_model": model,
        "kernel": platform.release(),
        "arch": platform.machine(),
        "load_avg_at_start": [round(load1, 2), round(load5, 2)],
    }
