"""The waiting activities and the shared watcher: running, gone, faults, cut streams, call counts."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import Counter
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from temporalio.exceptions import ApplicationError

from activities.bmaas import BmaasActivities, BmaasClient
from activities.bmaas.snapshot import BmiSnapshot
from activities.bmaas.watcher import BmiWatcher, Observed
from contracts.bmaas import (
    BmaasErrorType,
    BmiState,
    InstanceRunning,
    WaitInstanceGoneInput,
    WaitInstanceRunningInput,
    WaitProgress,
)
from contracts.hub import InfraEnvRef, WaitAgentInput
from contracts.refs import OrderRef
from contracts.worker import FailureReason
from lab.fulfillment.seed import host_labels
from tests.activities.conftest import PRIVATE, Harness, wait_for
from workflows.worker_node import _failure_of


def progress(harness: Harness) -> list[WaitProgress]:
    """The waits' heartbeats, as sent: plain JSON data of WaitProgress."""
    return [WaitProgress.model_validate(d) for d in harness.heartbeats]


async def test_wait_running_returns_every_mac(harness: Harness) -> None:
    await harness.lab.timings(boot_s=60.0)  # booting until the wait has said so
    created = await harness.run(harness.acts.create_worker_instance, harness.slot(0))
    running = await _running_once_a_beat(
        harness, created.instance.id, lambda p: p.state == BmiState.PROVISIONING, "a PROVISIONING heartbeat"
    )

    host = next(h for h in await harness.lab.hosts() if h["bmi_id"] == created.instance.id)
    assert running.macs == sorted(nic["mac"] for nic in host["nics"])
    assert len(running.macs) == 2  # management and fabric NICs: all of them, not just the first
    assert all(mac == mac.lower() and mac.count(":") == 5 for mac in running.macs)
    assert running.name == "order1-worker-0"


async def test_wait_running_normalises_every_nic_as_agents_do_and_fails_a_host_with_no_mac(
    harness: Harness,
) -> None:
    """An InfiniBand NIC's 20-byte address is a MAC like Ethernet's (the Agent reports it too); a host
    whose NICs report no MAC at all cannot be matched to an Agent, so its wait fails at once."""
    await harness.lab.timings(boot_s=0.2)
    ipoib = "80:00:02:08:fe:80:00:00:00:00:00:00:0c:42:a1:03:00:9b:5e:21"
    labels = host_labels("gpu")
    await harness.lab.add_host(
        {"labels": labels, "nics": [{"name": "ib0", "mac": ipoib.upper(), "role": "fabric"}]}
    )
    eui64 = "02:42:ac:ff:fe:11:00:02"
    await harness.lab.add_host({"labels": labels, "nics": [{"name": "p0", "mac": eui64, "role": "fabric"}]})
    # The twin gives the first free host of the class: the seeded GPU host, then these two in turn.
    created = [
        await harness.run(harness.acts.create_worker_instance, harness.slot(i, instance_type="bm-gpu"))
        for i in range(3)
    ]
    by_mac = {}
    for c in created:
        host = next(h for h in await harness.lab.hosts() if h["bmi_id"] == c.instance.id)
        by_mac[host["nics"][0]["mac"]] = c.instance.id

    running = await harness.run(
        harness.acts.wait_instance_running, WaitInstanceRunningInput(bmi_id=by_mac[ipoib])
    )
    assert running.macs == [ipoib]
    order = OrderRef(namespace="tenant-ns", name="order1")
    wait = WaitAgentInput(
        infraenv=InfraEnvRef.for_order(order), order=order, macs=running.macs, deadline=datetime.now(UTC)
    )
    assert wait.macs == [ipoib]  # what the workflow builds from it next is valid

    with pytest.raises(ApplicationError) as failed:
        await harness.run(harness.acts.wait_instance_running, WaitInstanceRunningInput(bmi_id=by_mac[eui64]))
    assert failed.value.type == BmaasErrorType.PROVISIONING_FAILED.value and failed.value.non_retryable
    assert "none of its NICs reports a MAC address" in failed.value.message and eui64 in failed.value.message


async def test_a_wait_that_ends_within_its_first_tick_sends_no_heartbeat(harness: Harness) -> None:
    await harness.lab.timings(boot_s=0.5)
    harness.acts.heartbeat_interval = 60.0
    created = await harness.run(harness.acts.create_worker_instance, harness.slot(0))
    events_before = harness.watcher.stats.events
    await harness.run(
        harness.acts.wait_instance_running, WaitInstanceRunningInput(bmi_id=created.instance.id)
    )
    assert harness.watcher.stats.events > events_before  # the BMI changed while it waited...
    assert harness.heartbeats == []  # ...and told the server nothing: it ended within its tick


async def _calls_during_wait(harness: Harness, index: int, boot_s: float) -> tuple[int, int]:
    await harness.lab.timings(boot_s=boot_s)
    created = await harness.run(harness.acts.create_worker_instance, harness.slot(index))
    beats_before = len(harness.heartbeats)
    before = await harness.lab.stats_total()
    await harness.run(
        harness.acts.wait_instance_running, WaitInstanceRunningInput(bmi_id=created.instance.id)
    )
    after = await harness.lab.stats_total()
    return after - before, len(harness.heartbeats) - beats_before


async def test_wait_calls_do_not_grow_with_boot_time(harness: Harness) -> None:
    short_calls, _ = await _calls_during_wait(harness, 0, boot_s=0.05)
    long_calls, long_beats = await _calls_during_wait(harness, 1, boot_s=3.0)
    assert long_beats >= 5  # the long wait really lasted many heartbeat periods...
    # ...yet cost at most the one seeding GET, like the short one: the stream did the waiting.
    assert short_calls <= 1
    assert long_calls <= 1
    assert harness.watcher.stats.subscriptions == 1


async def test_many_waiters_share_one_stream(harness: Harness) -> None:
    await harness.lab.timings(boot_s=1.0)
    created = [await harness.run(harness.acts.create_worker_instance, harness.slot(i)) for i in range(4)]
    results = await asyncio.gather(
        *(
            harness.run(harness.acts.wait_instance_running, WaitInstanceRunningInput(bmi_id=c.instance.id))
            for c in created
        )
    )
    assert {r.bmi_id for r in results} == {c.instance.id for c in created}
    assert harness.transport.requests["GET /api/private/v1/events/watch"] == 1


async def test_a_waiter_is_woken_by_its_own_bmi_only(harness: Harness) -> None:
    await harness.lab.timings(boot_s=0.5)
    quiet = await harness.run(harness.acts.create_worker_instance, harness.slot(0))
    await harness.run(harness.acts.wait_instance_running, WaitInstanceRunningInput(bmi_id=quiet.instance.id))
    checks = 0

    def never_done(_: object) -> bool:
        nonlocal checks
        checks += 1
        return False

    # A waiter on a BMI that no longer changes, ticking far beyond the test.
    idle = asyncio.create_task(
        harness.watcher.wait(quiet.instance.id, never_done, tick=600.0, on_tick=lambda *_: None)
    )
    try:
        await wait_for(lambda: _checked(lambda: checks), what="the idle waiter's first check")
        events_before = harness.watcher.stats.events
        busy = await harness.run(harness.acts.create_worker_instance, harness.slot(1))
        await harness.run(
            harness.acts.wait_instance_running, WaitInstanceRunningInput(bmi_id=busy.instance.id)
        )
        assert harness.watcher.stats.events - events_before >= 3  # the other BMI went through states
        assert checks == 1  # and none of its events woke this waiter
    finally:
        idle.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await idle


async def test_waits_survive_503s_and_latency(harness: Harness) -> None:
    await harness.lab.timings(boot_s=0.3, wipe_s=0.3)
    await harness.lab.faults(error_rate=0.3, latency_s=0.05, seed=7)
    created = await harness.run_retrying(harness.acts.create_worker_instance, harness.slot(0))
    ref = WaitInstanceRunningInput(bmi_id=created.instance.id)
    running = await harness.run_retrying(harness.acts.wait_instance_running, ref)
    assert len(running.macs) == 2
    await harness.run_retrying(harness.acts.delete_instance, ref)
    gone = await harness.run_retrying(
        harness.acts.wait_instance_gone, WaitInstanceGoneInput(bmi_id=ref.bmi_id)
    )
    assert gone.bmi_id == ref.bmi_id
    await harness.lab.clear_faults()
    assert await harness.lab.get_bmi(ref.bmi_id) is None
    # One BMI, one host, whatever the retries.
    allocations = await harness.lab.audit("HOST_ALLOCATED")
    assert [a["bmi_name"] for a in allocations] == ["order1-worker-0"]


async def test_watch_cut_relists_and_still_wakes(harness: Harness) -> None:
    harness.watcher.poll_initial = 600.0  # no polling: only the re-list after reconnecting can tell
    await harness.lab.timings(boot_s=60.0)  # booting until the stream is down
    created = await harness.run(harness.acts.create_worker_instance, harness.slot(0))
    wait = asyncio.create_task(
        harness.run(harness.acts.wait_instance_running, WaitInstanceRunningInput(bmi_id=created.instance.id))
    )
    try:
        await wait_for(lambda: _has_progress(harness), what="waiter heartbeating")
        lists_before = harness.watcher.stats.lists

        # Cut the stream and keep it down while the BMI becomes RUNNING.
        await harness.lab.faults(routes={"/api/private/v1/events/watch": {"error_rate": 1.0}})
        assert harness.transport.cut_watches() == 1
        await wait_for(lambda: _stream_down(harness), what="stream down")
        await harness.lab.timings(boot_s=0.0)
        await wait_for(
            lambda: _twin_state(harness, created.instance.id, BmiState.RUNNING), what="BMI running"
        )
        assert not wait.done()  # missed the event: nothing can have told it yet

        await harness.lab.clear_faults()
        running = await asyncio.wait_for(wait, 20)
    finally:
        wait.cancel()
    assert len(running.macs) == 2
    assert harness.watcher.stats.lists > lists_before
    assert harness.watcher.stats.disconnects >= 1


async def test_polls_while_the_stream_is_down(harness: Harness) -> None:
    await harness.lab.timings(boot_s=60.0)  # booting until the wait has polled
    created = await harness.run(harness.acts.create_worker_instance, harness.slot(0))
    await harness.lab.faults(routes={"/api/private/v1/events/watch": {"error_rate": 1.0}})
    harness.transport.cut_watches()
    await wait_for(lambda: _stream_down(harness), what="stream down")

    running = await _running_once_a_beat(
        harness, created.instance.id, lambda p: p.observed_via == "polling", "a heartbeat of a polled state"
    )
    assert len(running.macs) == 2
    assert not harness.watcher.streaming
    assert harness.watcher.stats.polls >= 1


async def test_a_bmi_deleted_by_someone_else_while_booting_fails_as_a_provisioning_failure(
    harness: Harness,
) -> None:
    """The tenant reads "could not be provisioned; retrying", not an internal error: the workflow
    maps only FailureReason values and Bmaas* types to a tenant reason."""
    await harness.lab.timings(boot_s=60.0, wipe_s=60.0, deprovision_s=60.0)  # DELETING while waited
    created = await harness.run(harness.acts.create_worker_instance, harness.slot(0))
    waiting = asyncio.ensure_future(
        harness.run(harness.acts.wait_instance_running, WaitInstanceRunningInput(bmi_id=created.instance.id))
    )
    try:
        await wait_for(lambda: _has_progress(harness), what="waiter heartbeating")
        (
            await harness.lab.http.delete(f"{PRIVATE}/baremetal_instances/{created.instance.id}")
        ).raise_for_status()
        with pytest.raises(ApplicationError) as failed:
            await asyncio.wait_for(waiting, 20)
    finally:
        waiting.cancel()
    assert failed.value.type == BmaasErrorType.PROVISIONING_FAILED.value and failed.value.non_retryable
    assert "is being deleted while waiting for it to run" in failed.value.message
    assert _failure_of(failed.value).reason == FailureReason.BMI_PROVISIONING_FAILED
    await harness.lab.timings(wipe_s=0.0, deprovision_s=0.0)


class _Garbling(httpx.AsyncBaseTransport):
    """The twin over real HTTP, except that while `mode` is set a GET of a BMI by id is answered with
    a body the client cannot decode ("encoding": httpx.DecodingError) or a malformed object."""

    def __init__(self) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self.mode: str | None = None
        self.garbled: Counter[str] = Counter()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        mode = self.mode
        if mode is None or request.method != "GET" or "/baremetal_instances/" not in request.url.path:
            return response
        await response.aread()
        await response.aclose()
        self.garbled[mode] += 1
        if mode == "encoding":
            headers = {"content-type": "application/json", "content-encoding": "gzip"}
            return httpx.Response(200, headers=headers, stream=_Body(b"SECRET-BODY is not gzip"))
        return httpx.Response(200, json={"id": "x", "status": "SECRET-BODY"})

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Body(httpx.AsyncByteStream):
    """Streamed, so it is decoded (and fails) when the client reads it, as an answer off the wire."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self._data


async def test_polling_survives_answers_it_cannot_read(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """An answer the client cannot decode, or an object it cannot parse, while the stream is down:
    the poller goes on (one log line per kind, without the body), and the wait still sees its BMI
    run once answers are readable again."""
    await harness.lab.timings(boot_s=60.0)  # booting until the poller has met every garbled answer
    created = await harness.run(harness.acts.create_worker_instance, harness.slot(0))
    bmi_id = created.instance.id
    await harness.lab.faults(routes={f"{PRIVATE}/events/watch": {"error_rate": 1.0}})  # never streams
    transport = _Garbling()
    client = BmaasClient(harness.twin.url, harness.token_file, timeout=10.0, transport=transport)
    watcher = BmiWatcher(client, poll_initial=0.05, poll_max=0.1, reconnect_initial=0.05, reconnect_max=0.2)

    def running(obs: Observed) -> bool:
        return isinstance(obs, BmiSnapshot) and obs.state == BmiState.RUNNING

    waiting = asyncio.ensure_future(watcher.wait(bmi_id, running, tick=0.1, on_tick=lambda *_: None))
    try:

        async def seeded() -> bool:
            return isinstance(watcher.observed(bmi_id), BmiSnapshot)

        async def garbled(mode: str) -> bool:
            return transport.garbled[mode] >= 3  # asked again after the failures: still polling

        await wait_for(seeded, what="the waiter's BMI seeded")
        for mode in ("encoding", "malformed"):
            transport.mode = mode
            await wait_for(functools.partial(garbled, mode), what=f"{mode} answers polled past")
        transport.mode = None
        assert not watcher.streaming
        await harness.lab.timings(boot_s=0.0)
        observed = await asyncio.wait_for(waiting, 20)
    finally:
        waiting.cancel()
        await watcher.stop()
        await client.aclose()
    assert running(observed)
    logged = [r.getMessage() for r in caplog.records if "BMI poll failed" in r.getMessage()]
    # Both are protocol errors now, typed inside the client (they left it as DecodingError and
    # AttributeError, untyped failures of the activities that read).
    assert logged == ["BMI poll failed (BmaasProtocolError); polling goes on"]
    assert not any("SECRET-BODY" in r.getMessage() for r in caplog.records)


async def test_a_dead_poller_is_started_again_by_the_next_wait(harness: Harness) -> None:
    poller = next(t for t in harness.watcher._tasks if t.get_name() == "bmaas-watch-poller")
    poller.cancel()  # as a bug that let an exception out would end it
    with contextlib.suppress(asyncio.CancelledError):
        await poller
    await harness.lab.timings(boot_s=60.0)
    created = await harness.run(harness.acts.create_worker_instance, harness.slot(0))
    await harness.lab.faults(routes={f"{PRIVATE}/events/watch": {"error_rate": 1.0}})
    harness.transport.cut_watches()
    await wait_for(lambda: _stream_down(harness), what="stream down")
    # Only polling can tell the wait its BMI runs now.
    running = await _running_once_a_beat(
        harness, created.instance.id, lambda p: p.observed_via == "polling", "a heartbeat of a polled state"
    )
    assert running.bmi_id == created.instance.id
    assert harness.watcher.stats.polls >= 1


async def test_delete_is_idempotent(harness: Harness) -> None:
    await harness.lab.timings(wipe_s=0.5)
    created = await harness.run(harness.acts.create_worker_instance, harness.slot(0))
    ref = WaitInstanceRunningInput(bmi_id=created.instance.id)
    await harness.run(harness.acts.wait_instance_running, ref)
    first = await harness.run(harness.acts.delete_instance, ref)
    again = await harness.run(harness.acts.delete_instance, ref)  # while DELETING
    assert not first.already_gone and not again.already_gone
    await harness.run(harness.acts.wait_instance_gone, WaitInstanceGoneInput(bmi_id=ref.bmi_id))
    after = await harness.run(harness.acts.delete_instance, ref)
    assert after.already_gone
    assert (await harness.lab.get_bmi(ref.bmi_id)) is None


async def test_wait_gone_reports_a_failed_wipe_and_keeps_waiting(harness: Harness) -> None:
    await harness.lab.faults(wipe_failure_rate=1.0)
    created = await harness.run(harness.acts.create_worker_instance, harness.slot(0))
    ref = WaitInstanceRunningInput(bmi_id=created.instance.id)
    await harness.run(harness.acts.wait_instance_running, ref)
    await harness.run(harness.acts.delete_instance, ref)

    env = harness.env()
    wait = asyncio.create_task(
        harness.run(harness.acts.wait_instance_gone, WaitInstanceGoneInput(bmi_id=ref.bmi_id), env=env)
    )
    stuck = await wait_for(lambda: _stuck_beats(harness), what="stuck heartbeat")
    assert stuck[-1].state == BmiState.DELETING
    assert stuck[-1].deleting_since is not None
    assert "HostSanitizationFailed" in (stuck[-1].stuck_reason or "")
    # Several heartbeat periods later it is still waiting: stuck is never gone.
    beats = len(harness.heartbeats)
    await wait_for(lambda: _more_beats(harness, beats + 3), what="more heartbeats")
    assert not wait.done()
    assert (await harness.lab.get_bmi(ref.bmi_id)) is not None
    env.cancel()
    with pytest.raises(asyncio.CancelledError):
        await wait


async def test_wait_gone_reports_a_slow_wipe_then_returns(harness: Harness) -> None:
    await harness.lab.timings(wipe_s=2.0)
    created = await harness.run(harness.acts.create_worker_instance, harness.slot(0))
    ref = WaitInstanceRunningInput(bmi_id=created.instance.id)
    await harness.run(harness.acts.wait_instance_running, ref)
    await harness.run(harness.acts.delete_instance, ref)
    gone = await harness.run(
        harness.acts.wait_instance_gone, WaitInstanceGoneInput(bmi_id=ref.bmi_id, stuck_after_seconds=0.3)
    )
    assert gone.was_stuck
    assert any(p.stuck and "deleting for more than" in (p.stuck_reason or "") for p in progress(harness))
    assert (await harness.lab.get_bmi(ref.bmi_id)) is None


async def _checked(count: Callable[[], int]) -> bool:
    return count() > 0


async def _has_progress(harness: Harness) -> bool:
    return bool(progress(harness))


async def _running_once_a_beat(
    harness: Harness, bmi_id: str, beat: Callable[[WaitProgress], bool], what: str
) -> InstanceRunning:
    """Wait for a BMI whose boot the test holds (60 s) until a heartbeat of the wait shows `beat`,
    then let it finish booting: the state under test is seen whatever the machine's pace."""
    waiting = asyncio.ensure_future(
        harness.run(harness.acts.wait_instance_running, WaitInstanceRunningInput(bmi_id=bmi_id))
    )
    try:

        async def seen() -> bool:
            return any(beat(p) for p in progress(harness))

        await wait_for(seen, what=what)
        await harness.lab.timings(boot_s=0.0)
        return await asyncio.wait_for(waiting, 20)
    finally:
        waiting.cancel()


async def _stream_down(harness: Harness) -> bool:
    return not harness.watcher.streaming


async def _twin_state(harness: Harness, bmi_id: str, state: BmiState) -> bool:
    bmi = await harness.lab.get_bmi(bmi_id)
    return bmi is not None and bmi["status"]["state"] == state.value


async def _stuck_beats(harness: Harness) -> list[WaitProgress]:
    return [p for p in progress(harness) if p.stuck]


async def _more_beats(harness: Harness, count: int) -> bool:
    return len(harness.heartbeats) >= count


async def test_a_bmi_not_running_by_its_deadline_fails_its_attempt(harness: Harness) -> None:
    """A BMI stuck provisioning (or starting, or stopped) would hold its host for ever: past the
    deadline the workflow gave, the wait fails for good, as a provisioning failure, so the host
    is released, wiped and another one tried."""
    await harness.lab.timings(boot_s=3600)
    created = await harness.run(harness.acts.create_worker_instance, harness.slot(0))
    deadline = datetime.now(UTC) + timedelta(seconds=1)
    with pytest.raises(ApplicationError) as failed:
        await harness.run(
            harness.acts.wait_instance_running,
            WaitInstanceRunningInput(bmi_id=created.instance.id, deadline=deadline),
        )
    assert failed.value.type == BmaasErrorType.PROVISIONING_FAILED.value and failed.value.non_retryable
    assert "not running by its deadline" in failed.value.message
    assert "PROVISIONING" in failed.value.message
    await harness.lab.timings(boot_s=0)


async def test_a_wait_retried_past_its_deadline_still_returns_a_host_that_runs(harness: Harness) -> None:
    """A retry that starts after the deadline (a worker process restarted around it), in a process
    that has not seen the BMI yet: BMaaS is asked once more before the host is failed, and a
    running one is returned, not wiped."""
    await harness.lab.timings(boot_s=0.2)
    created = await harness.run(harness.acts.create_worker_instance, harness.slot(0))
    await harness.run(
        harness.acts.wait_instance_running, WaitInstanceRunningInput(bmi_id=created.instance.id)
    )
    watcher = BmiWatcher(harness.client)
    fresh = BmaasActivities(harness.client, watcher, harness.ignition, heartbeat_interval=0.2)
    past = datetime.now(UTC) - timedelta(minutes=1)
    try:
        running = await harness.run(
            fresh.wait_instance_running, WaitInstanceRunningInput(bmi_id=created.instance.id, deadline=past)
        )
    finally:
        await watcher.stop()
    assert running.bmi_id == created.instance.id and running.macs
