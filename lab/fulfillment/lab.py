"""`FulfillmentLab`: the fulfillment twin's configuration and all of its state, in one object.

    lab = FulfillmentLab(FulfillmentConfig(hosts=5, timings=Timings.for_profile(TimingProfile.ZERO),
                                           tenant_tokens={"t0ken": "tenant-a"}),
                         boot_seam=my_seam)          # default: RecordingBootSeam()
    app = create_fulfillment_app(lab)                # lab.fulfillment.app

`FulfillmentConfig` fields: `admin_token` (random by default; the private API and `/lab/v1`),
`tenant_tokens` (token -> tenant, the public API; never tenant `system`), `hosts` (seeded; N // 4 are
GPU hosts unless `gpu_hosts` says otherwise), `timings` (demo profile by default), `seed` (fault RNG).

One lab serves one app on one event loop: every request handler and background task runs on the
server's loop, so the state needs no thread locks (the loop is its single owner). To touch the state
from another thread use `ThreadedServer.call(coro)`. `aclose()` ends watch streams, releases hanging
requests and cancels background work; call it on the server's loop before stopping the server (the
app also does it by itself when uvicorn starts shutting down).
"""

from __future__ import annotations

import hmac
import secrets

from pydantic import BaseModel, ConfigDict, Field, field_validator

from lab.boot import BootSeam, RecordingBootSeam
from lab.fulfillment.audit import AuditKind, AuditLog, RequestStats
from lab.fulfillment.catalog import Catalogs
from lab.fulfillment.events import EventBus
from lab.fulfillment.faults import FaultInjector
from lab.fulfillment.instances import InstanceService
from lab.fulfillment.inventory import Host, Inventory, NewHost
from lab.fulfillment.lifecycle import Lifecycle
from lab.fulfillment.models import (
    SYSTEM_TENANT,
    BareMetalInstanceCatalogItem,
    BareMetalInstanceType,
    DiskImage,
)
from lab.fulfillment.records import InstanceTable
from lab.fulfillment.seed import seed_catalogs, seed_hosts
from lab.fulfillment.timings import TimingClock, TimingProfile, Timings


def new_token() -> str:
    return secrets.token_urlsafe(32)


class FulfillmentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Tokens stay out of reprs and logs.
    admin_token: str = Field(default_factory=new_token, repr=False, min_length=16)
    tenant_tokens: dict[str, str] = Field(default_factory=dict, repr=False, description="token -> tenant")
    hosts: int = Field(default=8, ge=0, description="seeded hosts; N // 4 of them GPU hosts")
    gpu_hosts: int | None = Field(default=None, ge=0, description="override the GPU share of `hosts`")
    timings: Timings = Field(default_factory=lambda: Timings.for_profile(TimingProfile.DEMO))
    seed: int = Field(default=0, description="seeds the fault RNG")

    @field_validator("tenant_tokens")
    @classmethod
    def _real_tenants(cls, tokens: dict[str, str]) -> dict[str, str]:
        for tenant in tokens.values():
            if tenant in ("", SYSTEM_TENANT):
                raise ValueError(f"tenant {tenant!r} cannot hold a public-API token")
        return tokens


class FulfillmentLab:
    def __init__(self, config: FulfillmentConfig | None = None, *, boot_seam: BootSeam | None = None) -> None:
        self.config = config or FulfillmentConfig()
        self.boot_seam: BootSeam = boot_seam if boot_seam is not None else RecordingBootSeam()
        self.clock = TimingClock(self.config.timings.model_copy())
        self.bus = EventBus()
        self.audit = AuditLog()
        self.stats = RequestStats()
        self.faults = FaultInjector(self.config.seed)
        self.inventory = Inventory()
        self.catalogs = Catalogs(self.bus)
        self.table = InstanceTable(self.bus)
        self.lifecycle = Lifecycle(
            table=self.table,
            catalogs=self.catalogs,
            inventory=self.inventory,
            audit=self.audit,
            faults=self.faults,
            clock=self.clock,
            boot_seam=self.boot_seam,
        )
        self.instances = InstanceService(self.table, self.catalogs, self.lifecycle)
        self.closed = False
        self.catalogs.types.hooks.in_use = self._type_in_use
        self.catalogs.items.hooks.in_use = self._item_in_use
        image_links = self.catalogs.images.hooks.in_use
        self.catalogs.images.hooks.in_use = lambda image: image_links(image) or self._image_in_use(image)
        seed_catalogs(self.catalogs)
        for new in seed_hosts(self.config.hosts, self.config.gpu_hosts):
            self.add_host(new)

    # --------------------------------------------------------------------------------------- auth

    def is_admin_token(self, token: str) -> bool:
        return hmac.compare_digest(token.encode(), self.config.admin_token.encode())

    def tenant_for_token(self, token: str) -> str | None:
        for known, tenant in self.config.tenant_tokens.items():
            if hmac.compare_digest(token.encode(), known.encode()):
                return tenant
        return None

    # ----------------------------------------------------------------------------------- timings

    @property
    def timings(self) -> Timings:
        return self.clock.current

    @timings.setter
    def timings(self, timings: Timings) -> None:
        # Steps already waiting follow the change too.
        self.clock.set(timings)

    # ------------------------------------------------------------------------------------- hosts

    def add_host(self, new: NewHost) -> Host:
        host = self.inventory.add(new)
        self.audit.record(AuditKind.HOST_ADDED, host_id=host.id, detail=f"labels {host.labels}")
        return host

    # ----------------------------------------------------------------------------- deletion guards

    def _type_in_use(self, itype: BareMetalInstanceType) -> str | None:
        users = [r.name for r in self.table.all() if r.instance_type_id == itype.id]
        return f"used by BareMetalInstance {', '.join(users)}" if users else None

    def _item_in_use(self, item: BareMetalInstanceCatalogItem) -> str | None:
        users = [
            r.name
            for r in self.table.all()
            if r.obj.spec.catalog_item and r.obj.spec.catalog_item.id == item.id
        ]
        return f"used by BareMetalInstance {', '.join(users)}" if users else None

    def _image_in_use(self, image: DiskImage) -> str | None:
        refs = {image.id, image.metadata.name}
        users = [
            r.name
            for r in self.table.all()
            if r.obj.spec.disk_image in refs or (r.obj.spec.image and r.obj.spec.image.source_ref in refs)
        ]
        return f"used by BareMetalInstance {', '.join(users)}" if users else None

    # ---------------------------------------------------------------------------------- shutdown

    def begin_shutdown(self) -> None:
        """End watch streams and release hanging requests, so the server can finish its connections."""
        self.bus.close()
        self.faults.close()

    async def aclose(self) -> None:
        """Idempotent; run on the server's loop."""
        if self.closed:
            return
        self.closed = True
        self.begin_shutdown()
        await self.lifecycle.close()
