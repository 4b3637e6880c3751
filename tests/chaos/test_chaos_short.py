"""The short chaos run of `make test` (issue #8 §1): the chaos harness's small scenario, one seed.

Ten workers over two orders (6 and 4), scaled down to 2 and up to 6, then decommissioned, while the
worker process is SIGKILLed, the Temporal dev server restarts (its SQLite file kept), BMaaS answers
503 to a fifth of the calls with latency spikes, the hub fails a tenth of the worker's writes with
500/409 and cuts its watches, some agents never register and one wipe fails. Every invariant of
`bench.chaos.invariants` must hold; each is printed with its evidence.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos.config import SHORT
from bench.chaos.invariants import judge
from bench.chaos.scenario import run_seed

SEED = 1


@pytest.mark.timeout(900)  # a kill costs up to one activity timeout (60 s) before Temporal retries
async def test_short_chaos_run_holds_every_invariant(tmp_path: Path) -> None:
    assert SHORT.total_kills >= 1 and SHORT.wipe_failures >= 1 and SHORT.temporal_restarts == 1
    record = await run_seed(SHORT, SEED, tmp_path, print)
    invariants = judge(record)
    for inv in invariants:
        print(f"[{'held' if inv.held else 'FAILED'}] {inv.name}: {inv.evidence}")
    failed = [f"{inv.name}: {inv.evidence}" for inv in invariants if not inv.held]
    assert not failed, f"seed {SEED} (logs in {tmp_path}):\n" + "\n".join(failed)
    # The promises were exercised, not met vacuously.
    assert record.kills >= 1 and len(record.wipe_victim_hosts) == 1
    assert len(record.plateaus) == 6 and all(p.reached for p in record.plateaus)
