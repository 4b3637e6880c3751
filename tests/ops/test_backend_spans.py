"""The span hooks in BmaasClient.request and HubKube's request path, on their failure paths: the span
says what failed (type, status) and never what the server wrote back."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml
from opentelemetry.trace import SpanKind, StatusCode

from activities.bmaas.client import BmaasClient
from activities.bmaas.errors import BmaasApiError
from activities.kube import AGENTS, HubApiError, HubKube
from contracts.bmaas import BmaasErrorType
from contracts.hub import HubErrorType
from lab.http_server import refusing_port
from tests.ops.conftest import SpanCapture

ECHOED = "the-server-echoed-this-secret-value"


async def test_failed_bmaas_call_span(recording: SpanCapture, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t0ken-" + "x" * 30)

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            404, json={"code": 5, "message": f"object with identifier 'bmi-123' not found ({ECHOED})"}
        )

    async with BmaasClient("http://bmaas.test", token, transport=httpx.MockTransport(answer)) as client:
        with pytest.raises(BmaasApiError):
            await client.get_instance("bmi-123")
    (span,) = [s for s in recording.stop() if s.name.startswith("bmaas ")]
    assert span.name == "bmaas GET /baremetal_instances/{id}"
    assert span.kind == SpanKind.CLIENT
    attributes = dict(span.attributes or {})
    assert attributes == {
        "http.request.method": "GET",
        "osac.bmaas.route": "/baremetal_instances/{id}",
        "osac.bmi_id": "bmi-123",
        "error.type": BmaasErrorType.NOT_FOUND.value,
        "http.response.status_code": 404,
    }
    assert span.status.status_code == StatusCode.ERROR
    assert not span.events  # no recorded exception, so no message
    for value in [span.status.description, *map(str, attributes.values())]:
        assert ECHOED not in str(value) and "t0ken" not in str(value)


async def test_failed_hub_call_span(recording: SpanCapture, tmp_path: Path) -> None:
    with refusing_port() as dead:  # nobody can listen there meanwhile
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "hub", "cluster": {"server": f"http://127.0.0.1:{dead}"}}],
                    "users": [{"name": "u", "user": {"token": "hub-token-" + "y" * 30}}],
                    "contexts": [{"name": "hub", "context": {"cluster": "hub", "user": "u"}}],
                    "current-context": "hub",
                }
            )
        )
        kube = HubKube.from_kubeconfig(str(kubeconfig), max_workers=2)
        try:
            with pytest.raises(HubApiError):
                await kube.get(AGENTS, "tenant-a", "host-7")
        finally:
            await kube.close()
    (span,) = [s for s in recording.stop() if s.name.startswith("hub ")]
    assert span.name == "hub get Agent" and span.kind == SpanKind.CLIENT
    attributes = dict(span.attributes or {})
    assert attributes["osac.hub.verb"] == "get"
    assert attributes["osac.hub.resource"] == "agents"
    assert attributes["osac.hub.namespace"] == "tenant-a" and attributes["osac.hub.name"] == "host-7"
    assert attributes["error.type"] == HubErrorType.TRANSPORT.value
    assert "osac.order" not in attributes  # not called from an activity
    assert span.status.status_code == StatusCode.ERROR and not span.events
    assert all("hub-token" not in str(v) for v in attributes.values())
