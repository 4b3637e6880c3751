"""The kube wrapper against the hub twin: typed errors and the process-wide shared watch."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from kubernetes.client.exceptions import ApiException

import activities.kube as kube_module
from activities.kube import (
    AGENTS,
    CLUSTER_ORDERS,
    SECRETS,
    HubAlreadyExists,
    HubAuthError,
    HubConflict,
    HubInvalid,
    HubKube,
    HubNotFound,
    HubUnavailable,
    WaitTimedOut,
    map_api_exception,
)
from contracts.hub import HubErrorType, WaitAgentInput
from lab.http_server import refusing_port
from lab.hub.kubeconfig import write_kubeconfig
from lab.hub.testing import start_hub


async def test_errors_are_typed_and_never_carry_bodies(api, api_kube, kit):
    with pytest.raises(HubNotFound) as missing:
        await api_kube.get(CLUSTER_ORDERS, api.ns, "nope")
    assert missing.value.non_retryable and missing.value.type == HubErrorType.NOT_FOUND

    # 422 names the field; the rejected body (with a pull secret in it) stays out of the error.
    with pytest.raises(HubInvalid) as invalid:
        await api_kube.create(
            CLUSTER_ORDERS,
            api.ns,
            {
                "metadata": {"name": "bad"},
                "spec": {"templateID": "9-not-valid", "pullSecret": kit.pull_secret},
            },
        )
    assert invalid.value.non_retryable and invalid.value.type == HubErrorType.INVALID
    assert "spec.templateID" in invalid.value.fields
    assert kit.pull_secret_marker not in str(invalid.value) + repr(invalid.value.details)
    assert invalid.value.__cause__ is None and invalid.value.__suppress_context__

    created = await api_kube.create(
        CLUSTER_ORDERS, api.ns, {"metadata": {"name": "o"}, "spec": {"templateID": "t"}}
    )
    with pytest.raises(HubAlreadyExists) as exists:
        await api_kube.create(
            CLUSTER_ORDERS, api.ns, {"metadata": {"name": "o"}, "spec": {"templateID": "t"}}
        )
    assert not exists.value.non_retryable  # a retry adopts

    stale = created["metadata"]["resourceVersion"]
    await api_kube.patch(CLUSTER_ORDERS, api.ns, "o", {"metadata": {"labels": {"a": "b"}}})
    with pytest.raises(HubConflict) as conflict:
        await api_kube.patch(
            CLUSTER_ORDERS, api.ns, "o", {"metadata": {"resourceVersion": stale, "labels": {"a": "c"}}}
        )
    assert not conflict.value.non_retryable and conflict.value.type == HubErrorType.CONFLICT

    # Secrets: a 422 on a Secret says which field, never what was in it.
    with pytest.raises(HubInvalid) as bad_secret:
        await api_kube.create(
            SECRETS,
            api.ns,
            {"metadata": {"name": "s"}, "data": {".dockerconfigjson": "%%" + kit.pull_secret_marker}},
        )
    assert kit.pull_secret_marker not in str(bad_secret.value) + repr(bad_secret.value.details)

    assert await api_kube.delete(CLUSTER_ORDERS, api.ns, "o") is True
    assert await api_kube.delete(CLUSTER_ORDERS, api.ns, "o") is False  # NotFound = already gone


async def test_server_errors_retryable_auth_errors_not(api, api_hub, api_kube, kit, tmp_path):
    faults = {
        "errors": [
            {"code": 500, "verbs": ["get"], "resources": ["clusterorders"], "users": [kit.worker_user]}
        ]
    }
    api.set_faults(faults)
    try:
        with pytest.raises(HubUnavailable) as unavailable:
            await api_kube.get(CLUSTER_ORDERS, api.ns, "any")
    finally:
        api.clear_faults()
    assert not unavailable.value.non_retryable and unavailable.value.code == 500

    bad = HubKube.from_kubeconfig(str(write_kubeconfig(tmp_path / "bad", api_hub.url, "not-a-token")))
    try:
        with pytest.raises(HubAuthError) as unauthorized:
            await bad.get(CLUSTER_ORDERS, api.ns, "any")
        assert unauthorized.value.non_retryable and unauthorized.value.type == HubErrorType.UNAUTHORIZED
    finally:
        await bad.close()

    with refusing_port() as dead:
        refused = HubKube.from_kubeconfig(
            str(write_kubeconfig(tmp_path / "down", f"http://127.0.0.1:{dead}", "t"))
        )
        try:
            with pytest.raises(HubUnavailable) as down:
                await refused.get(CLUSTER_ORDERS, api.ns, "any")
            assert not down.value.non_retryable and down.value.type == HubErrorType.TRANSPORT
        finally:
            await refused.close()


async def test_shared_watch_requests_do_not_grow_with_wait_length(api, api_hub, api_assisted, api_kube, kit):
    """A wait is served by the process-wide watch: no hub calls while waiting, however long."""
    api.agent("warm-up", kit.random_macs())
    first = kit.run()
    await first(api_assisted.wait_agent_for_macs, _input(api.ns, api.get("Agent", "warm-up"), kit))
    informer = api_kube.informer(AGENTS)
    await informer.wait(lambda: True if informer.connected else None, tick_seconds=0.05)  # the watch

    async def wait_with_registration_after(delay: float, name: str) -> tuple[int, int]:
        macs = kit.random_macs()
        run = kit.run()
        before = api.requests_by(kit.worker_user)
        task = run.start(
            api_assisted.wait_agent_for_macs,
            WaitAgentInput.model_validate(
                {
                    "infraenv": _infraenv(api.ns),
                    "order": {"namespace": api.ns, "name": "order-1"},
                    "macs": macs[:1],
                    "deadline": datetime.now(UTC) + timedelta(seconds=60),
                }
            ),
        )
        # Register `delay` after the activity started waiting: the subject here is the wait's length.
        await run.first_heartbeat()
        await asyncio.sleep(delay)
        await asyncio.to_thread(api.agent, name, macs)
        agent = await asyncio.wait_for(task, 30)
        assert agent.name == name
        return api.requests_by(kit.worker_user) - before, len(run.heartbeats)

    short_calls, short_beats = await wait_with_registration_after(0.1, "short")
    long_calls, long_beats = await wait_with_registration_after(2.5, "long")
    assert long_beats > short_beats  # the long wait really waited (and heartbeated meanwhile)
    # One confirming list when the match is found, whatever the wait's length.
    assert short_calls == long_calls == 1


async def test_many_waiters_share_one_watch(api, api_hub, api_assisted, api_kube, kit):
    informer = api_kube.informer(AGENTS)
    await informer.start()
    # Counted once its stream is open: start() returns after the list, the watch follows.
    await informer.wait(lambda: True if informer.connected else None, tick_seconds=0.05)
    watches_before = informer.stats.watches
    hosts = [(f"host-{i}", kit.random_macs()) for i in range(8)]
    runs = [kit.run() for _ in hosts]
    tasks = [
        asyncio.create_task(
            run(
                api_assisted.wait_agent_for_macs,
                WaitAgentInput.model_validate(
                    {
                        "infraenv": _infraenv(api.ns),
                        "order": {"namespace": api.ns, "name": "order-1"},
                        "macs": macs,
                        "deadline": datetime.now(UTC) + timedelta(seconds=60),
                    }
                ),
            )
        )
        for run, (_, macs) in zip(runs, hosts, strict=True)
    ]
    before = api.requests_by(kit.worker_user)
    # One host at a time: a confirming list that sees another Agent still without its inventory
    # lists again (the ambiguity guard), so hosts registering together would make the count depend
    # on timing; the other waiters keep waiting on the same stream meanwhile.
    results = []
    for (name, macs), task in zip(hosts, tasks, strict=True):
        await asyncio.to_thread(api.agent, name, macs)
        results.append(await asyncio.wait_for(task, 30))
    assert [r.name for r in results] == [name for name, _ in hosts]
    # Only confirming lists when a match shows up; a polling wait would cost far more.
    assert before + len(hosts) <= api.requests_by(kit.worker_user) <= before + 2 * len(hosts)
    assert informer.stats.watches == watches_before


def test_a_status_with_free_text_in_reason_or_causes_is_not_copied_into_the_error(kit):
    """An admission webhook answers with any Status it likes: a reason that is no StatusReason and
    cause "fields" that are no field paths never reach the error's message or details."""
    leak = f"denied: pull secret {kit.pull_secret} rejected"
    status = {
        "kind": "Status",
        "status": "Failure",
        "code": 422,
        "reason": leak,
        "message": leak,
        "details": {
            "causes": [
                {"field": "spec.pullSecret", "message": leak},
                {"field": leak, "message": "x"},
                {"field": kit.pull_secret, "message": "x"},
            ]
        },
    }
    exc = ApiException(status=422, reason=leak)
    exc.body = json.dumps(status)
    error = map_api_exception(exc, "create", CLUSTER_ORDERS, "ns", "o")
    assert isinstance(error, HubInvalid) and error.non_retryable
    assert error.reason == "Unprocessable Entity"  # the code's standard phrase, not the server's text
    assert error.fields == ("spec.pullSecret",)
    text = str(error) + repr(error.details)
    assert kit.pull_secret_marker not in text and "denied" not in text

    # A genuine StatusReason is kept, and still tells an AlreadyExists from a Conflict.
    exc = ApiException(status=409, reason="Conflict")
    exc.body = json.dumps({"kind": "Status", "code": 409, "reason": "AlreadyExists"})
    assert isinstance(map_api_exception(exc, "create", CLUSTER_ORDERS, "ns", "o"), HubAlreadyExists)


async def test_informer_resumes_after_cut_and_relists_after_gone(tmp_path, api):
    Api = type(api)  # the conftest helper, bound to a hub of this test's own
    hub = start_hub(tmp_path, watch_window=3)
    kube = HubKube.from_kubeconfig(str(hub.kubeconfig))
    try:
        with httpx.Client(base_url=hub.url, headers=hub.headers(), timeout=30.0) as client:
            api = Api(client, "default")

            def create(name: str) -> None:
                api.create("Secret", {"metadata": {"name": name}})

            informer = kube.informer(SECRETS)
            create("s0")
            await informer.wait(lambda: informer.get("default", "s0"), tick_seconds=1)
            lists, watches = informer.stats.lists, informer.stats.watches

            # Cut the stream: the informer re-watches from its resourceVersion, no re-list.
            api.set_faults({"closeWatchesNow": True})
            create("s1")
            await asyncio.wait_for(informer.wait(lambda: informer.get("default", "s1"), tick_seconds=1), 30)
            assert informer.stats.lists == lists and informer.stats.watches > watches

            # Down long enough that its resourceVersion left the watch window: 410, then a re-list.
            await informer.stop()
            for i in range(2, 10):
                create(f"s{i}")
            api.delete("Secret", "s0")
            await informer.start()
            await asyncio.wait_for(
                informer.wait(
                    lambda: (informer.get("default", "s9") and not informer.get("default", "s0")) or None
                ),
                30,
            )
            assert informer.stats.expired >= 1 and informer.stats.lists == lists + 1
            assert {s["metadata"]["name"] for s in informer.items("default")} >= {
                f"s{i}" for i in range(1, 10)
            }
    finally:
        await kube.close()
        hub.stop()


async def test_informer_keeps_up_when_every_stream_is_cut_after_one_event(tmp_path, api):
    """A hub that cuts each watch after an event must not make the cache fall behind: a stream that
    delivered something is resumed at once (backing off is only for streams that deliver nothing)."""
    async with _secrets_on_a_hub_of_its_own(tmp_path, api) as (api, kube):
        informer = kube.informer(SECRETS)
        lists = informer.stats.lists
        api.set_faults({"watch": {"closeAfterEvents": 1}})
        for i in range(40):
            api.create("Secret", {"metadata": {"name": f"s{i}"}})
        # Backing off (doubling to the cap) after each cut would need minutes for 40 events.
        await asyncio.wait_for(informer.wait(lambda: informer.get("default", "s39"), tick_seconds=1), 30)
        assert informer.stats.lists == lists  # resumed from its resourceVersion, never re-listed
        assert informer.stats.watches >= 10


async def test_wait_deadline_and_cancellation(api, api_kube, api_assisted, kit):
    informer = api_kube.informer(AGENTS)
    # A deadline passed on a cache not synced yet is a HubUnavailable, not a timeout.
    await informer.wait(lambda: True if informer.synced else None, tick_seconds=0.05)
    with pytest.raises(WaitTimedOut):
        await informer.wait(
            lambda: None, deadline=datetime.now(UTC) + timedelta(seconds=0.3), tick_seconds=0.1
        )

    run = kit.run()
    task = asyncio.create_task(
        run(
            api_assisted.wait_agent_for_macs,
            WaitAgentInput.model_validate(
                {
                    "infraenv": _infraenv(api.ns),
                    "order": {"namespace": api.ns, "name": "order-1"},
                    "macs": kit.random_macs(),
                    "deadline": datetime.now(UTC) + timedelta(minutes=5),
                }
            ),
        )
    )
    await run.first_heartbeat()
    waiters = len(informer._waiters)
    assert waiters >= 1
    run.env.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)
    assert len(informer._waiters) == waiters - 1  # the cancelled waiter left


def _infraenv(namespace: str) -> dict[str, object]:
    return {
        "order": {"namespace": namespace, "name": "order-1"},
        "namespace": namespace,
        "name": "order-1-infraenv",
        "pull_secret_name": "order-1-pull-secret",
    }


def _input(namespace: str, agent: dict, kit) -> WaitAgentInput:
    macs = [i["macAddress"] for i in agent["status"]["inventory"]["interfaces"]]
    return WaitAgentInput.model_validate(
        {
            "infraenv": _infraenv(namespace),
            "order": {"namespace": namespace, "name": "order-1"},
            "macs": macs,
            "deadline": datetime.now(UTC) + timedelta(seconds=30),
        }
    )


def _team(secret: dict[str, Any]) -> list[str]:
    labels = (secret.get("metadata") or {}).get("labels") or {}
    return [f"team={labels['team']}"] if "team" in labels else []


async def test_a_keyed_waiter_hears_only_of_its_objects_and_reads_them_from_the_index(api, api_kube):
    """1,000 waiters each checking every Agent on every change of any took most of a worker's CPU:
    a waiter names its index keys, is woken by changes to objects with them and reads just those."""
    informer = api_kube.informer(SECRETS)
    informer.add_index(_team)
    informer.add_index(_team)  # the same function again: one index
    ns = api.ns

    async def seen(name: str, team: str | None) -> None:
        def check() -> bool | None:
            obj = informer.get(ns, name)
            current = _team(obj) if obj is not None else None
            return True if current == ([f"team={team}"] if team else None) else None

        await asyncio.wait_for(informer.wait(check, namespace=ns, keys=[informer.name_key(name)]), 30)

    def secret(name: str, team: str) -> None:
        api.create("Secret", {"metadata": {"name": name, "labels": {"team": team}}})

    checks = 0

    def both_blue() -> list[str] | None:
        nonlocal checks
        checks += 1
        names = [s["metadata"]["name"] for s in informer.indexed(ns, ["team=blue"])]
        return names if len(names) == 2 else None

    waiting = asyncio.create_task(informer.wait(both_blue, namespace=ns, keys=["team=blue"], tick_seconds=60))
    for i in range(20):
        await asyncio.to_thread(secret, f"red-{i}", "red")
    await seen("red-19", "red")
    assert checks == 1  # twenty changes, none of them its business

    await asyncio.to_thread(secret, "blue-1", "blue")
    await seen("blue-1", "blue")
    await asyncio.to_thread(api.patch, "Secret", "red-3", {"metadata": {"labels": {"team": "blue"}}})
    assert await asyncio.wait_for(waiting, 30) == ["blue-1", "red-3"]
    assert checks == 3  # woken by the new blue one and by the one that turned blue

    # The index follows a key going away and an object being deleted.
    await asyncio.to_thread(api.patch, "Secret", "red-3", {"metadata": {"labels": {"team": "red"}}})
    await seen("red-3", "red")
    assert [s["metadata"]["name"] for s in informer.indexed(ns, ["team=blue"])] == ["blue-1"]
    await asyncio.to_thread(api.delete, "Secret", "blue-1")
    await seen("blue-1", None)
    assert informer.indexed(ns, ["team=blue"]) == []
    assert len(informer.indexed(ns, ["team=red"])) == 20
    assert informer.indexed("elsewhere", ["team=red"]) == []
    with pytest.raises(ValueError, match="namespace"):
        await informer.wait(lambda: True, keys=["team=red"])


async def test_list_current_lists_metadata_and_takes_up_to_date_objects_from_the_cache(
    api, api_hub, kit, tmp_path
):
    """A whole list of Agents carries every host's inventory, and each worker lists its InfraEnv's
    a few times. `list_current` answers what `list` would, from a metadata-only list and the
    informer's cache, waiting for the cache a moment and reading only what it still lacks."""
    kube = HubKube.from_kubeconfig(
        str(api_hub.write_kubeconfig(tmp_path / "kubeconfig", token=kit.worker_token)),
        cache_catch_up_seconds=0,  # first without waiting for the cache
    )
    ns, team = api.ns, "team=a"

    def secret(name: str, team: str = "a") -> None:
        api.create("Secret", {"metadata": {"name": name, "labels": {"team": team}}, "data": {"k": "dg=="}})

    def requests() -> tuple[int, int]:
        user = kit.worker_user
        return (api.requests_by(user, "list", "secrets"), api.requests_by(user, "get", "secrets"))

    async def same_as_a_full_list() -> list[dict[str, Any]]:
        before = requests()
        current = await kube.list_current(SECRETS, ns, label_selector=team)
        after = requests()
        used = (after[0] - before[0], after[1] - before[1])
        full = await kube.list(SECRETS, ns, label_selector=team)
        assert current.items == full.items
        current_requests.append(used)
        return current.items

    current_requests: list[tuple[int, int]] = []
    try:
        for i in range(12):
            await asyncio.to_thread(secret, f"s{i:02}")
        await asyncio.to_thread(secret, "other", "b")

        # No informer of the kind yet: a plain list (none is started as a side effect).
        assert len(await same_as_a_full_list()) == 12
        assert current_requests.pop() == (1, 0) and kube._informers.get(SECRETS) is None

        informer = kube.informer(SECRETS)
        await informer.wait(lambda: len(informer.items(ns)) == 13 or None, namespace=ns)
        items = await same_as_a_full_list()
        assert current_requests.pop() == (1, 0)  # metadata only; every object from the cache
        assert all(obj is informer.get(ns, obj["metadata"]["name"]) for obj in items)

        # The cache is behind (its watch stopped) and not waited for: what changed since is read,
        # what went is not.
        await informer.stop()
        await asyncio.to_thread(api.patch, "Secret", "s01", {"metadata": {"labels": {"x": "1"}}})
        await asyncio.to_thread(api.patch, "Secret", "s02", {"metadata": {"labels": {"team": "b"}}})
        await asyncio.to_thread(api.delete, "Secret", "s03")
        await asyncio.to_thread(secret, "s12")
        items = await same_as_a_full_list()
        assert current_requests.pop() == (1, 2)  # s01 and s12 read; s02 and s03 not listed
        assert [o["metadata"]["name"] for o in items] == [f"s{i:02}" for i in range(13) if i not in (2, 3)]

        # Too far behind: one whole list is cheaper than reading each.
        for i in range(4, 12):
            await asyncio.to_thread(api.patch, "Secret", f"s{i:02}", {"metadata": {"labels": {"x": "2"}}})
        await same_as_a_full_list()
        assert current_requests.pop() == (2, 0)

        # Waited for, the cache catches up (the wait resumes its watch) and nothing is read.
        kube.cache_catch_up_seconds = 60.0
        for i in range(4, 8):
            await asyncio.to_thread(api.patch, "Secret", f"s{i:02}", {"metadata": {"labels": {"x": "3"}}})
        await asyncio.wait_for(same_as_a_full_list(), 60)
        assert current_requests.pop() == (1, 0)
    finally:
        await kube.close()


async def test_a_wait_on_an_object_the_cache_lacks_reads_it_once_a_tick_and_keeps_its_deadline(tmp_path, api):
    """The hub has the object, the informer's cache does not (its watch and re-list refused): the
    wait reads it afresh once a tick, not in a loop of GETs that never heartbeats and never reaches
    its deadline (found by review)."""
    async with _secrets_on_a_hub_of_its_own(tmp_path, api) as (api, kube):
        # From now on the informer hears nothing: its streams cut, every watch and list refused.
        refused = {"code": 500, "verbs": ["watch", "list"], "resources": ["secrets"]}
        api.set_faults({"errors": [refused], "closeWatchesNow": True})
        api.create("Secret", {"metadata": {"name": "late"}})
        ticks: list[Any] = []
        gets = kube.stats.requests["get"]
        try:
            with pytest.raises(WaitTimedOut):
                await asyncio.wait_for(
                    kube.wait_object(
                        SECRETS,
                        "default",
                        "late",
                        lambda obj: (obj or {}).get("data") or None,  # never: it has no data
                        deadline=datetime.now(UTC) + timedelta(seconds=2),
                        on_tick=ticks.append,
                        tick_seconds=0.5,
                    ),
                    30,
                )
        finally:
            api.clear_faults()
        assert kube.informer(SECRETS).get("default", "late") is None  # the cache never had it
        assert ticks  # and the wait heartbeat meanwhile
        assert kube.stats.requests["get"] - gets <= 8  # the first read, then one a tick


async def test_a_wait_never_takes_the_caches_copy_of_an_object_the_hub_deleted(tmp_path, api):
    """The hub deleted the object, the informer cannot hear it (its streams cut, every list and
    watch refused) and still holds it: the wait's fresh read says absent, and the cache's copy of
    the deleted object is never evaluated as if it existed (found by review: a deleted InfraEnv's
    cached URL was taken for its image ready)."""
    async with _secrets_on_a_hub_of_its_own(tmp_path, api) as (api, kube):
        api.create("Secret", {"metadata": {"name": "doomed"}, "data": {"k": "dg=="}})
        informer = kube.informer(SECRETS)
        await informer.wait(lambda: informer.get("default", "doomed"), tick_seconds=0.5)
        refused = {"code": 500, "verbs": ["watch", "list"], "resources": ["secrets"]}
        api.set_faults({"errors": [refused], "closeWatchesNow": True})
        try:
            api.delete("Secret", "doomed")
            assert informer.get("default", "doomed") is not None  # the blind cache still has it
            with pytest.raises(WaitTimedOut):
                await asyncio.wait_for(
                    kube.wait_object(
                        SECRETS,
                        "default",
                        "doomed",
                        lambda obj: (obj or {}).get("data") or None,
                        deadline=datetime.now(UTC) + timedelta(seconds=2),
                        tick_seconds=0.5,
                    ),
                    30,
                )
        finally:
            api.clear_faults()


@contextlib.asynccontextmanager
async def _secrets_on_a_hub_of_its_own(tmp_path, api) -> AsyncIterator[tuple[Any, HubKube]]:
    """A hub of the test's own (its faults touch no other test), its API client, and a HubKube whose
    Secrets informer has synced on a first Secret."""
    hub = start_hub(tmp_path)
    kube = HubKube.from_kubeconfig(str(hub.kubeconfig))
    try:
        with httpx.Client(base_url=hub.url, headers=hub.headers(), timeout=30.0) as client:
            own = type(api)(client, "default")
            informer = kube.informer(SECRETS)
            own.create("Secret", {"metadata": {"name": "first"}})
            await informer.wait(lambda: informer.get("default", "first"), tick_seconds=1)
            yield own, kube
    finally:
        await kube.close()
        hub.stop()


async def test_in_the_cluster_too_a_request_that_reached_the_hub_is_never_sent_again(monkeypatch, tmp_path):
    """urllib3's default retries would send a GET, PUT or DELETE again after a read error; only
    connection set-up may be retried, for a pod's service account as for a kubeconfig."""

    def service_account(client_configuration: Any) -> None:  # what a pod's mounted account gives
        client_configuration.host = "https://172.30.0.1:443"

    monkeypatch.setattr(kube_module.k8s_config, "load_incluster_config", service_account)
    hub = start_hub(tmp_path)
    kubes = [HubKube.in_cluster(max_workers=2), HubKube.from_kubeconfig(str(hub.kubeconfig), max_workers=2)]
    try:
        for kube in kubes:
            retries = kube._api.configuration.retries
            assert (retries.read, retries.status, retries.other, retries.connect) == (0, 0, 0, 3)
    finally:
        for kube in kubes:
            await kube.close()
        hub.stop()


async def test_a_wait_hears_of_a_deletion_the_cache_saw_at_once(api, api_kube):
    """An object the cache held and lost is confirmed gone with one read at once, not a tick later
    (the once-a-tick read is only for an object the cache has not seen since the hub had it)."""
    api.create("Secret", {"metadata": {"name": "leaving"}})
    informer = api_kube.informer(SECRETS)
    await informer.wait(lambda: informer.get(api.ns, "leaving"), tick_seconds=0.1)
    waiting_on_the_cache = asyncio.Event()
    waiting = asyncio.create_task(
        api_kube.wait_object(
            SECRETS,
            api.ns,
            "leaving",
            lambda obj: "gone" if obj is None else None,
            deadline=datetime.now(UTC) + timedelta(seconds=120),
            on_tick=lambda _: waiting_on_the_cache.set(),  # past its first read, on the cache
            tick_seconds=60,
        )
    )
    await asyncio.wait_for(waiting_on_the_cache.wait(), 30)
    api.delete("Secret", "leaving")
    assert await asyncio.wait_for(waiting, 30) == "gone"
