"""The codec server's shared credential (OSAC_CODEC_SERVER_AUTH_FILE): required on /encode and
/decode when set, re-read when its file changes, and the warning when the server is exposed without it."""

from __future__ import annotations

import base64
import logging
import os
import secrets
from pathlib import Path
from typing import Any

import httpx
import pytest
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads
from typer.testing import CliRunner

from lab.http_server import ThreadedServer
from worker.cli import codec_app
from worker.codec import AesGcmCodec, KeyRing
from worker.codec_server import AuthFile, create_codec_app
from worker.settings import ConfigError

UI_ORIGIN = "http://localhost:8233"
VARIABLE = "OSAC_CODEC_SERVER_AUTH_FILE"
# Missing, empty, wrong, a prefix, longer, without its scheme, another case: all refused.
WRONG_HEADERS = (None, "", "Bearer wrong", "Bearer s3cre", "Bearer s3cret2", "s3cret", "bearer s3cret")


def _key() -> str:
    return base64.b64encode(secrets.token_bytes(32)).decode()


def _body() -> str:
    return json_format.MessageToJson(
        Payloads(payloads=[Payload(metadata={"encoding": b"json/plain"}, data=b'"hello"')])
    )


def test_encode_and_decode_want_the_credential(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    auth_file = tmp_path / "auth"
    auth_file.write_text("Bearer s3cret\n")  # a Secret's trailing newline is no part of the value
    codec = AesGcmCodec(KeyRing.parse(f"k1={_key()}"))
    base = {"Content-Type": "application/json", "Origin": UI_ORIGIN}
    with (
        ThreadedServer(create_codec_app(codec, [UI_ORIGIN], AuthFile(auth_file))) as server,
        httpx.Client(base_url=server.url, timeout=10.0) as http,
    ):

        def post(path: str, authorization: str | None, content: Any = None) -> httpx.Response:
            headers = base if authorization is None else {**base, "Authorization": authorization}
            return http.post(path, content=_body() if content is None else content, headers=headers)

        for path in ("/encode", "/decode"):
            for wrong in WRONG_HEADERS:
                refused = post(path, wrong)
                assert refused.status_code == 401, (path, wrong)
                assert refused.headers["www-authenticate"].startswith("Bearer")
                # The UI can read why (CORS headers on the refusal too).
                assert refused.headers["access-control-allow-origin"] == UI_ORIGIN
            # Refused before the body is looked at: no 400 that tells a stranger anything.
            assert post(path, None, content=b"\xff").status_code == 401
        encoded = post("/encode", "Bearer s3cret")
        assert encoded.status_code == 200
        decoded = post("/decode", "Bearer s3cret", content=encoded.content)
        assert decoded.status_code == 200
        assert json_format.Parse(decoded.content, Payloads()) == json_format.Parse(_body(), Payloads())

        # The browser's preflight carries no credential and still passes; /healthz stays open.
        preflight = http.options(
            "/decode",
            headers={
                "Origin": UI_ORIGIN,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization,content-type,x-namespace",
            },
        )
        assert preflight.status_code == 200
        assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
        assert http.get("/healthz").status_code == 200

        # A rotated Secret (a new file swapped in) applies without a restart.
        staged = tmp_path / "auth.new"
        staged.write_text("Bearer n3w")
        os.replace(staged, auth_file)
        assert post("/encode", "Bearer s3cret").status_code == 401
        assert post("/encode", "Bearer n3w").status_code == 200

        # A file that cannot be used lets nothing through (fail closed), said once.
        with caplog.at_level(logging.WARNING, logger="worker.codec_server"):
            auth_file.unlink()
            for _ in range(3):
                assert post("/decode", "Bearer n3w").status_code == 503
        warnings = [r.getMessage() for r in caplog.records if r.name == "worker.codec_server"]
        assert len(warnings) == 1 and VARIABLE in warnings[0]
        auth_file.write_text("Bearer n3w\n")
        assert post("/encode", "Bearer n3w").status_code == 200


@pytest.mark.parametrize(
    ("content", "problem"),
    [(None, "cannot read it"), ("  \n", "empty"), ("Bearer a\nBearer b\n", "more than one line")],
)
def test_an_unusable_credential_file_is_a_config_error(
    tmp_path: Path, content: str | None, problem: str
) -> None:
    auth_file = tmp_path / "auth"
    if content is not None:
        auth_file.write_text(content)
    with pytest.raises(ConfigError) as err:
        AuthFile(auth_file)
    (line,) = err.value.problems
    assert line.startswith(f"{VARIABLE}={auth_file}: ") and problem in line


def test_codec_serve_warns_when_exposed_without_a_credential(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    served: list[Any] = []
    monkeypatch.setattr("worker.cli.uvicorn.run", lambda app, **options: served.append(app))
    monkeypatch.setenv("OSAC_CODEC_KEYS", f"k1={_key()}")
    for name in ("OSAC_CODEC_KEYS_FILE", VARIABLE):
        monkeypatch.delenv(name, raising=False)
    runner = CliRunner()

    def serve(bind: str) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            result = runner.invoke(codec_app, ["serve", "--bind", bind])
        assert result.exit_code == 0, result.output
        return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]

    for bind in ("127.0.0.1:8089", "localhost:8089", "[::1]:8089"):
        assert serve(bind) == [], bind
    for bind in ("0.0.0.0:8089", ":8089", "10.1.2.3:8089", "[::]:8089", "codec.example.com:8089"):
        (warning,) = serve(bind)
        assert VARIABLE in warning and "without a credential" in warning, bind

    # With the credential: no warning, and the app it serves wants it.
    auth_file = tmp_path / "auth"
    auth_file.write_text("Bearer s3cret")
    monkeypatch.setenv(VARIABLE, str(auth_file))
    assert serve("0.0.0.0:8089") == []
    with (
        ThreadedServer(served[-1]) as server,
        httpx.Client(base_url=server.url, timeout=10.0) as http,
    ):
        assert http.post("/encode", content=_body()).status_code == 401
        granted = http.post("/encode", content=_body(), headers={"Authorization": "Bearer s3cret"})
        assert granted.status_code == 200

    # A credential file that cannot be read: exit 2 naming the variable, before serving anything.
    monkeypatch.setenv(VARIABLE, str(tmp_path / "missing"))
    count = len(served)
    refused = runner.invoke(codec_app, ["serve", "--bind", "0.0.0.0:8089"])
    assert refused.exit_code == 2 and f"{VARIABLE}={tmp_path / 'missing'}" in refused.output
    assert len(served) == count
