"""The hub's state: served kinds, storage, object semantics, background controllers, stats, faults."""

from __future__ import annotations

from lab.hub.auth import Authenticator
from lab.hub.builtin import builtin_types
from lab.hub.config import HubConfig
from lab.hub.faults import ApiFaults
from lab.hub.gc import Controllers
from lab.hub.objects import ObjectApi, WriteOptions
from lab.hub.openapi import OpenApiDocs
from lab.hub.resources import PACKAGED_CRD_DIR, Registry, ResourceType
from lab.hub.stats import RequestStats
from lab.hub.store import CloseReason, Store


class Hub:
    def __init__(self, config: HubConfig) -> None:
        self.config = config
        self.registry = Registry()
        for rt in builtin_types():
            self.registry.add(rt)
        crd_paths = ([PACKAGED_CRD_DIR] if config.packaged_crds else []) + list(config.crd_dirs)
        self.registry.load_crd_paths(crd_paths)
        self.store = Store(window=config.watch_window, queue_size=config.watch_queue_size)
        self.api = ObjectApi(self.registry, self.store)
        self.controllers = Controllers(self.api, config.event_ttl_seconds)
        self.auth = Authenticator(config.tokens)
        self.stats = RequestStats()
        self.faults = ApiFaults(config.fault_seed)
        self.openapi = OpenApiDocs(self.registry, config.server_version)
        self.closing = False
        for name in config.namespaces:
            self.api.create(
                self.api.namespaces,
                "",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
                WriteOptions(),
            )

    def resource(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self.registry.get(group, version, plural)

    async def start(self) -> None:
        self.closing = False
        await self.controllers.start()

    def close_watches(self, reason: CloseReason = CloseReason.FAULT) -> int:
        """End every open watch stream (clients see the stream end and must re-watch)."""
        return self.store.close_watchers(reason)

    def begin_shutdown(self) -> None:
        """Close watch streams so the HTTP server can finish; new watches end at once."""
        self.closing = True
        self.close_watches(CloseReason.SHUTDOWN)

    async def stop(self) -> None:
        self.begin_shutdown()
        await self.controllers.stop()
