"""The app factory: mounted routers and services, start-up namespaces, event expiry, kubeconfig."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import kubernetes
import yaml
from fastapi import APIRouter, Depends

from lab.hub import hub_user, write_kubeconfig
from lab.hub.testing import running_hub, wait_for


class RecordingService:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def start(self) -> None:
        self.calls.append("start")

    async def stop(self) -> None:
        self.calls.append("stop")


def test_routers_and_services_ride_along(tmp_path: Path) -> None:
    router = APIRouter()

    @router.get("/api/assisted-install/v2/infra-envs/{infra_env_id}/downloads/files")
    async def download(infra_env_id: str) -> dict[str, str]:  # open, like a presigned ignition URL
        return {"id": infra_env_id}

    @router.get("/lab/v1/faults/agents")
    async def agent_faults(user: str = Depends(hub_user)) -> dict[str, str]:
        return {"user": user}

    service = RecordingService()
    with running_hub(
        tmp_path, routers=[router], services=[service], namespaces=["default", "clusters"]
    ) as hub:
        assert service.calls == ["start"]
        with httpx.Client(base_url=hub.url) as anonymous:
            assert anonymous.get("/api/assisted-install/v2/infra-envs/x/downloads/files").json() == {
                "id": "x"
            }
            assert anonymous.get("/lab/v1/faults/agents").status_code == 401
        with httpx.Client(base_url=hub.url, headers=hub.headers(hub.controller_token)) as controller:
            assert controller.get("/lab/v1/faults/agents").json() == {"user": "lab-controllers"}
            names = [n["metadata"]["name"] for n in controller.get("/api/v1/namespaces").json()["items"]]
            assert names == ["clusters", "default"]
    assert service.calls == ["start", "stop"]


def test_events_expire(tmp_path: Path) -> None:
    with running_hub(tmp_path, event_ttl_seconds=1) as hub:
        client = hub.api_client()
        core = kubernetes.client.CoreV1Api(client)
        old: Any = {
            "metadata": {"name": "old"},
            "involvedObject": {"kind": "ClusterOrder", "name": "o"},
            "lastTimestamp": "2020-01-01T00:00:00Z",
        }
        core.create_namespaced_event("default", old)
        wait_for(lambda: not core.list_namespaced_event("default").items, what="the old event to expire")
        client.close()


def test_write_kubeconfig(tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "k" / "config", "https://127.0.0.1:1", "tok", namespace="clusters")
    assert path.stat().st_mode & 0o777 == 0o600
    config = yaml.safe_load(path.read_text())
    assert config["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:1"
    assert config["users"][0]["user"]["token"] == "tok"
    assert config["contexts"][0]["context"]["namespace"] == "clusters"
