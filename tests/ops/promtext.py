"""A small reader of the Prometheus text format, enough for assertions in tests."""

from __future__ import annotations

import re
from dataclasses import dataclass

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse(text: str) -> list[Sample]:
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        labels = {m["key"]: m["value"] for m in _LABEL.finditer(match["labels"] or "")}
        samples.append(Sample(match["name"], labels, float(match["value"])))
    return samples


def select(samples: list[Sample], name: str, **labels: str) -> list[Sample]:
    return [s for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
