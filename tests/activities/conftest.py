"""Fixtures for the BMaaS activity tests: a seeded fulfillment twin per test, the client, the shared
watcher and the activities, plus helpers to drive the twin's lab routes and run activities."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from temporalio.api.failure.v1 import Failure
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.bmaas import BmaasActivities, BmaasClient, BmiWatcher
from contracts.bmaas import CreateWorkerInstanceInput
from contracts.refs import OrderRef
from lab.fulfillment.testing import RunningFulfillmentTwin, fulfillment_twin

T = TypeVar("T")

PRIVATE = "/api/private/v1"


class FakeIgnition:
    """An IgnitionSource whose ignition carries a recognisable secret, with an optional hook that runs
    between the activity's list and its create (to stage races)."""

    def __init__(self) -> None:
        self.secret = f"PULL-SECRET-{uuid.uuid4().hex}"
        # More of the ignition after the secret (a test makes it longer than an error message).
        self.padding = ""
        self.calls: list[tuple[str, str]] = []
        self.hook: Callable[[], Awaitable[None]] | None = None

    @property
    def ignition(self) -> str:
        more = ', {"contents": "' + self.padding + '"}' if self.padding else ""
        return (
            '{"ignition": {"version": "3.4.0"}, "storage": {"files": [{"contents": "'
            + self.secret
            + '"}'
            + more
            + "]}}"
        )

    async def discovery_ignition(self, namespace: str, infraenv_name: str) -> str:
        self.calls.append((namespace, infraenv_name))
        if self.hook is not None:
            await self.hook()
        return self.ignition


class CuttableTransport(httpx.AsyncBaseTransport):
    """A real HTTP transport whose open watch streams a test can cut, like a dropped connection."""

    def __init__(self) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self._streams: list[_CuttableStream] = []
        self.requests: Counter[str] = Counter()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests[f"{request.method} {request.url.path}"] += 1
        response = await self._inner.handle_async_request(request)
        if request.url.path.endswith("/events/watch"):
            assert isinstance(response.stream, httpx.AsyncByteStream)
            stream = _CuttableStream(response.stream)
            self._streams.append(stream)
            return httpx.Response(
                status_code=response.status_code,
                headers=response.headers,
                stream=stream,
                extensions=response.extensions,
            )
        return response

    def cut_watches(self) -> int:
        live = [s for s in self._streams if not s.cut_requested.is_set()]
        for stream in live:
            stream.cut_requested.set()
        return len(live)

    async def aclose(self) -> None:
        await self._inner.aclose()


class _CuttableStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream) -> None:
        self._inner = inner
        self.cut_requested = asyncio.Event()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks = self._inner.__aiter__()
        while True:
            next_chunk = asyncio.ensure_future(chunks.__anext__())
            cut = asyncio.ensure_future(self.cut_requested.wait())
            try:
                done, _ = await asyncio.wait({next_chunk, cut}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pending in (next_chunk, cut):
                    pending.cancel()
                    # Retrieve the outcome of whichever finished, so nothing is left unobserved.
                    pending.add_done_callback(lambda f: f.cancelled() or f.exception())
            if next_chunk not in done:
                raise httpx.ReadError("connection cut by the test")
            try:
                chunk = next_chunk.result()
            except StopAsyncIteration:
                return
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class LabApi:
    """The twin's `/lab/v1` routes (faults, timings, stats, hosts) and direct private-API calls."""

    def __init__(self, twin: RunningFulfillmentTwin) -> None:
        self.twin = twin
        self.http = httpx.AsyncClient(
            base_url=twin.url, timeout=30.0, event_hooks={"request": [self._authorize]}
        )

    async def _authorize(self, request: httpx.Request) -> None:
        # The current admin token (a test may rotate it).
        request.headers["Authorization"] = f"Bearer {self.twin.lab.config.admin_token}"

    async def _call(self, method: str, path: str, body: Any = None) -> Any:
        resp = await self.http.request(method, path, json=body)
        resp.raise_for_status()
        return resp.json()

    async def faults(self, **changes: Any) -> Any:
        return await self._call("PATCH", "/lab/v1/faults", changes)

    async def clear_faults(self) -> Any:
        return await self._call("DELETE", "/lab/v1/faults")

    async def timings(self, **changes: float) -> Any:
        return await self._call("PATCH", "/lab/v1/timings", changes)

    async def stats_total(self) -> int:
        return int((await self._call("GET", "/lab/v1/stats"))["total"])

    async def stats(self) -> dict[str, int]:
        return dict((await self._call("GET", "/lab/v1/stats"))["requests"])

    async def audit(self, kind: str) -> list[dict[str, Any]]:
        resp = await self.http.get("/lab/v1/audit", params={"kind": kind})
        resp.raise_for_status()
        return list(resp.json()["records"])

    async def hosts(self) -> list[dict[str, Any]]:
        return list((await self._call("GET", "/lab/v1/hosts"))["items"])

    async def add_host(self, host: dict[str, Any]) -> dict[str, Any]:
        return dict(await self._call("POST", "/lab/v1/hosts", host))

    async def get_bmi(self, bmi_id: str) -> dict[str, Any] | None:
        resp = await self.http.get(f"{PRIVATE}/baremetal_instances/{bmi_id}")
        if resp.status_code == 404:
            return None
        resp.raise_for_status()
        return dict(resp.json())

    async def list_bmis(self, cel: str | None = None) -> list[dict[str, Any]]:
        params = {"filter": cel} if cel else {}
        return list((await self._call_params(f"{PRIVATE}/baremetal_instances", params))["items"])

    async def _call_params(self, path: str, params: dict[str, str]) -> Any:
        resp = await self.http.get(path, params=params)
        resp.raise_for_status()
        return resp.json()

    async def post(self, path: str, body: Any) -> httpx.Response:
        return await self.http.post(PRIVATE + path, json=body)

    async def aclose(self) -> None:
        await self.http.aclose()


class Harness:
    """What a test needs: twin, lab routes, client, watcher, activities and an activity runner."""

    def __init__(
        self,
        twin: RunningFulfillmentTwin,
        lab: LabApi,
        client: BmaasClient,
        watcher: BmiWatcher,
        ignition: FakeIgnition,
        transport: CuttableTransport,
        token_file: Path,
    ) -> None:
        self.twin = twin
        self.lab = lab
        self.client = client
        self.watcher = watcher
        self.ignition = ignition
        self.transport = transport
        self.token_file = token_file
        self.acts = BmaasActivities(client, watcher, ignition, heartbeat_interval=0.2)
        self.heartbeats: list[Any] = []
        self.results: list[Any] = []
        self.errors: list[BaseException] = []
        # Every secret a test hands out; none may ever leave the activities.
        self.secrets: list[str] = [twin.admin_token, self.ignition.secret, self.ignition.ignition]
        # Any part of the secret long enough to tell (a server may quote only a part).
        marker = self.ignition.secret
        self.secrets += [marker[i : i + 16] for i in range(len(marker) - 15)]

    def env(self) -> ActivityEnvironment:
        env = ActivityEnvironment()
        # The product's call timeout, not the environment's 1 s placeholder (a create keeps to it).
        env.info = dataclasses.replace(env.info, start_to_close_timeout=timedelta(seconds=60))
        env.on_heartbeat = lambda *details: self.heartbeats.extend(details)
        return env

    async def run(
        self, fn: Callable[..., Awaitable[T]], *args: Any, env: ActivityEnvironment | None = None
    ) -> T:
        """Run one activity attempt; results and errors are kept for the secrets check."""
        try:
            result = await (env or self.env()).run(fn, *args)
        except BaseException as exc:
            self.errors.append(exc)
            raise
        self.results.append(result)
        return result

    async def run_retrying(self, fn: Callable[..., Awaitable[T]], *args: Any, within: float = 30.0) -> T:
        """Retry retryable failures the way Temporal would (non-retryable ones propagate)."""
        deadline = time.monotonic() + within
        while True:
            try:
                return await self.run(fn, *args)
            except ApplicationError as err:
                if err.non_retryable or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.05)

    def leaked(self, log_text: str) -> list[str]:
        """Which recorded output (as Temporal would store it) or log text contains a secret."""
        converter = pydantic_data_converter.payload_converter
        texts: list[tuple[str, str]] = [("log", log_text)]
        for beat in self.heartbeats:
            texts.append(("heartbeat", converter.to_payloads([beat])[0].data.decode()))
        for result in self.results:
            texts.append(("result", converter.to_payloads([result])[0].data.decode()))
        for error in self.errors:
            failure = Failure()
            pydantic_data_converter.failure_converter.to_failure(error, converter, failure)
            texts.append(("error", str(failure) + repr(error)))
        return [f"{kind}: {text[:200]}" for kind, text in texts for s in self.secrets if s in text]

    def slot(
        self, index: int = 0, order: str = "order1", instance_type: str = "bm-standard"
    ) -> CreateWorkerInstanceInput:
        from contracts.refs import NetworkAttachmentRef

        return CreateWorkerInstanceInput(
            order=OrderRef(namespace="tenant-ns", name=order),
            slot_index=index,
            instance_type=instance_type,
            disk_image_id=self.disk_image_id,
            network_attachment=NetworkAttachmentRef(subnet="subnet-1", security_groups=("sg-1", "sg-2")),
        )

    @property
    def disk_image_id(self) -> str:
        from lab.fulfillment.seed import DISK_IMAGE_NAME, seeded_id

        return seeded_id("disk_image", DISK_IMAGE_NAME)


async def wait_for(probe: Callable[[], Awaitable[T]], *, within: float = 20.0, what: str = "condition") -> T:
    """Poll an async probe until it returns something truthy (deadline, never a fixed sleep)."""
    deadline = time.monotonic() + within
    while True:
        result = await probe()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {within}s (last: {result!r})")
        await asyncio.sleep(0.02)


@pytest.fixture
def twin() -> Iterator[RunningFulfillmentTwin]:
    with fulfillment_twin(hosts=6) as running:
        yield running


@pytest.fixture
def token_file(tmp_path: Path, twin: RunningFulfillmentTwin) -> Path:
    path = tmp_path / "fulfillment-token"
    path.write_text(twin.admin_token + "\n")
    return path


@pytest.fixture
async def harness(
    twin: RunningFulfillmentTwin, token_file: Path, caplog: pytest.LogCaptureFixture
) -> AsyncIterator[Harness]:
    caplog.set_level(logging.DEBUG, logger="activities")
    caplog.set_level(logging.INFO)
    transport = CuttableTransport()
    client = BmaasClient(twin.url, token_file, timeout=10.0, transport=transport)
    # Short backoffs so reconnects and polling happen within the test's time.
    watcher = BmiWatcher(client, poll_initial=0.1, poll_max=0.5, reconnect_initial=0.05, reconnect_max=0.3)
    lab = LabApi(twin)
    h = Harness(twin, lab, client, watcher, FakeIgnition(), transport, token_file)
    watcher.start()
    await watcher.wait_streaming(20.0)
    try:
        yield h
    finally:
        await watcher.stop()
        await client.aclose()
        await lab.clear_faults()
        await lab.aclose()
    # Every test doubles as a secrets check over all it produced.
    log_text = "\n".join(r.getMessage() + str(r.exc_info or "") for r in caplog.get_records("call"))
    assert h.leaked(log_text) == []
