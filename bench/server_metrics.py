"""What the Temporal server did for a phase: its own request counters, read from its `/metrics`.

CPU seconds say how much the server worked; these say for what. `service_requests` counts the
requests each service (frontend, history, matching) answered by operation, `persistence_requests`
the database operations behind them. A phase's figures are the difference of two scrapes, so they
count everyone who talked to the server meanwhile: in the bench that is the worker under test (the
harness only starts and updates the orders it drives, a few requests per order).
"""

from __future__ import annotations

import asyncio
import re
from collections import defaultdict

import httpx

# One sample line of the text format: name{labels} value. The server's labels never hold quotes or
# braces of their own, so a regex reads them.
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')
COUNTERS = ("service_requests", "persistence_requests")
# The server's metrics library publishes its counters on an interval, so the last second of a phase
# shows up a moment after it ends.
REPORT_LAG_S = 3.0


def parse(text: str) -> dict[str, float]:
    """`service_requests` as `<service>/<operation>` and `persistence_requests` as
    `persistence/<operation>`, summed over the other labels (namespace, task queue kind)."""
    out: defaultdict[str, float] = defaultdict(float)
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or match["name"] not in COUNTERS:
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        operation = labels.get("operation", "?")
        where = labels.get("service_name", "?") if match["name"] == "service_requests" else "persistence"
        out[f"{where}/{operation}"] += float(match["value"])
    return dict(out)


async def scrape(url: str | None, *, settle: bool = False) -> dict[str, float]:
    """The counters now (empty without a metrics endpoint, so a phase's figures are then empty);
    `settle` for the scrape that ends a phase, once what it did has been published."""
    if url is None:
        return {}
    if settle:
        await asyncio.sleep(REPORT_LAG_S)
    async with httpx.AsyncClient(timeout=30.0) as http:
        response = await http.get(url)
        response.raise_for_status()
    return parse(response.text)


def per_unit(
    before: dict[str, float], after: dict[str, float], units: int, top: int = 60
) -> dict[str, float]:
    """The phase's requests per worker (or per baseline workflow), largest first: the `top` operations
    and the totals per service, so the big costs read at a glance."""
    delta = {k: v - before.get(k, 0.0) for k, v in after.items() if v > before.get(k, 0.0)}
    totals: defaultdict[str, float] = defaultdict(float)
    for key, value in delta.items():
        totals[f"{key.split('/', 1)[0]}/total"] += value
    largest = sorted(delta.items(), key=lambda kv: -kv[1])[:top]
    out = {k: round(v / units, 2) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}
    out.update({k: round(v / units, 2) for k, v in largest})
    return out
