"""The twin's audit log (`/lab/v1/audit`) and request counters (`/lab/v1/stats`).

The audit log is what lets a test prove the two promises BMaaS makes: a host never serves two live
BMIs, and a host never returns to the pool without a finished wipe. `find_violations()` checks both.

Audit answer: `{"records": [record, ...], "last_seq": n}`, a record being
`{"seq", "time", "kind", "host_id", "bmi_id", "bmi_name", "user_data_bytes", "detail"}` (null fields left
out). `seq` increases by one per record. User data is only ever recorded as its size.

Stats answer: `{"total": n, "requests": {"<METHOD> <route template>": n, ...}, "watchers": n}`, counting
every request to the BMaaS API (`/api/...`) whatever its outcome (401s and injected 503s included), lab
routes not; `watchers` is the number of open `events/watch` streams.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel

from lab.fulfillment.models import utcnow


class AuditKind(StrEnum):
    HOST_ADDED = "HOST_ADDED"
    HOST_ALLOCATED = "HOST_ALLOCATED"
    ALLOCATION_FAILED = "ALLOCATION_FAILED"  # no free matching host
    HOST_BOOTED = "HOST_BOOTED"
    PROVISIONING_FAILED = "PROVISIONING_FAILED"  # host allocated, but the BMI ended FAILED
    WIPE_STARTED = "WIPE_STARTED"
    WIPE_FINISHED = "WIPE_FINISHED"
    WIPE_FAILED = "WIPE_FAILED"
    HOST_RELEASED = "HOST_RELEASED"
    HOST_QUARANTINED = "HOST_QUARANTINED"


class AuditRecord(BaseModel):
    seq: int
    time: datetime
    kind: AuditKind
    host_id: str | None = None
    bmi_id: str | None = None
    bmi_name: str | None = None
    user_data_bytes: int | None = None
    detail: str | None = None


class AuditLog:
    def __init__(self) -> None:
        self._records: list[AuditRecord] = []

    def record(
        self,
        kind: AuditKind,
        *,
        host_id: str | None = None,
        bmi_id: str | None = None,
        bmi_name: str | None = None,
        user_data_bytes: int | None = None,
        detail: str | None = None,
    ) -> AuditRecord:
        entry = AuditRecord(
            seq=len(self._records) + 1,
            time=utcnow(),
            kind=kind,
            host_id=host_id,
            bmi_id=bmi_id,
            bmi_name=bmi_name,
            user_data_bytes=user_data_bytes,
            detail=detail,
        )
        self._records.append(entry)
        return entry

    def records(
        self,
        *,
        since: int = 0,
        kind: AuditKind | None = None,
        host_id: str | None = None,
        bmi_id: str | None = None,
    ) -> list[AuditRecord]:
        return [
            r
            for r in self._records[since:]
            if (kind is None or r.kind == kind)
            and (host_id is None or r.host_id == host_id)
            and (bmi_id is None or r.bmi_id == bmi_id)
        ]

    @property
    def last_seq(self) -> int:
        return len(self._records)


def find_violations(records: list[AuditRecord]) -> list[str]:
    """Replay the host events in order; describe every double allocation or unwiped reuse."""
    holder: dict[str, str] = {}  # host -> BMI holding it
    wiped: dict[str, bool] = {}  # host -> its last wipe since allocation finished
    quarantined: set[str] = set()
    hosts_of_bmi: dict[str, str] = {}
    problems: list[str] = []
    for r in sorted(records, key=lambda rec: rec.seq):
        host, bmi = r.host_id, r.bmi_id or "?"
        if host is None:
            continue
        if r.kind == AuditKind.HOST_ALLOCATED:
            if host in quarantined:
                problems.append(f"#{r.seq}: quarantined host {host} allocated to {bmi}")
            if host in holder:
                problems.append(f"#{r.seq}: host {host} allocated to {bmi} while held by {holder[host]}")
            if bmi in hosts_of_bmi:
                problems.append(f"#{r.seq}: BMI {bmi} got a second host {host}")
            holder[host], wiped[host], hosts_of_bmi[bmi] = bmi, False, host
        elif r.kind == AuditKind.WIPE_STARTED:
            if host not in holder:
                problems.append(f"#{r.seq}: wipe of host {host} that nobody holds")
            wiped[host] = False
        elif r.kind == AuditKind.WIPE_FINISHED:
            wiped[host] = True
        elif r.kind == AuditKind.HOST_QUARANTINED:
            quarantined.add(host)
        elif r.kind == AuditKind.HOST_RELEASED:
            if not wiped.get(host, False):
                problems.append(f"#{r.seq}: host {host} released without a finished wipe")
            if host in quarantined:
                problems.append(f"#{r.seq}: quarantined host {host} released")
            holder.pop(host, None)
    return problems


class RequestStats:
    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._in_flight: Counter[str] = Counter()  # received and not yet answered (or given up)

    def count(self, method: str, route: str) -> None:
        self._counts[f"{method} {route}"] += 1

    @contextmanager
    def handling(self, method: str, route: str) -> Iterator[None]:
        key = f"{method} {route}"
        self._in_flight[key] += 1
        try:
            yield
        finally:
            self._in_flight[key] -= 1

    def snapshot(self) -> dict[str, object]:
        return {
            "total": sum(self._counts.values()),
            "requests": dict(sorted(self._counts.items())),
            "in_flight": {key: n for key, n in sorted(self._in_flight.items()) if n},
        }

    def reset(self) -> None:
        self._counts.clear()
