"""Resident memory and CPU seconds of a process, read from /proc (Linux), and the machine's facts."""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcSample:
    rss_mb: float
    cpu_s: float  # user + system, of the process and its descendants alive now


def sample(pid: int) -> ProcSample:
    """The process with its descendants, so a worker that runs as several processes (a workflow one
    and an activity one under a launcher) is measured whole."""
    pids = tree(pid)
    return ProcSample(rss_mb=_summed(pids, _rss_mb), cpu_s=_summed(pids, _cpu_seconds))


def _summed(pids: list[int], read: Callable[[int], float]) -> float:
    """Sum over a tree whose root is `pids[0]`: a descendant gone since the listing counts 0."""
    total = 0.0
    for pid in pids:
        try:
            total += read(pid)
        except OSError:
            if pid == pids[0]:
                raise
    return total


def _stat_fields(pid: int) -> list[str]:
    stat = Path(f"/proc/{pid}/stat").read_text()
    # The command name (field 2) may hold spaces: split after its closing parenthesis.
    return stat[stat.rindex(")") + 2 :].split()


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _cpu_seconds(pid: int) -> float:
    fields = _stat_fields(pid)
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / _CLOCK_TICKS


def tree(pid: int) -> list[int]:
    """`pid` and its descendants alive now."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int(_stat_fields(int(entry.name))[1])
        except (OSError, ValueError, IndexError):
            continue  # gone while listing
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


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


def cpu_or_zero(pid: int | None) -> float:
    """CPU seconds of the process and its descendants; 0 once it is gone."""
    if pid is None:
        return 0.0
    try:
        return _summed(tree(pid), _cpu_seconds)
    except OSError:
        return 0.0


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
