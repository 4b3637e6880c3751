"""assisted-service's REST endpoints that hosts use, mounted on the hub's own base URL.

- `GET  /api/assisted-install/v2/infra-envs/{id}/downloads/files?file_name=discovery.ign&api_key=…`
  the discovery ignition (the `api_key` is the InfraEnv's signed image token, as in the real URL);
- `POST /api/assisted-install/v2/infra-envs/{id}/hosts` agent registration, authenticated by the
  InfraEnv's agent token in `X-Secret-Key` (or `Authorization: Bearer`); body
  `{"host_id": …, "discovery_agent_version": …, "inventory": {"interfaces": [{"mac_address": …}], …}}`;
- `GET  /images/{id}?api_key=…` a stand-in for the discovery ISO (the image service's URL shape).

Errors use assisted-service's JSON error shape `{"code", "href", "id", "kind": "Error", "reason"}`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from lab.hub_controllers.assisted_images import find_infra_env, pull_secret_of
from lab.hub_controllers.constants import AGENT_AUTH_HEADER, ASSISTED_API_PREFIX, IGNITION_FILE_NAME
from lab.hub_controllers.ignition import render_discovery_ignition
from lab.hub_controllers.informer import Informer
from lab.hub_controllers.inventory import Inventory
from lab.hub_controllers.kube import ApiError, Obj
from lab.hub_controllers.registration import AgentRegistrar, RegistrationRefused, valid_host_id
from lab.hub_controllers.tokens import TokenAudience, TokenSigner


@dataclass(frozen=True)
class AssistedDeps:
    infra_envs: Informer
    secrets: Informer
    registrar: AgentRegistrar
    signer: TokenSigner
    base_url: str


def _error(code: int, reason: str) -> JSONResponse:
    return JSONResponse(
        {"code": str(code), "href": "", "id": code, "kind": "Error", "reason": reason}, status_code=code
    )


def _bearer(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    return auth[7:].strip() if auth.lower().startswith("bearer ") else None


def assisted_router(deps: Callable[[], AssistedDeps | None]) -> APIRouter:
    router = APIRouter(tags=["assisted-service"])

    def lookup(infra_env_id: str) -> tuple[AssistedDeps, Obj] | JSONResponse:
        current = deps()
        if current is None or not current.infra_envs.synced:
            return _error(503, "The installation service is starting")
        infra_env = find_infra_env(current.infra_envs, infra_env_id)
        if infra_env is None:
            return _error(404, f"Failed to find infra env {infra_env_id}")
        return current, infra_env

    @router.get(ASSISTED_API_PREFIX + "/infra-envs/{infra_env_id}/downloads/files")
    async def download_file(
        infra_env_id: str, request: Request, file_name: str = "", api_key: str = ""
    ) -> Response:
        found = lookup(infra_env_id)
        if isinstance(found, JSONResponse):
            return found
        current, infra_env = found
        token = api_key or _bearer(request)
        if not current.signer.verify(token, infra_env_id, TokenAudience.IMAGE):
            return _error(401, "Unauthorized")
        if file_name != IGNITION_FILE_NAME:
            return _error(400, f"Unsupported file name {file_name!r}")
        m, spec = infra_env["metadata"], infra_env.get("spec") or {}
        secret_name = (spec.get("pullSecretRef") or {}).get("name", "")
        pull_secret = pull_secret_of(current.secrets.get(f"{m['namespace']}/{secret_name}"))
        if pull_secret is None:
            return _error(409, "The pull secret of this infra env is missing or invalid")
        document = render_discovery_ignition(
            service_url=current.base_url,
            infra_env_id=infra_env_id,
            agent_token=current.signer.issue(infra_env_id, TokenAudience.AGENT),
            pull_secret=pull_secret,
            ssh_authorized_key=spec.get("sshAuthorizedKey"),
        )
        return Response(
            document,
            media_type="application/octet-stream",
            headers={"Content-Disposition": f'attachment; filename="{IGNITION_FILE_NAME}"'},
        )

    @router.get("/images/{infra_env_id}")
    async def download_iso(infra_env_id: str, api_key: str = "") -> Response:
        found = lookup(infra_env_id)
        if isinstance(found, JSONResponse):
            return found
        current, _ = found
        if not current.signer.verify(api_key, infra_env_id, TokenAudience.IMAGE):
            return _error(401, "Unauthorized")
        # Hosts in this lab boot the ignition through BMaaS user data; the ISO is only a stand-in.
        return Response(b"CD001 lab discovery ISO placeholder\n", media_type="application/octet-stream")

    @router.post(ASSISTED_API_PREFIX + "/infra-envs/{infra_env_id}/hosts")
    async def register_host(infra_env_id: str, request: Request) -> Response:
        current = deps()
        token = request.headers.get(AGENT_AUTH_HEADER) or _bearer(request)
        # Authentication comes first, as in the real service: a stranger learns nothing.
        if current is not None and not current.signer.verify(token, infra_env_id, TokenAudience.AGENT):
            return _error(401, "Unauthorized")
        found = lookup(infra_env_id)
        if isinstance(found, JSONResponse):
            return found
        current, infra_env = found
        try:
            body: Any = json.loads(await request.body() or b"{}")
        except ValueError:
            return _error(400, "The request body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "The request body must be an object")
        host_id = str(body.get("host_id") or "")
        if not valid_host_id(host_id):
            return _error(400, f"Invalid host id {host_id!r}")
        inventory: Any = body.get("inventory") or {}
        if isinstance(inventory, str):  # the real agent posts the inventory as a JSON string
            try:
                inventory = json.loads(inventory)
            except ValueError:
                return _error(400, "The inventory is not JSON")
        if not isinstance(inventory, dict):
            return _error(400, "The inventory must be an object")
        typed_inventory: Inventory = inventory
        try:
            registered = await current.registrar.register(infra_env, host_id, typed_inventory)
        except RegistrationRefused as exc:
            return _error(exc.code, exc.reason)
        except ApiError as exc:
            return _error(503 if exc.code >= 500 else 409, f"Could not record the host: {exc.reason}")
        return JSONResponse(
            {
                "id": host_id,
                "infra_env_id": infra_env_id,
                "kind": "Host",
                "href": f"{ASSISTED_API_PREFIX}/infra-envs/{infra_env_id}/hosts/{host_id}",
                "status": registered.state.value,
                "discovery_agent_version": str(body.get("discovery_agent_version") or ""),
                "next_step_runner_command": {
                    "command": "",
                    "args": ["--url", current.base_url, "--infra-env-id", infra_env_id, "--host-id", host_id],
                },
            },
            status_code=201,
        )

    return router
