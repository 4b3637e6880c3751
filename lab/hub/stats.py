"""Request counters by user, verb and resource (`GET /lab/v1/stats`).

A benchmark reads them to count the orchestrator's hub calls, leaving out the lab controllers' own.
"""

from __future__ import annotations

from collections import Counter
from enum import StrEnum

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class Verb(StrEnum):
    GET = "get"
    LIST = "list"
    WATCH = "watch"
    CREATE = "create"
    UPDATE = "update"
    PATCH = "patch"
    DELETE = "delete"
    DELETECOLLECTION = "deletecollection"


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class RequestCount(_Model):
    user: str
    verb: Verb
    resource: str  # `plural.group`, or `plural` for core kinds
    subresource: str = ""
    count: int


class WatchDelay(_Model):
    """How long a user's watch events waited in the hub between the write and their stream's send."""

    events: int
    p50_seconds: float
    p99_seconds: float
    max_seconds: float


class StatsReport(_Model):
    total: int  # resource requests (discovery and openapi reads excluded)
    by_user: dict[str, int]
    by_verb: dict[str, int]
    requests: list[RequestCount]
    non_resource: dict[str, int]  # discovery/openapi/version reads, by user
    watch_events: dict[str, int]  # watch events sent, by user
    watch_delay: dict[str, WatchDelay]  # of the events sent live (not replayed), by user


class RequestStats:
    def __init__(self) -> None:
        self._requests: Counter[tuple[str, Verb, str, str]] = Counter()
        self._non_resource: Counter[str] = Counter()
        self._watch_events: Counter[str] = Counter()
        # Per user, delays in whole milliseconds: bounded memory however long the hub runs.
        self._watch_delays: dict[str, Counter[int]] = {}

    def record(self, user: str, verb: Verb, resource: str, subresource: str = "") -> None:
        self._requests[(user, verb, resource, subresource)] += 1

    def record_non_resource(self, user: str) -> None:
        self._non_resource[user] += 1

    def record_watch_event(self, user: str, delay: float | None = None) -> None:
        self._watch_events[user] += 1
        if delay is not None:
            self._watch_delays.setdefault(user, Counter())[round(delay * 1000)] += 1

    def reset(self) -> None:
        self._requests.clear()
        self._non_resource.clear()
        self._watch_events.clear()
        self._watch_delays.clear()

    def report(self, exclude_users: frozenset[str] = frozenset()) -> StatsReport:
        by_user: Counter[str] = Counter()
        by_verb: Counter[str] = Counter()
        rows: list[RequestCount] = []
        for (user, verb, resource, subresource), count in sorted(self._requests.items()):
            if user in exclude_users:
                continue
            by_user[user] += count
            by_verb[str(verb)] += count
            rows.append(
                RequestCount(user=user, verb=verb, resource=resource, subresource=subresource, count=count)
            )
        return StatsReport(
            total=sum(by_user.values()),
            by_user=dict(by_user),
            by_verb=dict(by_verb),
            requests=rows,
            non_resource={u: n for u, n in self._non_resource.items() if u not in exclude_users},
            watch_events={u: n for u, n in self._watch_events.items() if u not in exclude_users},
            watch_delay={
                u: _delay(ms) for u, ms in self._watch_delays.items() if u not in exclude_users and ms
            },
        )


def _delay(by_ms: Counter[int]) -> WatchDelay:
    ordered = sorted(by_ms.items())
    total = sum(by_ms.values())

    def percentile(q: float) -> float:
        rank, seen = max(1, round(q * total)), 0
        for ms, count in ordered:
            seen += count
            if seen >= rank:
                return ms / 1000
        return ordered[-1][0] / 1000

    return WatchDelay(
        events=total,
        p50_seconds=percentile(0.5),
        p99_seconds=percentile(0.99),
        max_seconds=ordered[-1][0] / 1000,
    )
