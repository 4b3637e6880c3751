"""Watch through `kubernetes.watch.Watch`: events, resume from a resourceVersion, 410 Gone, selectors,
timeouts, bookmarks, and slow watchers."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import kubernetes
import pytest
from kubernetes.client import ApiException

from lab.hub.builtin import builtin_types
from lab.hub.config import HubConfig
from lab.hub.hub import Hub
from lab.hub.objects import WriteOptions
from lab.hub.resources import Registry
from lab.hub.routes import _stream
from lab.hub.selectors import FieldSelector, LabelSelector
from lab.hub.store import CloseReason, Store
from lab.hub.testing import CO, RunningHub, running_hub, sample_cluster_order, wait_for

GROUP, VERSION, PLURAL = CO


def _events(custom: Any, ns: str, **kwargs: Any) -> list[tuple[str, str, str]]:
    """(type, name, resourceVersion) of the events of a bounded watch."""
    out = []
    for event in kubernetes.watch.Watch().stream(
        custom.list_namespaced_custom_object, GROUP, VERSION, ns, PLURAL, **kwargs
    ):
        meta = event["raw_object"]["metadata"]
        out.append((event["type"], meta.get("name", ""), meta["resourceVersion"]))
    return out


def _create(custom: Any, ns: str, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    body = sample_cluster_order(name)
    body["metadata"]["labels"] = labels or {}
    created: dict[str, Any] = custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
    return created


def test_watch_from_a_list_sees_every_change_in_order(custom, ns: str) -> None:
    _create(custom, ns, "before")
    listed = custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)
    rv = listed["metadata"]["resourceVersion"]
    _create(custom, ns, "o")
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, "o", {"spec": {"templateParameters": "{}"}}
    )
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, ns, PLURAL, "o", {"status": {"phase": "Ready"}}
    )
    custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "o")
    events = _events(custom, ns, resource_version=rv, timeout_seconds=1)
    assert [(t, n) for t, n, _ in events] == [
        ("ADDED", "o"),
        ("MODIFIED", "o"),
        ("MODIFIED", "o"),
        ("DELETED", "o"),
    ]
    versions = [int(v) for _, _, v in events]
    assert versions == sorted(versions) and versions[0] > int(rv)


def test_resume_from_the_middle_of_a_stream(custom, ns: str) -> None:
    first = _create(custom, ns, "a")
    _create(custom, ns, "b")
    _create(custom, ns, "c")
    events = _events(custom, ns, resource_version=first["metadata"]["resourceVersion"], timeout_seconds=1)
    assert [(t, n) for t, n, _ in events] == [("ADDED", "b"), ("ADDED", "c")]


def test_watch_without_a_version_starts_with_the_current_objects(custom, ns: str) -> None:
    _create(custom, ns, "x")
    _create(custom, ns, "y")
    assert [(t, n) for t, n, _ in _events(custom, ns, timeout_seconds=1)] == [("ADDED", "x"), ("ADDED", "y")]


def test_objects_moving_across_a_label_selector_are_added_and_deleted(custom, ns: str) -> None:
    rv = _create(custom, ns, "o", {"pool": "cpu"})["metadata"]["resourceVersion"]
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, "o", {"metadata": {"labels": {"pool": "gpu"}}}
    )
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, "o", {"metadata": {"labels": {"x": "1"}}}
    )
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, "o", {"metadata": {"labels": {"pool": "cpu"}}}
    )
    events = _events(custom, ns, resource_version=rv, timeout_seconds=1, label_selector="pool=gpu")
    assert [t for t, _, _ in events] == ["ADDED", "MODIFIED", "DELETED"]


def test_a_watch_across_namespaces_and_by_field(custom, core, ns: str) -> None:
    rv = custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["metadata"]["resourceVersion"]
    _create(custom, ns, "one")
    _create(custom, ns, "two")
    seen = [
        e["raw_object"]["metadata"]["name"]
        for e in kubernetes.watch.Watch().stream(
            custom.list_cluster_custom_object,
            GROUP,
            VERSION,
            PLURAL,
            resource_version=rv,
            timeout_seconds=1,
            field_selector=f"metadata.namespace={ns},metadata.name=two",
        )
    ]
    assert seen == ["two"]


def test_a_stream_is_live_until_its_timeout(custom, ns: str) -> None:
    rv = custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["metadata"]["resourceVersion"]
    received: list[str] = []
    done = threading.Event()

    def consume() -> None:
        for event in kubernetes.watch.Watch().stream(
            custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            ns,
            PLURAL,
            resource_version=rv,
            timeout_seconds=30,
        ):
            received.append(event["raw_object"]["metadata"]["name"])
            if len(received) == 2:
                break
        done.set()

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    _create(custom, ns, "live-1")
    wait_for(lambda: received, what="the first live event")
    _create(custom, ns, "live-2")
    assert done.wait(30)
    assert received == ["live-1", "live-2"]


# -- a hub with a tiny event window, short bookmarks and faults ------------------------------------


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningHub]:
    with running_hub(
        tmp_path_factory.mktemp("small-hub"), watch_window=5, bookmark_interval_seconds=0.2
    ) as h:
        yield h


@pytest.fixture(scope="module")
def small_custom(small: RunningHub) -> Iterator[Any]:
    client = small.api_client()
    kubernetes.client.CoreV1Api(client).create_namespace(
        kubernetes.client.V1Namespace(metadata=kubernetes.client.V1ObjectMeta(name="w"))
    )
    yield kubernetes.client.CustomObjectsApi(client)
    client.close()


def test_too_old_a_version_is_410_gone(small_custom) -> None:
    old = _create(small_custom, "w", "old")["metadata"]["resourceVersion"]
    for index in range(6):
        _create(small_custom, "w", f"n{index}")
    with pytest.raises(ApiException) as caught:
        _events(small_custom, "w", resource_version=old, timeout_seconds=1)
    assert caught.value.status == 410
    assert "Expired" in str(caught.value.reason)
    # The cure is a fresh list and a watch from its version.
    rv = small_custom.list_namespaced_custom_object(GROUP, VERSION, "w", PLURAL)["metadata"][
        "resourceVersion"
    ]
    assert _events(small_custom, "w", resource_version=rv, timeout_seconds=1) == []


def test_410_is_an_error_event_on_the_stream(small: RunningHub, small_custom) -> None:
    old = _create(small_custom, "w", "old-2")["metadata"]["resourceVersion"]
    for index in range(6):
        _create(small_custom, "w", f"m{index}")
    with httpx.Client(base_url=small.url, headers=small.headers()) as http:
        response = http.get(
            f"/apis/{GROUP}/{VERSION}/namespaces/w/{PLURAL}", params={"watch": "1", "resourceVersion": old}
        )
    assert response.status_code == 200
    event = json.loads(response.text.splitlines()[0])
    assert event["type"] == "ERROR"
    assert event["object"]["code"] == 410 and event["object"]["reason"] == "Expired"


def test_bookmarks_when_asked_for(small: RunningHub, small_custom) -> None:
    rv = small_custom.list_namespaced_custom_object(GROUP, VERSION, "w", PLURAL)["metadata"][
        "resourceVersion"
    ]
    lines: list[dict[str, Any]] = []
    with (
        httpx.Client(base_url=small.url, headers=small.headers(), timeout=30) as http,
        http.stream(
            "GET",
            f"/apis/{GROUP}/{VERSION}/namespaces/w/{PLURAL}",
            params={
                "watch": "true",
                "resourceVersion": rv,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": "20",
            },
        ) as response,
    ):
        for line in response.iter_lines():
            lines.append(json.loads(line))
            if lines[-1]["type"] == "BOOKMARK":
                break
    bookmark = lines[-1]["object"]
    assert bookmark["kind"] == "ClusterOrder" and int(bookmark["metadata"]["resourceVersion"]) >= int(rv)


def test_closing_watches_with_the_faults_knob(small: RunningHub, small_custom) -> None:
    rv = small_custom.list_namespaced_custom_object(GROUP, VERSION, "w", PLURAL)["metadata"][
        "resourceVersion"
    ]
    ended = threading.Event()

    def consume() -> None:
        for _ in kubernetes.watch.Watch().stream(
            small_custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            "w",
            PLURAL,
            resource_version=rv,
            timeout_seconds=60,
        ):
            pass
        ended.set()

    threading.Thread(target=consume, daemon=True).start()
    with httpx.Client(base_url=small.url, headers=small.headers()) as http:

        def cut() -> bool:
            # Repeat until our stream ended: it may open after a first cut.
            http.put("/lab/v1/faults/api", json={"closeWatchesNow": True})
            return ended.wait(0.1)

        wait_for(cut, what="the watch stream to be cut")
        try:
            for index in range(3):
                _create(small_custom, "w", f"cut{index}")
            # At a rate: with rate 1 every stream ends after its first event.
            http.put("/lab/v1/faults/api", json={"watch": {"closeRate": 1.0}})
            assert len(_events(small_custom, "w", resource_version=rv, timeout_seconds=20)) == 1
            # After N events: every stream is cut after its second event.
            http.put("/lab/v1/faults/api", json={"watch": {"closeAfterEvents": 2}})
            assert len(_events(small_custom, "w", resource_version=rv, timeout_seconds=20)) == 2
            assert http.get("/lab/v1/faults/api").json()["watchesCut"] == 1
        finally:
            http.delete("/lab/v1/faults/api")


# -- the store's fan-out, unit level ---------------------------------------------------------------


def test_a_slow_watcher_is_closed_instead_of_buffering_forever() -> None:
    async def scenario() -> None:
        registry = Registry()
        for rt in builtin_types():
            registry.add(rt)
        secrets = registry.get("", "v1", "secrets")
        assert secrets is not None
        store = Store(window=100, queue_size=3)
        slow = store.watch(secrets, "ns", LabelSelector(), FieldSelector(), since=0)
        fast = store.watch(secrets, "ns", LabelSelector(), FieldSelector(), since=0)
        received = 0
        for index in range(5):
            rv = store.next_rv()
            store.put(
                secrets,
                {
                    "kind": "Secret",
                    "apiVersion": "v1",
                    "metadata": {
                        "name": f"s{index}",
                        "namespace": "ns",
                        "uid": f"u{index}",
                        "resourceVersion": str(rv),
                    },
                },
                None,
            )
            while not fast.queue.empty():  # the fast watcher keeps up
                assert await fast.next(1) is not None
                received += 1
        assert slow.closed is CloseReason.OVERFLOW
        assert await slow.next(1) is None
        assert fast.closed is None and received == 5

    asyncio.run(scenario())


class _SecretsWatch:
    """A hub (no HTTP) with a watch of the default namespace's Secrets, and its stream as sent."""

    def __init__(self) -> None:
        self.hub = Hub(HubConfig(tokens={}))
        secrets = self.hub.resource("", "v1", "secrets")
        assert secrets is not None
        self.secrets = secrets
        watcher = self.hub.store.watch(secrets, "default", LabelSelector(), FieldSelector(), since=None)
        self.stream = _stream(self.hub, watcher, 5.0, False, "admin")

    def create(self, name: str) -> None:
        body = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}}
        self.hub.api.create(self.secrets, "default", body, WriteOptions())

    async def next_write(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in (await anext(self.stream)).splitlines()]


def test_what_is_queued_goes_out_in_one_write() -> None:
    """A stream that fell behind catches up in one write, not one write (and loop turn) per event."""

    async def scenario() -> None:
        watch = _SecretsWatch()
        for index in range(5):
            watch.create(f"s{index}")
        events = await watch.next_write()
        assert [e["object"]["metadata"]["name"] for e in events] == [f"s{i}" for i in range(5)]
        assert {e["type"] for e in events} == {"ADDED"}
        assert watch.hub.stats.report().watch_events == {"admin": 5}
        # The next write waits for the next change, and carries only it.
        watch.create("later")
        assert [e["object"]["metadata"]["name"] for e in await watch.next_write()] == ["later"]
        await watch.stream.aclose()

    asyncio.run(scenario())


def test_the_watch_delay_is_counted_per_user() -> None:
    """How long live events waited between the write and the send: the lab's share of a reaction."""

    async def scenario() -> None:
        watch = _SecretsWatch()
        watch.create("s")
        await asyncio.sleep(0.05)  # the event waits this long at least before its stream takes it
        await watch.next_write()
        await watch.stream.aclose()
        delay = watch.hub.stats.report().watch_delay["admin"]
        assert delay.events == 1 and 0.05 <= delay.p50_seconds == delay.p99_seconds == delay.max_seconds < 30

    asyncio.run(scenario())
