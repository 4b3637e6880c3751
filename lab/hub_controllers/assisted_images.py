"""assisted-service's InfraEnv controller: boot artifacts once the pull secret is there.

For each InfraEnv whose `spec.pullSecretRef` Secret exists (and holds a valid `.dockerconfigjson`),
after `timings.image_created_s` the status gets `bootArtifacts.discoveryIgnitionURL`, `isoDownloadURL`,
`createdTime`, `agentLabelSelector` and `ImageCreated=True`. Without the Secret, or with a pull secret
it refuses, the condition is `ImageCreated=False/ImageCreationError`, and a change of the Secret
re-triggers the InfraEnv. A refused pull secret is quoted in the message, as assisted-service does
(pullSecretManager.GetValidPullSecret wraps the validation error with the secret's data, and the
InfraEnv controller writes "Failed to create image: <error>"): whoever reads the condition must not
pass its message on.

The InfraEnv id (the one in the URLs, the ignition and the registration path) is a uuid5 of the
object's `metadata.uid`: stable across controller restarts, different for a re-created namesake.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import uuid
from typing import Any
from urllib.parse import urlencode

from lab.hub_controllers.agent_status import now_rfc3339
from lab.hub_controllers.constants import (
    ASSISTED_API_PREFIX,
    IGNITION_FILE_NAME,
    ConditionStatus,
    EventType,
    InfraEnvConditionType,
    InfraEnvReason,
    Label,
)
from lab.hub_controllers.events import EventRecorder
from lab.hub_controllers.informer import Informer
from lab.hub_controllers.kube import KubeApi, Obj, WatchEventType, key_of, split_key
from lab.hub_controllers.resources import INFRA_ENVS
from lab.hub_controllers.timings import AgentTimings
from lab.hub_controllers.tokens import TokenAudience, TokenSigner
from lab.hub_controllers.workqueue import Controller

log = logging.getLogger(__name__)

_ID_NAMESPACE = uuid.UUID("6f1d3c2e-7a4b-4f0e-9c1d-2b3a4c5d6e7f")
PULL_SECRET_KEY = ".dockerconfigjson"


def infra_env_id(infra_env: Obj) -> str:
    m = infra_env.get("metadata", {})
    seed = m.get("uid") or f"{m.get('namespace')}/{m.get('name')}"
    return str(uuid.uuid5(_ID_NAMESPACE, seed))


def find_infra_env(informer: Informer, wanted_id: str) -> Obj | None:
    for obj in informer.items():
        if infra_env_id(obj) == wanted_id and not obj.get("metadata", {}).get("deletionTimestamp"):
            return obj
    return None


def pull_secret_data(secret: Obj | None) -> str | None:
    """The decoded `.dockerconfigjson` of a Secret, valid or not; None without one."""
    if secret is None:
        return None
    data = (secret.get("data") or {}).get(PULL_SECRET_KEY)
    if data is not None:
        try:
            return base64.b64decode(data).decode()
        except ValueError:
            return None
    raw = (secret.get("stringData") or {}).get(PULL_SECRET_KEY)
    return None if raw is None else str(raw)


def pull_secret_error(text: str) -> str | None:
    """Why assisted-service would refuse this pull secret (its validations.ParsePullSecret
    wording), or None. An empty `auths` passes here (the real service wants at least one entry, and
    registry.redhat.io's, which no test secret carries)."""
    try:
        parsed = json.loads(text.strip())
    except ValueError:
        return "pull secret must be a well-formed JSON"
    auths = parsed.get("auths") if isinstance(parsed, dict) else None
    if not isinstance(auths, dict):
        return "pull secret must contain 'auths' JSON-object field"
    for registry, entry in auths.items():
        quoted = json.dumps(registry)
        if not isinstance(entry, dict) or not ({"auth", "credsStore"} & entry.keys()):
            return f"invalid pull secret: {quoted} JSON-object requires either 'auth' or 'credsStore' field"
        auth = entry.get("auth")
        if auth is not None and not _is_base64(auth):
            return f"invalid pull secret: 'auth' fields of {quoted} are not base64-encoded"
    return None


def _is_base64(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:  # as Go's decoder, which assisted-service uses, line breaks are skipped
        base64.b64decode(value.replace("\r", "").replace("\n", ""), validate=True)
    except ValueError:
        return False
    return True


def pull_secret_of(secret: Obj | None) -> str | None:
    """The decoded `.dockerconfigjson` when assisted-service would accept it, else None."""
    text = pull_secret_data(secret)
    return text if text is not None and pull_secret_error(text) is None else None


def image_error_message(secret_name: str, namespace: str, text: str | None) -> str | None:
    """The ImageCreated=False message for the InfraEnv's pull secret, None when it is usable. A
    refused secret is quoted whole, as GetValidPullSecret + handleEnsureISOErrors do."""
    if text is None:
        return f"Failed to create image: pull secret {namespace}/{secret_name} is missing or invalid"
    why = pull_secret_error(text)
    if why is None:
        return None
    return f"Failed to create image: invalid pull secret data in secret {secret_name} {text}: {why}"


def ignition_url(base_url: str, ie_id: str, signer: TokenSigner) -> str:
    query = urlencode({"file_name": IGNITION_FILE_NAME, "api_key": signer.issue(ie_id, TokenAudience.IMAGE)})
    return f"{base_url}{ASSISTED_API_PREFIX}/infra-envs/{ie_id}/downloads/files?{query}"


def iso_url(base_url: str, ie_id: str, signer: TokenSigner) -> str:
    query = urlencode(
        {"api_key": signer.issue(ie_id, TokenAudience.IMAGE), "arch": "x86_64", "type": "minimal-iso"}
    )
    return f"{base_url}/images/{ie_id}?{query}"


class InfraEnvController(Controller):
    name = "assisted-infraenv"

    def __init__(
        self,
        api: KubeApi,
        infra_envs: Informer,
        secrets: Informer,
        *,
        base_url: str,
        signer: TokenSigner,
        timings: AgentTimings,
        events: EventRecorder,
    ) -> None:
        super().__init__()
        self._api, self._infra_envs, self._secrets = api, infra_envs, secrets
        self._base_url, self._signer, self._timings, self._events = base_url, signer, timings, events
        self._ready_at: dict[str, tuple[str, float]] = {}  # key -> (uid, loop time the image is "built")
        self.watch(infra_envs)
        self.watch(secrets, self._infra_envs_using)

    def _infra_envs_using(self, _kind: WatchEventType, secret: Obj) -> list[str]:
        m = secret.get("metadata", {})
        return [
            key_of(ie)
            for ie in self._infra_envs.in_namespace(m.get("namespace", ""))
            if (ie.get("spec", {}).get("pullSecretRef") or {}).get("name") == m.get("name")
        ]

    async def reconcile(self, key: str) -> float | None:
        infra_env = self._infra_envs.get(key)
        if infra_env is None or infra_env["metadata"].get("deletionTimestamp"):
            self._ready_at.pop(key, None)
            return None
        namespace, name = split_key(key)
        uid = str(infra_env["metadata"].get("uid") or key)
        status: dict[str, Any] = infra_env.get("status") or {}
        secret_name = (infra_env.get("spec", {}).get("pullSecretRef") or {}).get("name", "")
        data = pull_secret_data(self._secrets.get(f"{namespace}/{secret_name}")) if secret_name else None
        message = image_error_message(secret_name, namespace or "", data)

        if message is not None:
            self._ready_at.pop(key, None)
            if _condition(status) != (
                ConditionStatus.FALSE.value,
                InfraEnvReason.IMAGE_CREATION_ERROR.value,
                message,
            ):
                await self._write(namespace, name, {"conditions": [_image_condition(False, message, status)]})
                await self._events.emit(
                    infra_env, EventType.WARNING, InfraEnvReason.IMAGE_CREATION_ERROR, message
                )
            return None

        loop_now = asyncio.get_running_loop().time()
        if self._ready_at.get(key, ("", 0.0))[0] != uid:  # first sight of this object (or a namesake)
            self._ready_at[key] = (uid, loop_now + self._timings.image_created_s)
        ready_at = self._ready_at[key][1]
        if _condition(status)[0] == ConditionStatus.TRUE.value and (status.get("bootArtifacts") or {}).get(
            "discoveryIgnitionURL"
        ):
            return None
        if loop_now < ready_at:
            return ready_at - loop_now

        ie_id = infra_env_id(infra_env)
        patch = {
            "bootArtifacts": {"discoveryIgnitionURL": ignition_url(self._base_url, ie_id, self._signer)},
            "isoDownloadURL": iso_url(self._base_url, ie_id, self._signer),
            "createdTime": now_rfc3339(),
            "agentLabelSelector": {"matchLabels": {Label.INFRAENV.value: name}},
            "conditions": [_image_condition(True, "Image has been created", status)],
        }
        await self._write(namespace, name, patch)
        await self._events.emit(
            infra_env, EventType.NORMAL, InfraEnvReason.IMAGE_CREATED, "Image has been created"
        )
        return None

    async def _write(self, namespace: str | None, name: str, status_patch: dict[str, Any]) -> None:
        # Only this controller writes InfraEnv status, so a merge patch cannot lose anyone's write.
        await self._api.patch(INFRA_ENVS, namespace, name, {"status": status_patch}, subresource="status")


def _condition(status: dict[str, Any]) -> tuple[str, str, str]:
    for cond in status.get("conditions") or []:
        if cond.get("type") == InfraEnvConditionType.IMAGE_CREATED.value:
            return str(cond.get("status")), str(cond.get("reason")), str(cond.get("message"))
    return "", "", ""


def _image_condition(created: bool, message: str, status: dict[str, Any]) -> dict[str, str]:
    state = ConditionStatus.TRUE if created else ConditionStatus.FALSE
    previous = _condition(status)
    stamp = now_rfc3339()
    for cond in status.get("conditions") or []:
        if cond.get("type") == InfraEnvConditionType.IMAGE_CREATED.value and previous[0] == state.value:
            stamp = cond.get("lastTransitionTime") or stamp
    return {
        "type": InfraEnvConditionType.IMAGE_CREATED.value,
        "status": state.value,
        "reason": (InfraEnvReason.IMAGE_CREATED if created else InfraEnvReason.IMAGE_CREATION_ERROR).value,
        "message": message,
        "lastTransitionTime": stamp,
    }
