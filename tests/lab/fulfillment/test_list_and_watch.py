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
    """As the real service: items in id order whatever `order` says (the server never reads it)."""
    created = [api.create(f"w-{i}", labels={ORDER_LABEL: "even" if i % 2 == 0 else "odd"}) for i in range(5)]
    by_id = [o["metadata"]["name"] for o in sorted(created, key=lambda o: o["id"])]
    listed = admin.get(BMI).json()
    assert (listed["size"], listed["total"], names(listed)) == (5, 5, by_id)

    even = admin.get(BMI, params={"filter": f"this.metadata.labels['{ORDER_LABEL}'] == 'even'"}).json()
    assert names(even) == [n for n in by_id if n in ("w-0", "w-2", "w-4")]
    assert (even["size"], even["total"]) == (3, 3)
    # A filter that fails on some objects (missing key) just does not match them.
    unlabelled = admin.post(BMI, json=bmi_body("unlabelled")).json()
    assert names(
        admin.get(BMI, params={"filter": f"this.metadata.labels['{ORDER_LABEL}'] == 'odd'"}).json()
    ) == [n for n in by_id if n in ("w-1", "w-3")]
    by_name = admin.get(
        BMI, params={"filter": "this.metadata.name.startsWith('w-') && this.metadata.name != 'w-3'"}
    )
    assert names(by_name.json()) == [n for n in by_id if n != "w-3"]
    bad = admin.get(BMI, params={"filter": "this.metadata.name =="})
    assert (bad.status_code, bad.json()["code"]) == (400, 3)
    assert bad.json()["message"].startswith("filter:")

    all_by_id = [o["metadata"]["name"] for o in sorted([*created, unlabelled], key=lambda o: o["id"])]
    for order in ("metadata.name desc", "metadata.name", "metadata.name sideways"):
        page = admin.get(BMI, params={"offset": 1, "limit": 2, "order": order}).json()
        assert (page["size"], page["total"], names(page)) == (2, 6, all_by_id[1:3])
    assert names(admin.get(BMI, params={"offset": 5}).json()) == all_by_id[5:]
    for params, field in (({"limit": -1}, "limit"), ({"offset": "x"}, "offset")):
        response = admin.get(BMI, params=params)
        assert (response.status_code, response.json()["code"]) == (400, 3)
        assert response.json()["message"].startswith(f"{field}:")

    api.wait_state(even["items"][0]["id"], BmiState.RUNNING)
    running = admin.get(
        BMI, params={"filter": "this.status.state == 'BARE_METAL_INSTANCE_STATE_RUNNING'"}
    ).json()
    assert even["items"][0]["metadata"]["name"] in names(running)


def test_list_pages_by_keyset_on_id(admin: httpx.Client, api: Api) -> None:
    """`this.id > '<last id>'` with the id order gives every object once, whatever is deleted between
    two pages (an offset would skip the first object of the next page)."""
    ids = sorted(api.create(f"k-{i}")["id"] for i in range(7))
    first = admin.get(BMI, params={"limit": 3}).json()
    assert [o["id"] for o in first["items"]] == ids[:3]
    api.delete(ids[0])
    api.wait_gone(ids[0])
    after = f"this.id > '{first['items'][-1]['id']}'"
    rest = admin.get(BMI, params={"limit": 3, "filter": after}).json()
    assert ([o["id"] for o in rest["items"]], rest["total"]) == (ids[3:6], 4)


def test_list_refuses_a_filter_the_real_translator_cannot_translate(
    twin: RunningFulfillmentTwin, admin: httpx.Client, api: Api
) -> None:
    """The real List turns its filter into SQL; a macro over a repeated field (`exists`, `all`...),
    an unknown function or a conditional fails the List with Internal, "failed to list" (what the
    generic server answers for any error of its DAO). Watch filters are CEL-evaluated and take them."""
    watcher = Watcher(
        twin.url, twin.admin_headers, "event.bare_metal_instance.status.hardware.nics.exists(n, n.mac != '')"
    )
    wait_for_watchers(admin, 1)
    created = api.create("m-0", labels={ORDER_LABEL: "mine"})
    with_nics = watcher.events(bool)
    assert with_nics[0]["bare_metal_instance"]["id"] == created["id"]
    refused = (
        "this.status.hardware.nics.exists(n, n.mac in ['aa:bb:cc:dd:ee:ff'])",
        "this.status.hardware.nics.all(n, n.mac != '')",
        f"'{ORDER_LABEL}' in this.metadata.labels && size(this.metadata.labels) > 1",
        "this.metadata.name.matches('^m-')",
        "this.metadata.name == 'm-0' ? true : false",
    )
    for expression in refused:
        for path in (BMI, "/api/private/v1/bare_metal_instance_types"):
            response = admin.get(path, params={"filter": expression})
            assert (response.status_code, response.json()) == (
                500,
                {"code": 13, "message": "failed to list", "details": []},
            ), expression
    # What the translator supports, with the same words inside string literals, still lists.
    for expression in (
        f"'{ORDER_LABEL}' in this.metadata.labels && this.metadata.labels['{ORDER_LABEL}'] == 'mine'",
        "this.metadata.name in ['m-0', 'x.exists(n, true) ? 1 : 2'] && has(this.metadata.name)",
        "this.metadata.name.startsWith('m-') && !this.metadata.name.endsWith('size(x)')",
    ):
        response = admin.get(BMI, params={"filter": expression})
        assert (response.status_code, names(response.json())) == (200, ["m-0"]), expression


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
