"""List (CEL `filter` over `this`, `order`, `offset`, `limit`) and the `events/watch` stream."""

from __future__ import annotations

import asyncio
import json
import queue
import threading
from collections.abc import Callable
from functools import partial
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import httpx

from lab.fulfillment import FulfillmentConfig, FulfillmentLab, create_fulfillment_app
from lab.fulfillment.events import EventBus
from lab.fulfillment.models import BmiState, EventType
from lab.fulfillment.routes_api import _event_lines
from lab.fulfillment.testing import RunningFulfillmentTwin, bmi_body, fulfillment_twin, wait_until
from lab.http_server import ThreadedServer

if TYPE_CHECKING:
    from .conftest import Api

BMI = "/api/private/v1/baremetal_instances"
WATCH = "/api/private/v1/events/watch"
ORDER_LABEL = "osac.openshift.io/cluster-order"
END = object()


def names(answer: dict[str, Any]) -> list[str]:
    return [o["metadata"]["name"] for o in answer["items"]]


def test_list_filter_order_and_pages(admin: httpx.Client, api: Api) -> None:
    for i in range(5):
        api.create(f"w-{i}", labels={ORDER_LABEL: "even" if i % 2 == 0 else "odd"})
    listed = admin.get(BMI).json()
    assert (listed["size"], listed["total"], names(listed)) == (5, 5, [f"w-{i}" for i in range(5)])

    even = admin.get(BMI, params={"filter": f"this.metadata.labels['{ORDER_LABEL}'] == 'even'"}).json()
    assert names(even) == ["w-0", "w-2", "w-4"]
    assert (even["size"], even["total"]) == (3, 3)
    # A filter that fails on some objects (missing key) just does not match them.
    admin.post(BMI, json=bmi_body("unlabelled"))
    assert names(
        admin.get(BMI, params={"filter": f"this.metadata.labels['{ORDER_LABEL}'] == 'odd'"}).json()
    ) == [
        "w-1",
        "w-3",
    ]
    by_name = admin.get(
        BMI, params={"filter": "this.metadata.name.startsWith('w-') && this.metadata.name != 'w-3'"}
    )
    assert names(by_name.json()) == ["w-0", "w-1", "w-2", "w-4"]
    bad = admin.get(BMI, params={"filter": "this.metadata.name =="})
    assert (bad.status_code, bad.json()["code"]) == (400, 3)
    assert bad.json()["message"].startswith("filter:")

    page = admin.get(BMI, params={"offset": 1, "limit": 2, "order": "metadata.name desc"}).json()
    assert (page["size"], page["total"], names(page)) == (2, 6, ["w-3", "w-2"])
    assert names(admin.get(BMI, params={"offset": 5}).json()) == ["unlabelled"]
    assert names(admin.get(BMI, params={"order": "metadata.name"}).json())[0] == "unlabelled"
    for params, field in (
        ({"order": "metadata.name sideways"}, "order"),
        ({"limit": -1}, "limit"),
        ({"offset": "x"}, "offset"),
    ):
        response = admin.get(BMI, params=params)
        assert (response.status_code, response.json()["code"]) == (400, 3)
        assert response.json()["message"].startswith(f"{field}:")

    api.wait_state(even["items"][0]["id"], BmiState.RUNNING)
    running = admin.get(
        BMI, params={"filter": "this.status.state == 'BARE_METAL_INSTANCE_STATE_RUNNING'"}
    ).json()
    assert "w-0" in names(running)


class Watcher:
    """Reads an events/watch stream on a thread; every line is parsed, the end is recorded."""

    def __init__(self, url: str, headers: dict[str, str], filter_expr: str | None = None) -> None:
        self.lines: queue.Queue[Any] = queue.Queue()
        self.error: BaseException | None = None
        self.status: int | None = None
        params = {"filter": filter_expr} if filter_expr else {}
        self._thread = threading.Thread(target=self._run, args=(url, headers, params), daemon=True)
        self._thread.start()

    def _run(self, url: str, headers: dict[str, str], params: dict[str, str]) -> None:
        try:
            with httpx.stream("GET", url + WATCH, headers=headers, params=params, timeout=60) as response:
                self.status = response.status_code
                for line in response.iter_lines():
                    if line:
                        self.lines.put(json.loads(line))
        except BaseException as exc:  # the test thread reports it
            self.error = exc
        finally:
            self.lines.put(END)

    def events(
        self, until: Callable[[list[dict[str, Any]]], bool], timeout: float = 20.0
    ) -> list[dict[str, Any]]:
        """Collect events until `until(events)` is true."""
        seen: list[dict[str, Any]] = []
        while not until(seen):
            item = self.lines.get(timeout=timeout)
            assert item is not END, f"stream ended early: {self.error!r}"
            assert set(item) == {"result"} and set(item["result"]) == {"event"}
            seen.append(item["result"]["event"])
        return seen

    def join(self, timeout: float = 20.0) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the watch stream did not end"


def is_running(client: httpx.Client, bmi_id: str) -> bool:
    return bool(client.get(f"{BMI}/{bmi_id}").json()["status"]["state"] == BmiState.RUNNING.value)


def wait_for_watchers(client: httpx.Client, count: int) -> None:
    wait_until(lambda: client.get("/lab/v1/stats").json()["watchers"] == count, what=f"{count} watchers")


def test_watch_streams_filtered_bmi_events_and_ends_on_shutdown() -> None:
    secret = "SECRET-IGNITION-" + "z" * 20
    with (
        fulfillment_twin(hosts=4) as twin,
        httpx.Client(base_url=twin.url, headers=twin.admin_headers, timeout=20) as admin,
    ):
        watcher = Watcher(
            twin.url,
            twin.admin_headers,
            f"event.bare_metal_instance.metadata.labels['{ORDER_LABEL}'] == 'mine'",
        )
        everything = Watcher(twin.url, twin.admin_headers)
        wait_for_watchers(admin, 2)
        mine = admin.post(BMI, json=bmi_body("mine-0", labels={ORDER_LABEL: "mine"}, user_data=secret)).json()
        other = admin.post(BMI, json=bmi_body("other-0", labels={ORDER_LABEL: "other"})).json()
        for bmi in (mine, other):
            wait_until(partial(is_running, admin, bmi["id"]), what="RUNNING")
            admin.delete(f"{BMI}/{bmi['id']}")

        def deleted(events: list[dict[str, Any]]) -> bool:
            return any(e["type"] == "EVENT_TYPE_OBJECT_DELETED" for e in events)

        events = watcher.events(deleted)
        assert {e["bare_metal_instance"]["id"] for e in events} == {mine["id"]}
        assert events[0]["type"] == "EVENT_TYPE_OBJECT_CREATED"
        assert events[-1]["type"] == "EVENT_TYPE_OBJECT_DELETED"
        states = [e["bare_metal_instance"]["status"]["state"] for e in events]
        assert states[0] == BmiState.PROVISIONING.value
        assert BmiState.RUNNING.value in states and BmiState.DELETING.value in states
        running = next(
            e for e in events if e["bare_metal_instance"]["status"]["state"] == BmiState.RUNNING.value
        )
        assert running["bare_metal_instance"]["status"]["hardware"]["nics"]
        versions = [e["bare_metal_instance"]["metadata"]["version"] for e in events]
        assert versions == sorted(versions)
        assert len({e["id"] for e in events}) == len(events)

        all_events = everything.events(lambda ev: sum(deleted([e]) for e in ev) == 2)
        assert {e["bare_metal_instance"]["id"] for e in all_events} == {mine["id"], other["id"]}
        assert not any(secret in json.dumps(e) for e in all_events)
        # Other kinds are events too, under their own payload field.
        admin.patch(
            "/api/private/v1/bare_metal_instance_types/"
            + admin.get("/api/private/v1/bare_metal_instance_types").json()["items"][0]["id"],
            json={"spec": {"description": "changed"}},
        )
        type_event = everything.events(lambda ev: bool(ev))[0]
        assert type_event["type"] == "EVENT_TYPE_OBJECT_UPDATED" and "bare_metal_instance_type" in type_event

        bad = admin.get(WATCH, params={"filter": "event.("})
        assert (bad.status_code, bad.json()["code"]) == (400, 3)
    # Leaving the context stopped the twin: both streams ended cleanly.
    for w in (watcher, everything):
        w.join()
        assert w.error is None
        assert w.status == 200


def test_watch_ends_when_a_plain_threaded_server_stops() -> None:
    """Without the testing helper: ThreadedServer.stop() alone must not hang on an open stream."""
    lab = FulfillmentLab(FulfillmentConfig(hosts=1))
    server = ThreadedServer(create_fulfillment_app(lab)).start()
    headers = {"Authorization": f"Bearer {lab.config.admin_token}"}
    watcher = Watcher(server.url, headers)
    with httpx.Client(base_url=server.url, headers=headers, timeout=20) as admin:
        wait_for_watchers(admin, 1)
    server.stop()
    watcher.join()
    assert watcher.error is None
    assert lab.closed


def test_subscribe_before_list_misses_nothing(twin: RunningFulfillmentTwin, admin: httpx.Client) -> None:
    watcher = Watcher(twin.url, twin.admin_headers)
    wait_for_watchers(admin, 1)
    created = admin.post(BMI, json=bmi_body("gap")).json()
    first = watcher.events(lambda ev: bool(ev))[0]
    assert (first["type"], first["bare_metal_instance"]["id"]) == ("EVENT_TYPE_OBJECT_CREATED", created["id"])


def test_buffered_events_go_out_in_one_write() -> None:
    """A subscriber that fell behind catches up in one write, not one write (and loop turn) per event."""

    async def scenario() -> None:
        bus = EventBus()
        lab = SimpleNamespace(bus=bus)
        sub = bus.subscribe(lambda event: True)
        for index in range(3):
            bus.publish(EventType.CREATED, "bare_metal_instance", {"id": f"b{index}"})
        lines = _event_lines(cast(FulfillmentLab, lab), sub)
        first = await anext(lines)
        ids = [
            json.loads(line)["result"]["event"]["bare_metal_instance"]["id"] for line in first.splitlines()
        ]
        assert ids == ["b0", "b1", "b2"]
        bus.publish(EventType.UPDATED, "bare_metal_instance", {"id": "b0"})
        later = await anext(lines)
        assert [json.loads(line)["result"]["event"]["type"] for line in later.splitlines()] == [
            EventType.UPDATED.value
        ]
        bus.close()
        assert [chunk async for chunk in lines] == []
        assert bus.subscriber_count == 0

    asyncio.run(scenario())
