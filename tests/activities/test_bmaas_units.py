"""Pure parts of the BMaaS activities: error taxonomy, snapshots, token file, CEL quoting."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import cast

import httpx
import pytest
from temporalio.testing import ActivityEnvironment

from activities.assisted import agent_macs
from activities.bmaas import BmaasActivities, IgnitionSource
from activities.bmaas.client import BmaasClient, TokenFile, cel_string
from activities.bmaas.errors import BmaasApiError, error_from_response, redact, transport_error
from activities.bmaas.snapshot import BmiSnapshot
from activities.bmaas.watcher import BmiWatcher
from contracts.bmaas import (
    ORDER_LABEL,
    ORDER_NAMESPACE_LABEL,
    BmaasErrorType,
    BmiState,
    CreateWorkerInstanceInput,
    FindLostInstancesInput,
    LostInstance,
)
from contracts.refs import OrderRef


@pytest.mark.parametrize(
    ("status", "code", "expected", "non_retryable"),
    [
        (400, 3, BmaasErrorType.INVALID_ARGUMENT, True),
        (400, 9, BmaasErrorType.FAILED_PRECONDITION, True),
        (401, 16, BmaasErrorType.UNAUTHENTICATED, True),
        (403, 7, BmaasErrorType.PERMISSION_DENIED, True),
        (404, 5, BmaasErrorType.NOT_FOUND, True),
        # A 404 from whatever is in front of the service (no gateway code) never says a BMI is gone.
        (404, None, BmaasErrorType.UNAVAILABLE, False),
        (409, 6, BmaasErrorType.ALREADY_EXISTS, True),
        (409, 10, BmaasErrorType.CONFLICT, False),
        (409, None, BmaasErrorType.CONFLICT, False),
        (503, 14, BmaasErrorType.UNAVAILABLE, False),
        (500, 13, BmaasErrorType.UNAVAILABLE, False),
        (504, 4, BmaasErrorType.UNAVAILABLE, False),
        (429, 8, BmaasErrorType.UNAVAILABLE, False),
        (502, None, BmaasErrorType.UNAVAILABLE, False),
        (501, 12, BmaasErrorType.UNIMPLEMENTED, True),
    ],
)
def test_error_taxonomy(status: int, code: int | None, expected: BmaasErrorType, non_retryable: bool) -> None:
    body = {"code": code, "message": "server says no", "details": []} if code is not None else None
    err = error_from_response("GET /x", status, body)
    assert err.error_type == expected
    assert err.type == expected.value
    assert err.non_retryable is non_retryable
    if code is not None:
        assert "server says no" in err.message


def test_a_404_page_without_the_gateway_code_is_not_taken_for_a_deleted_bmi() -> None:
    page = "<html><body><h1>404 Not Found</h1></body></html>"
    err = error_from_response("DELETE /baremetal_instances/abc", 404, page)
    assert not err.is_not_found and not err.non_retryable


def test_only_a_not_found_naming_the_bmi_says_it_is_gone() -> None:
    """The gateway answers a route it does not serve with code 5 as well: that one is retried."""
    route = error_from_response(
        "DELETE /baremetal_instances/b1", 404, {"code": 5, "message": "Not Found"}, object_id="b1"
    )
    assert not route.is_not_found and not route.non_retryable
    own = {"code": 5, "message": "object with identifier 'b1' not found"}
    assert error_from_response("DELETE /baremetal_instances/b1", 404, own, object_id="b1").is_not_found


@pytest.mark.parametrize(
    "body",
    [{"code": 5, "message": "Not Found"}, {"code": "NOT_FOUND", "message": "Not Found"}, "404 page", None],
    ids=["gateway-code", "code-name", "text-page", "empty"],
)
@pytest.mark.parametrize("method", ["GET", "POST"])  # a list, a create
async def test_a_404_on_a_route_naming_no_object_is_retried(
    tmp_path: Path, method: str, body: object
) -> None:
    """A list or a create cannot be "not found": its 404 is a route not served (yet: a rollout), and
    failing for good would release a healthy host."""
    token = tmp_path / "token"
    token.write_text("t0ken-" + "x" * 30)

    async def answer(request: httpx.Request) -> httpx.Response:
        if isinstance(body, str):
            return httpx.Response(404, text=body)
        return httpx.Response(404, json=body) if body is not None else httpx.Response(404)

    async with BmaasClient("http://bmaas.test", token, transport=httpx.MockTransport(answer)) as client:
        with pytest.raises(BmaasApiError) as info:
            if method == "GET":
                await client.list_instances("true")
            else:
                await client.create_instance({"metadata": {"name": "o-worker-0"}})
    err = info.value
    assert err.error_type == BmaasErrorType.UNAVAILABLE and not err.non_retryable, err.message
    assert "route not served" in err.message
    # The same answer on a route by id that it does not name is retried too (as before).
    by_id = error_from_response("GET /baremetal_instances/b1", 404, body, object_id="b1")
    assert not by_id.is_not_found and not by_id.non_retryable and "route not served" in by_id.message


@pytest.mark.parametrize(
    ("status", "code", "expected"),
    [
        # Not the caller's bad input: a redirect (an auth proxy's), a timeout, a throttle, a cut.
        (301, None, BmaasErrorType.UNAVAILABLE),
        (302, None, BmaasErrorType.UNAVAILABLE),
        (307, None, BmaasErrorType.UNAVAILABLE),
        (408, None, BmaasErrorType.UNAVAILABLE),
        (421, None, BmaasErrorType.UNAVAILABLE),
        (425, None, BmaasErrorType.UNAVAILABLE),
        (499, None, BmaasErrorType.UNAVAILABLE),
        (499, 1, BmaasErrorType.UNAVAILABLE),
        (505, None, BmaasErrorType.UNAVAILABLE),
        (200, None, BmaasErrorType.UNAVAILABLE),  # an in-band stream error without a code
        # The caller's own: permanent.
        (405, None, BmaasErrorType.INVALID_ARGUMENT),
        (413, None, BmaasErrorType.INVALID_ARGUMENT),
        (422, None, BmaasErrorType.INVALID_ARGUMENT),
    ],
)
def test_statuses_outside_the_map(status: int, code: int | None, expected: BmaasErrorType) -> None:
    body = {"code": code, "message": "m"} if code is not None else "<html>moved</html>"
    err = error_from_response("GET /x", status, body)
    assert err.error_type == expected, err.message
    assert err.non_retryable is (expected == BmaasErrorType.INVALID_ARGUMENT)


def test_error_messages_are_redacted_and_bounded() -> None:
    token = "tok-" + "s" * 40
    err = error_from_response("POST /x", 400, {"code": 3, "message": f"bad {token} " + "x" * 2000}, [token])
    assert token not in err.message
    assert len(err.message) < 600
    assert redact("abc", ["a"]) == "abc"  # too short to be a secret: left alone


_IGNITION = (
    '{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/etc/pull","contents":{"source":'
    '"data:,PULL-SECRET-0123456789abcdef0123456789abcdef"}}]},"systemd":{"units":[{"name":"agent"}]}}'
)


# The same with spaces (as pretty JSON has): no run long enough to look like a secret by its shape.
_SPACED = json.dumps(json.loads(_IGNITION))
_ESCAPED = json.dumps(_IGNITION)[1:-1]
_BASE64 = base64.b64encode(_IGNITION.encode()).decode()


@pytest.mark.parametrize(
    ("text", "secret", "kept"),
    [
        # Quoted as Go's %q and JSON do: escaped.
        (f'invalid spec.user_data "{_ESCAPED}"', _IGNITION, "invalid spec.user_data"),
        # Base64, as a gateway encodes bytes.
        (f"user_data {_BASE64} is not valid", _IGNITION, "is not valid"),
        # Only a part, the server's own quote cut short.
        (f"cannot parse user data near '{_SPACED[60:140]}' at offset 60", _SPACED, "at offset 60"),
        # A part across the 400-character bound on messages: what is left of it is still masked.
        ("at " + "word " * 75 + _SPACED[:90] + " and more", _SPACED, "at word word"),
    ],
)
def test_a_secret_echoed_in_another_form_or_in_part_is_redacted(text: str, secret: str, kept: str) -> None:
    redacted = redact(text, [secret])
    assert kept in redacted and "<redacted>" in redacted, redacted
    assert "PULL-SECRET" not in redacted and "0123456789abcdef" not in redacted, redacted
    for start in range(len(secret) - 15):
        assert secret[start : start + 16] not in redacted, redacted


@pytest.mark.parametrize(
    "quote",
    [
        lambda secret: json.dumps(secret),  # non-ASCII as \\uXXXX
        lambda secret: json.dumps(secret).replace("<", "\\u003c").replace(">", "\\u003e"),  # as Go does
        lambda secret: json.dumps(secret)[:40],  # and only a part
    ],
)
def test_a_secret_quoted_with_escapes_is_redacted(quote: Callable[[str], str]) -> None:
    secret = "mot de passe: crème brûlée <pour> été à la maison, très bien"
    text = redact(f"invalid user_data {quote(secret)} at offset 3", [secret])
    assert text.endswith(" at offset 3") and "<redacted>" in text, text
    assert "crème" not in text and "cr\\u00e8me" not in text and "bien" not in text, text


def test_a_message_cut_short_says_so_also_when_masking_shortened_it() -> None:
    secret = "the-secret-of-the-order-" * 3
    text = redact("word " * 60 + secret[:60] + " and " + "more " * 100, [secret])
    assert len(text) <= 401 and text.endswith("…") and "<redacted>" in text, text


def test_secret_shaped_runs_of_unknown_secrets_are_redacted_and_prose_is_kept() -> None:
    jwt = "eyJhbGciOiJSUzI1NiJ9." + "eyJzdWIiOiJzeXN0ZW0ifQ" * 3 + ".c2lnbmF0dXJl"
    text = redact(f"BMI b-1 failed: cloud-init could not fetch with Bearer {jwt}; retry later", [])
    assert jwt[:30] not in text and text.endswith("Bearer <redacted> retry later"), text
    prose = "host 0b7e2a3c-1f4d-4c6e-9a8b-7d6e5f4c3b2a: no free hosts of instance type bm-standard"
    assert redact(prose, []) == prose


async def test_an_error_redacts_the_token_the_request_was_sent_with(tmp_path: Path) -> None:
    """A token another request reloaded (rotated) while this one was answered: the one this request
    was sent with is what its server echoes."""
    token = tmp_path / "token"
    sent = "first-token-" + "a" * 30
    token.write_text(sent)

    async def answer(request: httpx.Request) -> httpx.Response:
        token.write_text("second-token-" + "b" * 30)
        assert client.token.reload() != sent  # as a concurrent request's 401 does
        header = request.headers["Authorization"]
        return httpx.Response(400, json={"code": 3, "message": f"bad header {header}"})

    client = BmaasClient("http://bmaas.test", token, transport=httpx.MockTransport(answer))
    async with client:
        with pytest.raises(BmaasApiError) as info:
            await client.create_instance({"metadata": {"name": "o-worker-0"}})
    assert sent not in info.value.message and "bad header Bearer <redacted>" in info.value.message


async def test_an_error_inside_the_event_stream_redacts_the_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    sent = "stream-token-" + "c" * 30
    token.write_text(sent)

    async def answer(request: httpx.Request) -> httpx.Response:
        header = request.headers["Authorization"]
        line = json.dumps({"error": {"code": 16, "message": f"token expired: {header}"}})
        return httpx.Response(200, content=(line + "\n").encode())

    async with BmaasClient("http://bmaas.test", token, transport=httpx.MockTransport(answer)) as client:
        with pytest.raises(BmaasApiError) as info:
            async with client.watch(None, idle_timeout=5) as events:
                async for _ in events:
                    pass
    assert sent not in info.value.message and "token expired: Bearer <redacted>" in info.value.message


def test_transport_errors_retry() -> None:
    err = transport_error("GET /x", TimeoutError())
    assert err.type == BmaasErrorType.TRANSPORT.value and not err.non_retryable
    assert "timed out" in err.message


def test_snapshot_macs_are_normalised_as_an_agents_are() -> None:
    """The BMI's side of a match and the Agent's use one rule, so they agree on every spelling."""
    ipoib = "80:00:02:08:FE:80:00:00:00:00:00:00:0C:42:A1:03:00:9B:5E:21"
    reported = ["AA-BB-CC-DD-EE-0F", "aabb.ccdd.ee10", ipoib, "aa:bb:cc:dd:ee:0f", "n/a"]
    snap = BmiSnapshot.from_api(
        {"id": "b1", "status": {"state": "RUNNING", "hardware": {"nics": [{"mac": m} for m in reported]}}}
    )
    assert snap.macs == (
        "80:00:02:08:fe:80:00:00:00:00:00:00:0c:42:a1:03:00:9b:5e:21",
        "aa:bb:cc:dd:ee:0f",
        "aa:bb:cc:dd:ee:10",
    )
    assert snap.unusable_macs == ("n/a",)  # kept apart: nothing the workflow cannot match on
    agent = {"status": {"inventory": {"interfaces": [{"macAddress": m.lower()} for m in reported]}}}
    assert agent_macs(agent) == set(snap.macs)


def test_snapshot_keeps_no_user_data() -> None:
    obj = {
        "id": "b1",
        "metadata": {
            "name": "o-worker-0",
            "tenant": "system",
            "labels": {"osac.openshift.io/cluster-order": "o"},
        },
        "spec": {"user_data": "SECRET-IGNITION", "instance_type": "bm-standard"},
        "status": {
            "state": "BARE_METAL_INSTANCE_STATE_RUNNING",
            "hardware": {"nics": [{"mac": "AA:BB:CC:DD:EE:02"}, {"mac": "aa:bb:cc:dd:ee:01"}]},
        },
    }
    snap = BmiSnapshot.from_api(obj)
    assert snap.state == BmiState.RUNNING
    assert snap.macs == ("aa:bb:cc:dd:ee:01", "aa:bb:cc:dd:ee:02")
    assert snap.is_caas_worker and snap.order_name == "o"
    assert "SECRET-IGNITION" not in repr(snap)
    assert "SECRET-IGNITION" not in snap.worker_instance().model_dump_json()


def test_unknown_state_reads_unspecified() -> None:
    assert BmiState.parse("SOMETHING_NEW") == BmiState.UNSPECIFIED
    assert BmiState.parse(None) == BmiState.UNSPECIFIED


def test_token_file_rereads_on_change(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first-token\n")
    tokens = TokenFile(path)
    assert tokens.get() == "first-token"
    path.write_text("second-token-longer\n")
    assert tokens.get() == "second-token-longer"
    # Same size and an mtime forced back: only a forced reload sees it (the client does that on a 401).
    stat = path.stat()
    path.write_text("third-token-longer!\n")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert tokens.reload() == "third-token-longer!"


def test_token_file_missing_is_retryable(tmp_path: Path) -> None:
    with pytest.raises(BmaasApiError) as info:
        TokenFile(tmp_path / "absent").get()
    assert info.value.type == BmaasErrorType.TOKEN_UNAVAILABLE.value
    assert not info.value.non_retryable


def test_cel_string_escapes() -> None:
    assert cel_string("a'b\\c") == "'a\\'b\\\\c'"


def test_create_input_derives_names() -> None:
    req = CreateWorkerInstanceInput(
        order=OrderRef(namespace="ns", name="order1"),
        slot_index=3,
        instance_type="bm-standard",
        disk_image_id="img",
    )
    assert req.bmi_name == "order1-worker-3"
    assert req.ignition_ref == ("ns", "order1-infraenv")


async def test_a_burst_of_calls_is_sent_a_few_at_a_time_and_all_answered(tmp_path: Path) -> None:
    """A thousand workers starting at once must not pile their calls into the HTTP pool."""
    token = tmp_path / "token"
    token.write_text("t0ken-" + "x" * 30)
    in_flight = peak = 0

    async def answer(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return httpx.Response(200, json={"id": request.url.path.rsplit("/", 1)[-1]})

    transport = httpx.MockTransport(answer)
    async with BmaasClient("http://bmaas.test", token, max_in_flight=4, transport=transport) as client:
        answers = await asyncio.gather(*(client.get_instance(f"bmi-{i}") for i in range(60)))
    assert [a["id"] for a in answers] == [f"bmi-{i}" for i in range(60)]
    assert peak == 4


def _scoped_bmaas(sees: Callable[[str], bool]) -> httpx.MockTransport:
    """A BMaaS where the caller with a token `sees` is shown BMI b1 (RUNNING, of order o1) and the
    canary catalog item; any other caller gets what an identity that cannot see tenant `system`
    gets: empty lists, and a NotFound by id exactly like a deleted object's."""
    bmi = {
        "id": "b1",
        "metadata": {"name": "o1-worker-0", "tenant": "system", "labels": {ORDER_LABEL: "o1"}},
        "status": {"state": "BARE_METAL_INSTANCE_STATE_RUNNING"},
    }
    canary = {"id": "c1", "metadata": {"name": "caas-system-bmi", "tenant": "system"}}

    async def answer(request: httpx.Request) -> httpx.Response:
        visible = sees(request.headers["Authorization"].removeprefix("Bearer "))
        path = request.url.path
        if path.endswith("/baremetal_instance_catalog_items") or path.endswith("/baremetal_instances"):
            items = ([canary] if "catalog" in path else [bmi]) if visible else []
            return httpx.Response(200, json={"size": len(items), "total": len(items), "items": items})
        wanted = path.rsplit("/", 1)[-1]
        if visible and wanted == "b1":
            return httpx.Response(200, json=bmi)
        return httpx.Response(
            404, json={"code": 5, "message": f"object with identifier '{wanted}' not found"}
        )

    return httpx.MockTransport(answer)


async def test_the_canary_seen_with_one_token_is_not_trusted_for_another(tmp_path: Path) -> None:
    """A token rotated to an identity that cannot see CaaS's objects, within the minute a canary
    seen with the old one is trusted: its NotFound is not taken for gone (found by review: a Ready
    worker's host was then taken for lost, and its node destroyed)."""
    token = tmp_path / "token"
    good, wrong = "good-token-" + "g" * 30, "wrong-token-" + "w" * 40
    token.write_text(good)
    transport = _scoped_bmaas(lambda sent: sent == good)
    async with BmaasClient(
        "http://bmaas.test", token, transport=transport, visibility_canary="caas-system-bmi"
    ) as client:
        with pytest.raises(BmaasApiError) as gone:
            await client.get_instance("b-deleted")
        assert gone.value.is_not_found  # the canary seen with the good token
        token.write_text(wrong)
        with pytest.raises(BmaasApiError) as hidden:
            await client.get_instance("b1")
        assert (
            hidden.value.error_type == BmaasErrorType.UNAVAILABLE
            and "not taken for gone" in hidden.value.message
        )


async def test_a_ready_workers_host_is_taken_for_gone_only_on_a_fresh_look_at_the_canary(
    tmp_path: Path,
) -> None:
    """The identity behind the same token loses sight of CaaS's objects (its role changed) within
    the minute a canary seen is trusted: the look for lost hosts asks afresh before it reports a host
    gone, since a node is destroyed on its answer."""
    token = tmp_path / "token"
    token.write_text("t0ken-" + "x" * 30)
    scoped_out = False
    transport = _scoped_bmaas(lambda sent: not scoped_out)
    async with BmaasClient(
        "http://bmaas.test", token, transport=transport, visibility_canary="caas-system-bmi"
    ) as client:
        acts = BmaasActivities(client, cast(BmiWatcher, None), cast(IgnitionSource, None))
        look = FindLostInstancesInput(order=OrderRef(namespace="ns", name="o1"), bmi_ids=["b1", "b-deleted"])
        found = await ActivityEnvironment().run(acts.find_lost_instances, look)
        assert found.lost == [LostInstance(bmi_id="b-deleted")]  # the canary seen and trusted since
        scoped_out = True
        with pytest.raises(BmaasApiError) as hidden:
            await ActivityEnvironment().run(acts.find_lost_instances, look)
        assert hidden.value.error_type == BmaasErrorType.UNAVAILABLE and not hidden.value.non_retryable


async def test_answers_of_another_shape_are_typed_protocol_errors(tmp_path: Path) -> None:
    """Found by review: a GET answering another BMI had the watcher ask again at once, for ever,
    with no heartbeat; a body that could not be decoded, or a BMI whose parts are not objects, left
    the activity as a library exception (an untyped failure retried for ever, never shown as
    BMaaS failing); a `total` of 1e999 (infinity) raised OverflowError."""
    token = tmp_path / "token"
    token.write_text("t0ken-" + "x" * 30)

    asked_for_other = 0

    async def answer(request: httpx.Request) -> httpx.Response:
        nonlocal asked_for_other
        path = request.url.path
        if path.endswith("/other"):
            asked_for_other += 1
            if asked_for_other > 100:  # asked again and again: ended here, not by the test's timeout
                return httpx.Response(400, json={"code": 3, "message": "asked too often"})
            return httpx.Response(200, json={"id": "not-other"})
        if path.endswith("/garbled"):
            return httpx.Response(200, content=b"not gzip", headers={"Content-Encoding": "gzip"})
        if path.endswith("/shapeless"):
            return httpx.Response(200, json={"id": "shapeless", "status": "RUNNING"})
        item = {"id": "a", "metadata": {"tenant": "system"}}
        return httpx.Response(
            200, content=b'{"size": 1, "total": 1e999, "items": [' + json.dumps(item).encode() + b"]}"
        )

    async with BmaasClient("http://bmaas.test", token, transport=httpx.MockTransport(answer)) as client:
        watcher = BmiWatcher(client)
        with pytest.raises(BmaasApiError) as other:
            await watcher.refresh("other")
        assert other.value.error_type == BmaasErrorType.PROTOCOL and not other.value.non_retryable
        assert asked_for_other == 1
        with pytest.raises(BmaasApiError) as garbled:
            await client.get_instance("garbled")
        assert garbled.value.error_type == BmaasErrorType.PROTOCOL and not garbled.value.non_retryable
        with pytest.raises(BmaasApiError) as shapeless:
            BmiSnapshot.from_api(await client.get_instance("shapeless"))
        assert shapeless.value.error_type == BmaasErrorType.PROTOCOL and "status is not an object" in str(
            shapeless.value
        )
        assert [item["id"] for item in await client.list_all("baremetal_instances")] == ["a"]
    for malformed in ({"hardware": {"nics": 5}}, {"conditions": True}):
        with pytest.raises(BmaasApiError) as listed:
            BmiSnapshot.from_api({"id": "a", "status": malformed})
        assert listed.value.error_type == BmaasErrorType.PROTOCOL


async def test_one_malformed_bmi_in_a_relist_is_skipped_not_the_stream_torn_down(tmp_path: Path) -> None:
    """One BMI of another shape, of any order, in the watcher's list: the others are seen, and the
    stream every wait shares is not torn down and listed again every few seconds (found by review)."""
    token = tmp_path / "token"
    token.write_text("t0ken-" + "x" * 30)
    good = {"id": "a", "metadata": {"tenant": "system", "labels": {ORDER_LABEL: "o1"}}}
    bad = {"id": "b", "metadata": {"tenant": "system", "labels": {ORDER_LABEL: "o2"}}, "status": "RUNNING"}

    async def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"size": 2, "total": 2, "items": [good, bad]})

    async with BmaasClient("http://bmaas.test", token, transport=httpx.MockTransport(answer)) as client:
        watcher = BmiWatcher(client)
        await watcher._relist()
        assert isinstance(watcher.observed("a"), BmiSnapshot) and watcher.observed("b") is None
        # Streamed, such a BMI is forgotten if it was known: its waiter asks by id, and is told.
        updated = "EVENT_TYPE_OBJECT_UPDATED"
        watcher._apply_event({"type": updated, "bare_metal_instance": {**bad, "status": {}}})
        assert isinstance(watcher.observed("b"), BmiSnapshot)
        watcher._apply_event({"type": updated, "bare_metal_instance": bad})
        assert watcher.observed("b") is None and isinstance(watcher.observed("a"), BmiSnapshot)


def test_a_bmi_belongs_to_the_order_of_its_name_and_namespace() -> None:
    def bmi(**labels: str) -> BmiSnapshot:
        return BmiSnapshot.from_api({"id": "b1", "metadata": {"tenant": "system", "labels": labels}})

    order = OrderRef(namespace="tenant-a", name="o1")
    assert bmi(**{ORDER_LABEL: "o1", ORDER_NAMESPACE_LABEL: "tenant-a"}).belongs_to(order)
    assert bmi(**{ORDER_LABEL: "o1"}).belongs_to(order)  # created before the namespace label
    elsewhere = bmi(**{ORDER_LABEL: "o1", ORDER_NAMESPACE_LABEL: "tenant-b"})
    assert not elsewhere.belongs_to(order) and elsewhere.order_key == "tenant-b/o1"
    assert not bmi(**{ORDER_LABEL: "o2", ORDER_NAMESPACE_LABEL: "tenant-a"}).belongs_to(order)


async def test_a_not_found_counts_as_gone_only_while_the_token_sees_the_system_canary(tmp_path: Path) -> None:
    """The real server answers an object the caller may not see exactly as a deleted one. With a
    canary, a by-id NotFound is taken for gone only while the token sees the system-owned catalog
    item: a mis-scoped or wrongly rotated token never makes an undeleted, unwiped host count as
    gone. A canary seen is trusted for a while (one look per minute, not one per NotFound)."""
    token = tmp_path / "token"
    token.write_text("t0ken-" + "x" * 30)
    canary_visible = False
    looks = 0

    async def answer(request: httpx.Request) -> httpx.Response:
        nonlocal looks
        if request.url.path.endswith("/baremetal_instance_catalog_items"):
            looks += 1
            assert request.url.params["filter"] == (
                "this.metadata.name == 'caas-system-bmi' && this.metadata.tenant == 'system'"
            )
            items = [{"id": "c1", "metadata": {"name": "caas-system-bmi", "tenant": "system"}}]
            return httpx.Response(200, json={"size": 1, "total": 1, "items": items if canary_visible else []})
        if request.url.path.endswith("/baremetal_instances"):
            return httpx.Response(200, json={"size": 0, "total": 0, "items": []})
        bmi = request.url.path.rsplit("/", 1)[-1]
        return httpx.Response(404, json={"code": 5, "message": f"object with identifier '{bmi}' not found"})

    transport = httpx.MockTransport(answer)
    async with BmaasClient(
        "http://bmaas.test", token, transport=transport, visibility_canary="caas-system-bmi"
    ) as client:
        for call in (client.get_instance, client.delete_instance):
            with pytest.raises(BmaasApiError) as hidden:
                await call("b1")
            assert hidden.value.error_type == BmaasErrorType.UNAVAILABLE and not hidden.value.non_retryable
            assert "does not see the system-owned catalog item 'caas-system-bmi'" in hidden.value.message
            assert "not taken for gone" in hidden.value.message
        # Nothing listed proves nothing either: a release would find nothing to delete.
        with pytest.raises(BmaasApiError) as listed:
            await client.list_instances("true")
        assert listed.value.error_type == BmaasErrorType.UNAVAILABLE
        assert "not taken for gone" in listed.value.message
        assert looks == 3  # a canary not seen is looked for again every time
        canary_visible = True
        for _ in range(3):
            with pytest.raises(BmaasApiError) as gone:
                await client.get_instance("b1")
            assert gone.value.is_not_found
        assert await client.list_instances("true") == []
        assert looks == 4
    # Without a canary (tools, tests), a NotFound naming the object is taken as it is.
    async with BmaasClient("http://bmaas.test", token, transport=transport) as plain:
        with pytest.raises(BmaasApiError) as gone:
            await plain.get_instance("b1")
        assert gone.value.is_not_found and looks == 4
