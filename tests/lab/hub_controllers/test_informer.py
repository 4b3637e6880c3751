"""The informer's list/watch contract, against a scripted API: resume, re-list on 410 and on
disconnect, and the re-list replayed as events so controllers never miss a deletion."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import httpx

from lab.hub_controllers.informer import Informer
from lab.hub_controllers.kube import ApiError, KubeApi, WatchEvent, WatchEventType
from lab.hub_controllers.resources import AGENTS


def _obj(name: str, rv: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv)}}


class ScriptedApi:
    """Lists answer from `lists` in turn; each watch call plays the next script, then hangs."""

    def __init__(self, lists: list[tuple[list[dict[str, Any]], str]], watches: list[list[Any]]) -> None:
        self.lists, self.watches = lists, watches
        self.watch_from: list[str] = []

    async def list(self, res: Any) -> tuple[list[dict[str, Any]], str]:
        return self.lists.pop(0)

    async def watch(self, res: Any, rv: str, timeout_seconds: int) -> AsyncIterator[WatchEvent]:
        self.watch_from.append(rv)
        script = self.watches.pop(0) if self.watches else []
        for step in script:
            if isinstance(step, BaseException):
                raise step
            yield step
        if not self.watches and not script:
            await asyncio.Event().wait()  # nothing more to say: an idle stream


async def _run(api: ScriptedApi, until: int) -> tuple[Informer, list[tuple[str, str]]]:
    informer = Informer(cast(KubeApi, api), AGENTS, min_backoff_s=0.0)
    seen: list[tuple[str, str]] = []
    enough = asyncio.Event()

    def record(kind: WatchEventType, obj: dict[str, Any]) -> None:
        seen.append((kind.value, obj["metadata"]["name"]))
        if len(seen) >= until:
            enough.set()

    informer.add_handler(record)
    informer.start()
    try:
        await asyncio.wait_for(enough.wait(), 10)
    finally:
        await informer.stop()
    return informer, seen


async def test_gone_watch_relists_and_replays_the_difference() -> None:
    api = ScriptedApi(
        lists=[([_obj("a", 1), _obj("b", 1)], "10"), ([_obj("a", 11), _obj("c", 12)], "12")],
        watches=[
            [WatchEvent(WatchEventType.MODIFIED, _obj("a", 11)), ApiError(410, "Expired", "too old")],
        ],
    )
    informer, seen = await _run(api, until=5)
    assert seen == [("ADDED", "a"), ("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b"), ("ADDED", "c")]
    assert {o["metadata"]["name"] for o in informer.items()} == {"a", "c"}
    assert informer.relists == 2
    assert api.watch_from[:2] == ["10", "12"]


async def test_clean_stream_end_resumes_and_disconnect_relists() -> None:
    api = ScriptedApi(
        lists=[([_obj("a", 1)], "5"), ([_obj("a", 1), _obj("d", 9)], "9")],
        watches=[
            [
                WatchEvent(WatchEventType.ADDED, _obj("b", 6)),
                WatchEvent(WatchEventType.BOOKMARK, _obj("", 7)),
            ],
            [httpx.ReadError("connection reset")],
        ],
    )
    informer, seen = await _run(api, until=4)
    assert api.watch_from[:2] == ["5", "7"]  # resumed after the bookmark without a re-list
    assert seen == [("ADDED", "a"), ("ADDED", "b"), ("DELETED", "b"), ("ADDED", "d")]
    assert informer.relists == 2
