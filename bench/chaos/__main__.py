"""`python -m bench.chaos --seeds N [--short] [--first-seed S] [--workdir DIR]`.

Prints every invariant of every seed with its evidence, then
`chaos: <held>/<total> invariants held over <n> seeds`; exits 1 if any failed.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.chaos.config import FULL, SHORT, ChaosConfig
from bench.chaos.invariants import Invariant, judge
from bench.chaos.scenario import run_seed


def log(message: str) -> None:
    print(message, flush=True)


def report(seed: int, invariants: list[Invariant], seconds: float) -> None:
    held = sum(1 for i in invariants if i.held)
    log(f"seed {seed}: {held}/{len(invariants)} invariants held in {seconds:.0f}s")
    for inv in invariants:
        log(f"  [{'held' if inv.held else 'FAILED'}] {inv.name}: {inv.evidence}")


async def run(config: ChaosConfig, seeds: list[int], workdir: Path) -> tuple[int, int]:
    held = total = 0
    for seed in seeds:
        log(
            f"seed {seed}: {config.name} scenario, A {config.workers_a}->{config.scale_down_a_to},"
            f" B {config.workers_b}->{config.workers_b + config.scale_up_b_by},"
            f" workdir {workdir / f'seed-{seed}'}"
        )
        record = await run_seed(config, seed, workdir / f"seed-{seed}", log)
        invariants = judge(record)
        report(seed, invariants, record.seconds)
        held += sum(1 for i in invariants if i.held)
        total += len(invariants)
    return held, total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__)
    parser.add_argument("--seeds", type=int, default=1, help="how many seeds to run (default 1)")
    parser.add_argument("--first-seed", type=int, default=1, help="seeds run from here upwards")
    parser.add_argument("--short", action="store_true", help="the small scenario of `make test`")
    parser.add_argument(
        "--workdir",
        type=Path,
        help="keep logs and databases here (default: a temp dir, removed when all held)",
    )
    args = parser.parse_args(argv)
    config = SHORT if args.short else FULL
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="osac-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    # The twins run in this process: their logs (e.g. a killed worker's dropped request) go to a
    # file, so the output is the run's story and its invariants.
    logging.basicConfig(
        filename=workdir / "twins.log",
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    started = time.monotonic()
    held, total = asyncio.run(run(config, seeds, workdir))
    log(
        f"({time.monotonic() - started:.0f}s, logs in {workdir})"
        if held < total or args.workdir
        else f"({time.monotonic() - started:.0f}s)"
    )
    log(f"chaos: {held}/{total} invariants held over {len(seeds)} seeds")
    if held == total and args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if held == total else 1


if __name__ == "__main__":
    sys.exit(main())
