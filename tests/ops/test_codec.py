"""The optional AES-GCM payload codec: round trip, key rotation, the key file re-read, connect()'s
wiring, the codec server the Web UI calls, an encrypted history that replays with the key, and
encrypted failure messages."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
import os
import secrets
import uuid
from pathlib import Path

import httpx
import pytest
from google.protobuf import json_format
from pydantic import SecretStr
from temporalio import activity
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.api.failure.v1 import Failure
from temporalio.client import Client, WorkflowFailureError
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.converter import DataConverter, DefaultFailureConverter
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from lab.http_server import ThreadedServer
from tests.ops.probe_workflows import EchoWorkflow, SecretInput
from worker.codec import (
    ENCODING,
    KEY_ID_METADATA,
    NONCE_BYTES,
    AesGcmCodec,
    CodecConfigError,
    KeyRing,
    KeyRingSource,
    PayloadDecryptError,
    codec_from_env,
    data_converter,
    data_converter_from_env,
    generate_key_entry,
)
from worker.codec_server import create_codec_app
from worker.settings import CodecSettings
from worker.telemetry import Telemetry
from worker.temporal_client import connect

UI_ORIGIN = "http://localhost:8233"


def _key() -> str:
    return base64.b64encode(secrets.token_bytes(32)).decode()


def _payloads(*texts: str) -> list[Payload]:
    return [Payload(metadata={"encoding": b"json/plain"}, data=f'"{t}"'.encode()) for t in texts]


async def test_round_trip_hides_the_plaintext() -> None:
    codec = AesGcmCodec(KeyRing.parse(f"k1={_key()}"))
    original = _payloads("pull-secret-abc", "")
    encoded = await codec.encode(original)
    for payload in encoded:
        assert payload.metadata["encoding"] == ENCODING
        assert payload.metadata[KEY_ID_METADATA] == b"k1"
        assert b"pull-secret-abc" not in payload.SerializeToString()
    # A fresh nonce per payload: the same input never encrypts the same way twice.
    assert (await codec.encode(original[:1]))[0].data != encoded[0].data
    assert await codec.decode(encoded) == original
    # Payloads written before encryption was on pass through.
    assert await codec.decode(original) == original


async def test_key_rotation_decodes_old_payloads_and_encodes_with_the_new_key() -> None:
    old, new = _key(), _key()
    before = AesGcmCodec(KeyRing.parse(f"old={old}"))
    written_before = await before.encode(_payloads("a"))
    # Step 1 of a rotation: the new key is known everywhere but does not encrypt yet.
    during = AesGcmCodec(KeyRing.parse(f"old={old},new={new}"))
    assert (await during.encode(_payloads("b")))[0].metadata[KEY_ID_METADATA] == b"old"
    # Step 2: the new key encrypts; the old one still decrypts what was written with it.
    after = AesGcmCodec(KeyRing.parse(f"old={old}\nnew={new}", encode_key="new"))
    written_after = await after.encode(_payloads("c"))
    assert written_after[0].metadata[KEY_ID_METADATA] == b"new"
    assert await after.decode(written_before + written_after) == _payloads("a", "c")
    # A process that never got the new key cannot read new payloads, and says which key it lacks.
    with pytest.raises(PayloadDecryptError, match="'new'"):
        await before.decode(written_after)


async def test_tampered_or_misattributed_payloads_do_not_decrypt() -> None:
    k1, k2 = _key(), _key()
    codec = AesGcmCodec(KeyRing.parse(f"k1={k1},k2={k2}"))
    (payload,) = await codec.encode(_payloads("x"))
    tampered = Payload()
    tampered.CopyFrom(payload)
    tampered.data = payload.data[:-1] + bytes([payload.data[-1] ^ 1])
    with pytest.raises(PayloadDecryptError):
        await codec.decode([tampered])
    # The key id is authenticated: relabelling a payload with another key of the ring fails.
    relabelled = Payload()
    relabelled.CopyFrom(payload)
    relabelled.metadata[KEY_ID_METADATA] = b"k2"
    with pytest.raises(PayloadDecryptError):
        await codec.decode([relabelled])


async def test_truncated_ciphertext_is_a_decrypt_error() -> None:
    """Shorter than the nonce (and tag), AESGCM raised a bare ValueError: the codec server's 500."""
    codec = AesGcmCodec(KeyRing.parse(f"k1={_key()}"))
    (sealed,) = await codec.encode(_payloads("x"))
    for length in (0, 5, NONCE_BYTES - 1, NONCE_BYTES, NONCE_BYTES + 15):
        short = Payload()
        short.CopyFrom(sealed)
        short.data = sealed.data[:length]
        with pytest.raises(PayloadDecryptError, match="truncated"):
            await codec.decode([short])


def test_key_ring_errors_never_show_key_material() -> None:
    good = _key()
    short = base64.b64encode(b"0123456789").decode()
    cases = {
        f"k1={short}": "16, 24 or 32 bytes",
        "k1=not-base64!!": "not valid base64",
        f"k1={good},k1={_key()}": "listed twice",
        f"bad id={good}": "id=base64",
        "# nothing but a comment": "empty",
    }
    for text, message in cases.items():
        with pytest.raises(CodecConfigError, match=message) as err:
            KeyRing.parse(text)
        assert good not in str(err.value) and short not in str(err.value)
    with pytest.raises(CodecConfigError, match="not in the key ring"):
        KeyRing.parse(f"k1={good}", encode_key="k2")
    entry = generate_key_entry("2025-06")
    assert KeyRing.parse(entry).encode_key_id == "2025-06"
    with pytest.raises(CodecConfigError, match="key ids are"):
        generate_key_entry("2025-06\n")  # `$` alone would let a trailing newline through


async def test_rotated_key_file_is_picked_up_without_a_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys_file = tmp_path / "codec-keys"
    old, new = _key(), _key()
    keys_file.write_text(f"# the ring\nold={old}\n")
    codec = AesGcmCodec(KeyRingSource(CodecSettings(keys_file=keys_file)))
    written_old = await codec.encode(_payloads("a"))
    # A Secret update lands as a new file swapped in (what the kubelet does).
    staged = tmp_path / "codec-keys.new"
    staged.write_text(f"new={new}\nold={old}\n")
    os.replace(staged, keys_file)
    written_new = await codec.encode(_payloads("b"))
    assert written_new[0].metadata[KEY_ID_METADATA] == b"new"
    assert await codec.decode(written_old + written_new) == _payloads("a", "b")
    # A broken file mid-rotation keeps the last good ring, said once, and is not read again (on
    # every payload) until it changes.
    with caplog.at_level(logging.WARNING, logger="worker.codec"):
        keys_file.write_text("garbage")
        for _ in range(3):
            assert await codec.decode(written_new) == _payloads("b")
    warnings = [r for r in caplog.records if r.name == "worker.codec"]
    assert len(warnings) == 1 and str(keys_file) in warnings[0].getMessage()
    assert "garbage" not in warnings[0].getMessage()
    reads = 0
    real_read = KeyRing.from_settings

    def counted(settings: CodecSettings) -> KeyRing | None:
        nonlocal reads
        reads += 1
        return real_read(settings)

    monkeypatch.setattr(KeyRing, "from_settings", staticmethod(counted))
    await codec.encode(_payloads("c"))
    assert reads == 0
    keys_file.write_text(f"newer={_key()}\nnew={new}\n")
    assert (await codec.encode(_payloads("d")))[0].metadata[KEY_ID_METADATA] == b"newer"
    assert reads == 1


async def test_connect_wires_codec_and_tracing(
    temporal_env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = temporal_env.client.service_client.config.target_host
    monkeypatch.delenv("OSAC_CODEC_KEYS", raising=False)
    monkeypatch.delenv("OSAC_CODEC_KEYS_FILE", raising=False)
    plain = await connect(target, temporal_env.client.namespace, telemetry=Telemetry())
    assert plain.data_converter.payload_codec is None
    assert not any(isinstance(i, TracingInterceptor) for i in plain.config()["interceptors"])

    monkeypatch.setenv("OSAC_CODEC_KEYS", f"k1={_key()}")
    traced = await connect(target, temporal_env.client.namespace, telemetry=Telemetry(tracing=True))
    assert isinstance(traced.data_converter.payload_codec, AesGcmCodec)
    assert any(isinstance(i, TracingInterceptor) for i in traced.config()["interceptors"])


def test_codec_server_for_the_web_ui() -> None:
    codec = AesGcmCodec(KeyRing.parse(f"k1={_key()}"))
    with (
        ThreadedServer(create_codec_app(codec, [UI_ORIGIN])) as server,
        httpx.Client(base_url=server.url, timeout=10.0) as http,
    ):
        body = json_format.MessageToJson(Payloads(payloads=_payloads("hello")))
        headers = {"Content-Type": "application/json", "X-Namespace": "default", "Origin": UI_ORIGIN}
        encoded = http.post("/encode", content=body, headers=headers)
        assert encoded.status_code == 200
        assert encoded.headers["access-control-allow-origin"] == UI_ORIGIN
        wire = encoded.json()["payloads"][0]
        assert base64.b64decode(wire["metadata"]["encoding"]) == ENCODING
        decoded = http.post("/decode", content=encoded.content, headers=headers)
        assert decoded.status_code == 200
        assert json_format.Parse(decoded.content, Payloads()) == Payloads(payloads=_payloads("hello"))

        # The browser's preflight: allowed for the UI's origin only.
        preflight = {
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type,x-namespace",
        }
        ok = http.options("/decode", headers={**preflight, "Origin": UI_ORIGIN})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == UI_ORIGIN
        denied = http.options("/decode", headers={**preflight, "Origin": "http://evil.example"})
        assert denied.status_code == 400
        assert "access-control-allow-origin" not in denied.headers
        stranger = http.post(
            "/decode", content=encoded.content, headers={**headers, "Origin": "http://evil.example"}
        )
        assert "access-control-allow-origin" not in stranger.headers

        # Bad input and unknown keys are clear 400s.
        assert http.post("/decode", content=b"{not json", headers=headers).status_code == 400
        plain = http.post("/decode", content=body, headers=headers)  # not encrypted: passes through
        assert json_format.Parse(plain.content, Payloads()) == Payloads(payloads=_payloads("hello"))
        other = AesGcmCodec(KeyRing.parse(f"k9={_key()}"))
        foreign = json_format.MessageToJson(Payloads(payloads=asyncio.run(other.encode(_payloads("x")))))
        unknown = http.post("/decode", content=foreign, headers=headers)
        assert unknown.status_code == 400 and "k9" in unknown.json()["message"]
        assert http.get("/encode").status_code == 405


def test_codec_server_answers_bad_input_with_400() -> None:
    codec = AesGcmCodec(KeyRing.parse(f"k1={_key()}"))
    (sealed,) = asyncio.run(codec.encode(_payloads("x")))
    truncated = Payload()
    truncated.CopyFrom(sealed)
    truncated.data = sealed.data[:5]
    headers = {"Content-Type": "application/json"}
    with (
        ThreadedServer(create_codec_app(codec, [UI_ORIGIN])) as server,
        httpx.Client(base_url=server.url, timeout=10.0) as http,
    ):
        short = http.post("/decode", content=json_format.MessageToJson(Payloads(payloads=[truncated])))
        assert short.status_code == 400 and "truncated" in short.json()["message"]
        for body in (b"\xff\xfe{}", b'{"payloads": [{"data": "\xe9"}]}'):
            answer = http.post("/decode", content=body, headers=headers)
            assert answer.status_code == 400 and "UTF-8" in answer.json()["message"], body
        for body in (b"", b"null", b"[1]", b'{"payloads": 1}'):
            answer = http.post("/encode", content=body, headers=headers)
            assert answer.status_code == 400 and "protobuf JSON" in answer.json()["message"], body


@activity.defn(name="shout")
async def shout(note: str) -> str:
    return note.upper()


def _encrypting_client(temporal_env: WorkflowEnvironment) -> tuple[Client, DataConverter]:
    """A client of the test server whose payloads (and failures) are encrypted with a fresh key."""
    converter = data_converter(AesGcmCodec(KeyRing.parse(f"k1={_key()}")))
    config = temporal_env.client.config()
    config["data_converter"] = converter
    return Client(**config), converter


async def test_encrypted_history_replays_with_the_key(temporal_env: WorkflowEnvironment) -> None:
    client, converter = _encrypting_client(temporal_env)
    task_queue = f"codec-{uuid.uuid4().hex[:6]}"
    note = f"tenant-note-{uuid.uuid4().hex}"
    async with Worker(client, task_queue=task_queue, workflows=[EchoWorkflow], activities=[shout]):
        handle = await client.start_workflow(
            EchoWorkflow.run, SecretInput(note=note), id=f"echo-{uuid.uuid4().hex[:6]}", task_queue=task_queue
        )
        assert await handle.result() == f"echo: {note.upper()}"
    history = await handle.fetch_history()

    # What the server stores is ciphertext: input, activity input and result, the summary, the result.
    raw = history.to_json()
    assert note not in raw and note.upper() not in raw and "Shout the note" not in raw
    started = history.events[0].workflow_execution_started_event_attributes
    assert started.input.payloads[0].metadata["encoding"] == ENCODING

    # Replays with the key; without it the history cannot even be read.
    result = await Replayer(workflows=[EchoWorkflow], data_converter=converter).replay_workflow(history)
    assert result.replay_failure is None
    stranger = data_converter(AesGcmCodec(KeyRing.parse(f"k2={_key()}")))
    # The task failure's message is encrypted too (it may quote a payload): only its type shows.
    with pytest.raises(Exception, match="PayloadDecryptError"):
        await Replayer(workflows=[EchoWorkflow], data_converter=stranger).replay_workflow(history)


def test_codec_is_off_unless_keys_are_configured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OSAC_CODEC_KEYS", "OSAC_CODEC_KEYS_FILE", "OSAC_CODEC_ENCODE_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert not CodecSettings().enabled
    assert codec_from_env() is None and data_converter_from_env().payload_codec is None
    assert not CodecSettings(keys=SecretStr("  ")).enabled
    monkeypatch.setenv("OSAC_CODEC_KEYS", f"k1={_key()},k2={_key()}")
    monkeypatch.setenv("OSAC_CODEC_ENCODE_KEY", "k2")
    codec = codec_from_env()
    assert isinstance(codec, AesGcmCodec)
    assert isinstance(data_converter_from_env().payload_codec, AesGcmCodec)
    assert asyncio.run(codec.encode(_payloads("x")))[0].metadata[KEY_ID_METADATA] == b"k2"


@activity.defn(name="shout")
async def shout_refusing(note: str) -> str:
    raise ApplicationError(f"refused: {note}", type="Refused", non_retryable=True)


async def test_failure_messages_and_stack_traces_are_encrypted(temporal_env: WorkflowEnvironment) -> None:
    client, _ = _encrypting_client(temporal_env)
    task_queue = f"codec-{uuid.uuid4().hex[:6]}"
    note = f"tenant-note-{uuid.uuid4().hex}"
    async with Worker(client, task_queue=task_queue, workflows=[EchoWorkflow], activities=[shout_refusing]):
        handle = await client.start_workflow(
            EchoWorkflow.run, SecretInput(note=note), id=f"echo-{uuid.uuid4().hex[:6]}", task_queue=task_queue
        )
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
    # The caller, with the key, reads the failure as raised.
    cause = failed.value.cause
    assert isinstance(cause, ActivityError) and isinstance(cause.cause, ApplicationError)
    assert cause.cause.message == f"refused: {note}" and cause.cause.type == "Refused"
    # The server holds neither the message nor the stack trace (which names this file).
    raw = (await handle.fetch_history()).to_json()
    assert note not in raw and "refused:" not in raw
    assert "test_codec.py" not in raw and "shout_refusing" not in raw


async def test_failures_written_with_or_without_encoded_attributes_read_both_ways() -> None:
    """Histories written before the failure converter changed (message in plaintext) stay readable,
    and a process still on the old converter reads the new ones."""
    encrypted = data_converter(AesGcmCodec(KeyRing.parse(f"k1={_key()}")))
    plain = dataclasses.replace(encrypted, failure_converter_class=DefaultFailureConverter)

    async def written_by(converter: DataConverter) -> Failure:
        failure = Failure()
        try:
            try:
                raise KeyError("inner-secret")
            except KeyError as inner:
                raise ApplicationError("outer-secret", type="Refused") from inner
        except ApplicationError as err:
            await converter.encode_failure(err, failure)
        return failure

    old_failure = await written_by(plain)
    assert old_failure.message == "outer-secret"  # what the plain converter left on the server
    new_failure = await written_by(encrypted)
    assert "secret" not in str(new_failure)
    for writer_failure in (old_failure, new_failure):
        for reader in (encrypted, plain):
            copy = Failure()
            copy.CopyFrom(writer_failure)
            read = await reader.decode_failure(copy)
            assert isinstance(read, ApplicationError)
            assert read.message == "outer-secret" and read.type == "Refused"
            assert "inner-secret" in str(read.__cause__)
