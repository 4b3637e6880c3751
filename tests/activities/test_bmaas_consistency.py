"""What lists and GETs may and may not conclude: pages that shift under a deletion, a relist that does
not show a live BMI, a GET answered before a deletion and read after it, a host that runs without a
MAC. Each case once failed a healthy host or waited for ever."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import httpx
import pytest
from temporalio.exceptions import ApplicationError

from activities.bmaas import BmaasActivities, BmaasClient, BmiWatcher
from activities.bmaas.client import INSTANCES, cel_string
from activities.bmaas.snapshot import BmiSnapshot
from activities.bmaas.watcher import GONE, LIST_FILTER
from contracts.bmaas import (
    ORDER_LABEL,
    ORDER_NAMESPACE_LABEL,
    BmaasErrorType,
    BmiState,
    WaitInstanceGoneInput,
    WaitInstanceRunningInput,
)
from lab.fulfillment.models import Nic
from lab.fulfillment.testing import bmi_body
from tests.activities.conftest import Harness, wait_for

PRIVATE = "/api/private/v1"
LIST_PATH = f"{PRIVATE}/{INSTANCES}"


async def _gone(h: Harness, bmi_id: str) -> bool:
    return await h.lab.get_bmi(bmi_id) is None


async def _state_is(h: Harness, bmi_id: str, state: BmiState) -> bool:
    obj = await h.lab.get_bmi(bmi_id)
    return bool(obj and obj["status"]["state"] == state.value)


async def _fillers(h: Harness, count: int) -> list[str]:
    """CaaS BMIs of another order; under the `no_free_hosts` fault they get no host, so deleting one
    is immediate."""
    ids = []
    for _ in range(count):
        name = f"filler-{uuid.uuid4().hex[:12]}"
        body = bmi_body(name, labels={ORDER_LABEL: "other", ORDER_NAMESPACE_LABEL: "ns"})
        resp = await h.lab.post("/baremetal_instances", body)
        resp.raise_for_status()
        ids.append(resp.json()["id"])
    return ids


def _delete_before_list_page(h: Harness, page: int, victims: list[str]) -> dict[str, int]:
    """Before the `page`-th list request (1-based) from now, delete `victims` and wait until they are
    gone, as if their wipes had finished between two page requests."""
    inner = h.transport.handle_async_request
    seen = {"lists": 0}

    async def hooked(request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and request.url.path == LIST_PATH:
            seen["lists"] += 1
            if seen["lists"] == page:
                for victim in victims:
                    await h.lab.http.delete(f"{LIST_PATH}/{victim}")
                for victim in victims:
                    await wait_for(partial(_gone, h, victim), what="victim gone")
        return await inner(request)

    h.transport.handle_async_request = hooked  # type: ignore[method-assign]
    return seen


# -- pages -----------------------------------------------------------------------------------------


async def test_a_deletion_between_two_pages_skips_no_live_bmi(harness: Harness) -> None:
    h = harness
    await h.lab.faults(no_free_hosts=True)
    ids = sorted(await _fillers(h, 150))
    await h.lab.clear_faults()
    seen = _delete_before_list_page(h, 2, ids[:1])  # a BMI of the first page (the List is in id order)

    listed = [item["id"] for item in await h.client.list_all(INSTANCES, LIST_FILTER, page_size=100)]

    assert seen["lists"] == 2
    assert len(listed) == len(set(listed)) == 150  # the first page still had the deleted one
    assert set(listed) == set(ids)


async def test_a_relist_whose_pages_shift_fails_no_healthy_host(harness: Harness) -> None:
    """The review's case: a reconnect relists in pages, BMIs of page 1 finish their deletion before
    page 2 is asked for; the host being waited on (on page 2) must go on booting, not be wiped."""
    h = harness
    h.watcher.poll_initial = 600.0  # no polling while the stream is down: only the relist can tell
    await h.lab.timings(boot_s=60.0)  # the workers stay PROVISIONING: healthy, booting
    # The twin of these tests has five standard hosts.
    workers = [(await h.run(h.acts.create_worker_instance, h.slot(i))).instance.id for i in range(5)]
    for worker in workers:
        await wait_for(partial(_observed_with_macs, h.watcher, worker), what="a worker's host allocated")
    target = max(workers)  # the one latest in the List's id order: the fewest fillers needed below it
    # Enough BMIs before the target in the List's id order to put it on the second page.
    await h.lab.faults(no_free_hosts=True)
    fillers: list[str] = []
    while sum(f < target for f in fillers) < 100:
        fillers += await _fillers(h, 20)
    await h.lab.clear_faults()
    below = sum(i < target for i in [*fillers, *workers])  # the target's index in the List
    waiting = asyncio.ensure_future(
        h.run(h.acts.wait_instance_running, WaitInstanceRunningInput(bmi_id=target))
    )
    try:
        await wait_for(lambda: _heartbeating(h), what="the waiter heartbeating")
        # As many first-page BMIs go as there are BMIs between the first page's end and the target:
        # an offset page 2 would then begin just after the target.
        seen = _delete_before_list_page(h, 2, sorted(f for f in fillers if f < target)[: below - 99])
        lists_before = h.watcher.stats.lists
        assert h.transport.cut_watches() == 1  # a reconnect: subscribe, then relist in pages

        await wait_for(lambda: _relisted(h.watcher, lists_before), what="relisted and streaming")
        assert seen["lists"] >= 2
        assert not waiting.done()
        await h.lab.timings(boot_s=0.0)  # let it finish booting
        running = await asyncio.wait_for(waiting, 20)
        assert running.bmi_id == target
    finally:
        await _cancel(waiting)


# -- a relist that does not show a live BMI ----------------------------------------------------------


async def test_a_bmi_a_relist_does_not_show_is_asked_for_by_id_not_taken_for_gone(harness: Harness) -> None:
    h = harness
    await h.lab.timings(boot_s=60.0)
    target = (await h.run(h.acts.create_worker_instance, h.slot(0))).instance.id
    # Allocated: no event comes for it now until it boots, so a relist cannot miss a newer change.
    await wait_for(lambda: _observed_with_macs(h.watcher, target), what="the target's host allocated")
    # A watcher whose lists never show the target, as a list that lost an item would.
    watcher = BmiWatcher(
        h.client,
        list_filter=f"{LIST_FILTER} && this.id != {cel_string(target)}",
        poll_initial=600.0,  # no polling: only the relist and the waiter's own GET can tell
        reconnect_initial=0.05,
        reconnect_max=0.3,
    )
    acts = BmaasActivities(h.client, watcher, h.ignition, heartbeat_interval=0.2)
    await watcher.wait_streaming(20.0)
    waiting = asyncio.ensure_future(
        h.run(acts.wait_instance_running, WaitInstanceRunningInput(bmi_id=target))
    )
    try:
        await wait_for(lambda: _observed_with_macs(watcher, target), what="the waiter seeded")
        lists_before, seeds_before = watcher.stats.lists, watcher.stats.seeds
        h.transport.cut_watches()

        await wait_for(lambda: _relisted(watcher, lists_before), what="relisted and streaming")
        # The relist forgot it; the waiter asked for it by id and knows it again (not as gone).
        await wait_for(lambda: _known_again(watcher, target, seeds_before), what="the confirming GET")
        assert not waiting.done()
        await h.lab.timings(boot_s=0.0)
        running = await asyncio.wait_for(waiting, 20)
        assert running.bmi_id == target
    finally:
        await _cancel(waiting)
        await watcher.stop()


# -- a GET answered before a deletion, read after it -------------------------------------------------


class HoldingTransport(httpx.AsyncBaseTransport):
    """Real HTTP; the first answer to a GET of `held_path` is read at once but handed back only once
    `release` is set (an answer delayed on its way back)."""

    def __init__(self, held_path: str) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self.held_path = held_path
        self.release = asyncio.Event()
        self.held = asyncio.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        if request.method == "GET" and request.url.path == self.held_path and not self.held.is_set():
            body = await response.aread()
            self.held.set()
            await self.release.wait()
            return httpx.Response(response.status_code, headers=response.headers, content=body)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


async def test_a_late_get_answer_never_undoes_a_deleted_event(harness: Harness) -> None:
    h = harness
    await h.lab.timings(boot_s=0.05)
    x = (await h.run(h.acts.create_worker_instance, h.slot(0))).instance.id
    await h.run(h.acts.wait_instance_running, WaitInstanceRunningInput(bmi_id=x))
    read: asyncio.Future[Any] | None = None
    async with _holding_watcher(h, x) as (transport, _client, watcher):
        try:
            await watcher.wait_streaming(20.0)
            assert _state_of(watcher, x) == BmiState.RUNNING  # from the gap-closing list
            read = asyncio.ensure_future(watcher.refresh(x))
            await asyncio.wait_for(transport.held.wait(), 10)  # answered RUNNING, held on its way back
            await h.lab.http.delete(f"{LIST_PATH}/{x}")
            await wait_for(lambda: _gone(h, x), what="wipe finished, BMI gone")
            await wait_for(lambda: _observed_is_gone(watcher, x), what="the DELETED event seen")

            transport.release.set()  # the stale RUNNING answer arrives now
            assert await asyncio.wait_for(read, 10) is GONE
            assert watcher.observed(x) is GONE
        finally:
            await _cancel(read)


async def test_wait_gone_returns_though_its_seeding_get_was_answered_before_the_wipe_ended(
    harness: Harness,
) -> None:
    """The review's case: a fresh worker process waits for a BMI being wiped; its seeding GET says
    DELETING but reaches it only after the DELETED event. The wait must end, not wait for a relist."""
    h = harness
    x = (await h.run(h.acts.create_worker_instance, h.slot(0))).instance.id
    await h.run(h.acts.wait_instance_running, WaitInstanceRunningInput(bmi_id=x))
    await h.lab.timings(wipe_s=1.5)
    await h.lab.http.delete(f"{LIST_PATH}/{x}")
    gone: asyncio.Future[Any] | None = None
    async with _holding_watcher(h, x) as (transport, client, watcher):
        acts = BmaasActivities(client, watcher, h.ignition, heartbeat_interval=0.2)
        try:
            gone = asyncio.ensure_future(
                h.run(acts.wait_instance_gone, WaitInstanceGoneInput(bmi_id=x, stuck_after_seconds=3600))
            )
            await asyncio.wait_for(transport.held.wait(), 10)  # its seeding GET was answered: DELETING
            await wait_for(lambda: _gone(h, x), what="wipe finished, BMI gone")
            await wait_for(lambda: _observed_is_gone(watcher, x), what="the DELETED event seen")
            transport.release.set()

            result = await asyncio.wait_for(gone, 20)
            assert result.bmi_id == x
            assert watcher.observed(x) is GONE
        finally:
            await _cancel(gone)


# -- a host that runs without a MAC --------------------------------------------------------------------


@pytest.mark.parametrize("nics", [[], [Nic(mac="")]], ids=["no-nic", "empty-mac"])
async def test_a_running_bmi_without_a_nic_mac_fails_at_once(harness: Harness, nics: list[Nic]) -> None:
    """README: a BMI that runs with no NIC reporting a MAC cannot be matched to any Agent, so its
    attempt fails at once like a failed provisioning (BMIProvisioningFailed)."""
    h = harness
    x = (await h.run(h.acts.create_worker_instance, h.slot(0))).instance.id
    await wait_for(lambda: _state_is(h, x, BmiState.RUNNING), what="running")

    async def set_nics() -> None:
        rec = h.twin.lab.table.get(x)
        assert rec is not None and rec.obj.status.hardware is not None
        rec.obj.status.hardware.nics = list(nics)
        h.twin.lab.table.changed(rec)

    h.twin.call(set_nics())
    await wait_for(lambda: _observed_without_macs(h.watcher, x), what="the watcher saw no MAC")

    with pytest.raises(ApplicationError) as failed:
        await asyncio.wait_for(h.run(h.acts.wait_instance_running, WaitInstanceRunningInput(bmi_id=x)), 20)
    assert failed.value.type == BmaasErrorType.PROVISIONING_FAILED.value
    assert failed.value.non_retryable
    assert "none of its NICs reports a MAC address (reported: no address at all)" in failed.value.message


# -- helpers -------------------------------------------------------------------------------------------


async def _observed_is_gone(watcher: BmiWatcher, bmi_id: str) -> bool:
    return watcher.observed(bmi_id) is GONE


async def _observed_with_macs(watcher: BmiWatcher, bmi_id: str) -> bool:
    obs = watcher.observed(bmi_id)
    return isinstance(obs, BmiSnapshot) and bool(obs.macs)


async def _heartbeating(h: Harness) -> bool:
    return bool(h.heartbeats)


async def _observed_without_macs(watcher: BmiWatcher, bmi_id: str) -> bool:
    obs = watcher.observed(bmi_id)
    return isinstance(obs, BmiSnapshot) and obs.state == BmiState.RUNNING and not obs.macs


async def _relisted(watcher: BmiWatcher, lists_before: int) -> bool:
    return watcher.stats.lists > lists_before and watcher.streaming


async def _known_again(watcher: BmiWatcher, bmi_id: str, seeds_before: int) -> bool:
    return watcher.stats.seeds > seeds_before and isinstance(watcher.observed(bmi_id), BmiSnapshot)


def _state_of(watcher: BmiWatcher, bmi_id: str) -> BmiState | None:
    obs = watcher.observed(bmi_id)
    return obs.state if isinstance(obs, BmiSnapshot) else None


@contextlib.asynccontextmanager
async def _holding_watcher(
    h: Harness, bmi_id: str
) -> AsyncIterator[tuple[HoldingTransport, BmaasClient, BmiWatcher]]:
    """A watcher of its own whose GETs of `bmi_id` are held on their way back until
    `transport.release` is set (always, on the way out)."""
    transport = HoldingTransport(f"{LIST_PATH}/{bmi_id}")
    client = BmaasClient(h.twin.url, h.token_file, timeout=30.0, transport=transport)
    watcher = BmiWatcher(client, poll_initial=0.1, poll_max=0.5, reconnect_initial=0.05, reconnect_max=0.3)
    try:
        yield transport, client, watcher
    finally:
        transport.release.set()
        await watcher.stop()
        await client.aclose()


async def _cancel(task: asyncio.Future[Any] | None) -> None:
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(BaseException):
        await task


async def test_a_subscription_the_gateway_answers_only_with_its_first_event_is_kept(harness: Harness) -> None:
    """The real gateway writes a watch's status and headers with its first event. A subscription
    that outlasts the call budget in a quiet time is kept, not given up and made again: the stream
    would miss whatever happens between two subscriptions, and the process would poll instead."""
    h = harness
    await h.lab.faults(watch_headers_with_first_event=True)
    client = BmaasClient(h.twin.url, h.token_file, timeout=1.0)
    watcher = BmiWatcher(client, poll_initial=0.1, poll_max=0.5, reconnect_initial=0.05, reconnect_max=0.3)
    route = "GET /api/private/v1/events/watch"
    before = (await h.lab.stats()).get(route, 0)
    watcher.start()
    try:
        # A quiet time of three call budgets, deliberately: no event, so nothing answers the watch.
        await asyncio.sleep(3.0)
        assert not watcher.streaming
        created = await h.run(h.acts.create_worker_instance, h.slot(0))
        await watcher.wait_streaming(20.0)  # answered with the BMI's first event
        assert watcher.stats.subscriptions == 1
        assert (await h.lab.stats()).get(route, 0) - before == 1, "the subscription was given up"

        async def known() -> bool:
            return watcher.observed(created.instance.id) is not None

        await wait_for(known, what="the new BMI known to the watcher")
    finally:
        await watcher.stop()
        await client.aclose()
