"""Core v1 Events, written where the real controllers would write them (best effort)."""

from __future__ import annotations

import logging
import secrets
from typing import Any

import httpx

from lab.hub_controllers.agent_status import now_rfc3339
from lab.hub_controllers.constants import EventType
from lab.hub_controllers.kube import ApiError, KubeApi, Obj
from lab.hub_controllers.resources import EVENTS

log = logging.getLogger(__name__)


class EventRecorder:
    def __init__(self, api: KubeApi, component: str) -> None:
        self._api = api
        self._component = component

    async def emit(self, obj: Obj, event_type: EventType, reason: str, message: str) -> None:
        m = obj.get("metadata", {})
        namespace = m.get("namespace") or "default"
        now = now_rfc3339()
        body: dict[str, Any] = {
            "metadata": {"name": f"{m.get('name', 'object')}.{secrets.token_hex(8)}", "namespace": namespace},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", ""),
                "kind": obj.get("kind", ""),
                "name": m.get("name", ""),
                "namespace": namespace,
                "uid": m.get("uid", ""),
                "resourceVersion": m.get("resourceVersion", ""),
            },
            "reason": reason,
            "message": message,
            "type": event_type.value,
            "source": {"component": self._component},
            "reportingComponent": self._component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self._api.create(EVENTS, body)
        except (ApiError, httpx.HTTPError) as exc:  # events are advisory; never fail a reconcile
            log.debug("event %s for %s not recorded: %s", reason, m.get("name"), exc)
