"""The BareMetalInstance state machine and the host it holds.

    PROVISIONING --allocate--> (write image, power on, boot_seam.boot) --> RUNNING
         |  no matching free host / lab fault / boot error                  |
         v                                                                  |
       FAILED                                                               |
    any state --delete--> DELETING --(held a host: boot_seam.halt, wipe)--> host FREE, object gone
                                      `--wipe fails--> host QUARANTINED for good, BMI stays DELETING

Host allocation and release happen under one asyncio lock and never await inside it, so a host is
never given to two live BMIs however many creates race. A BMI deleted at any point after allocation
(PROVISIONING, RUNNING, FAILED) has its host wiped before the host is free again: the delete cancels
the provisioning task first and only then looks at which host the BMI holds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from lab.boot import BootedHost, BootSeam
from lab.fulfillment.audit import AuditKind, AuditLog
from lab.fulfillment.catalog import Catalogs
from lab.fulfillment.faults import FaultInjector
from lab.fulfillment.inventory import Inventory
from lab.fulfillment.models import (
    BmiCondition,
    BmiConditionType,
    BmiHardwareStatus,
    BmiState,
    ConditionStatus,
    Nic,
    utcnow,
)
from lab.fulfillment.objects import ADMIN
from lab.fulfillment.records import BmiRecord, InstanceTable
from lab.fulfillment.timings import TimingClock

log = logging.getLogger(__name__)

NO_HOSTS_MESSAGE = "No matching hosts available"
WIPE_FAILED_MESSAGE = (
    "Host sanitisation failed: the disk wipe did not complete. The host is quarantined and will not "
    "be reused; the instance stays in DELETING until an operator intervenes."
)

Conditions = dict[BmiConditionType, tuple[ConditionStatus, str, str]]


def initial_conditions() -> list[BmiCondition]:
    now = utcnow()
    return [
        BmiCondition(type=t, status=ConditionStatus.FALSE, last_transition_time=now, reason="Provisioning")
        for t in (
            BmiConditionType.PROVISIONED,
            BmiConditionType.CONFIGURATION_APPLIED,
            BmiConditionType.READY,
        )
    ]


class Lifecycle:
    def __init__(
        self,
        *,
        table: InstanceTable,
        catalogs: Catalogs,
        inventory: Inventory,
        audit: AuditLog,
        faults: FaultInjector,
        clock: TimingClock,
        boot_seam: BootSeam,
    ) -> None:
        self._table = table
        self._catalogs = catalogs
        self._inventory = inventory
        self._audit = audit
        self._faults = faults
        self._clock = clock
        self._boot_seam = boot_seam
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()

    # ----------------------------------------------------------------------------------- entries

    def start(self, rec: BmiRecord) -> None:
        rec.task = self._spawn(self._provision(rec), f"provision-{rec.id}")

    def break_host(self, rec: BmiRecord) -> None:
        """The host under a BMI broke (hardware): the BMI is FAILED and keeps its host until deleted."""
        self._fail(rec, "HostFailed", "the host stopped responding")

    def delete(self, rec: BmiRecord) -> None:
        """DELETING now; the wipe and the removal run in the background."""
        if rec.deleting:
            return
        rec.deleting = True
        rec.user_data = ""  # deprovisioning clears the user data: drop the secret now
        rec.obj.metadata.deletion_timestamp = utcnow()
        rec.obj.status.state = BmiState.DELETING
        self._set_conditions(rec, {BmiConditionType.READY: (ConditionStatus.FALSE, "Deleting", "")})
        self._table.changed(rec)
        provisioning = rec.task
        if provisioning is not None:
            # Cancel now, not in the new task: provisioning must never resume past its current await.
            provisioning.cancel()
        rec.task = self._spawn(self._deprovision(rec, provisioning), f"deprovision-{rec.id}")

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------------------------------ helpers

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    @staticmethod
    def _set_conditions(rec: BmiRecord, changes: Conditions) -> None:
        now = utcnow()
        conditions = {c.type: c for c in rec.obj.status.conditions}
        for ctype, (status, reason, message) in changes.items():
            old = conditions.get(ctype)
            moved = old is None or old.status != status
            conditions[ctype] = BmiCondition(
                type=ctype,
                status=status,
                last_transition_time=now if moved or old is None else old.last_transition_time,
                reason=reason or None,
                message=message or None,
            )
        rec.obj.status.conditions = sorted(
            conditions.values(), key=lambda c: list(BmiConditionType).index(c.type)
        )

    def _fail(self, rec: BmiRecord, reason: str, message: str) -> None:
        if rec.deleting:  # a delete won the race: DELETING stays
            return
        rec.obj.status.state = BmiState.FAILED
        self._set_conditions(
            rec,
            {
                BmiConditionType.PROVISIONED: (ConditionStatus.FALSE, reason, message),
                BmiConditionType.READY: (ConditionStatus.FALSE, reason, message),
            },
        )
        self._table.changed(rec)

    # ------------------------------------------------------------------------------- provisioning

    async def _provision(self, rec: BmiRecord) -> None:
        try:
            await self._provision_steps(rec)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("provisioning of BMI %s failed unexpectedly", rec.id)
            self._fail(rec, "InternalError", "Provisioning failed: internal error in the bare-metal service")

    async def _provision_steps(self, rec: BmiRecord) -> None:
        await self._clock.wait(lambda t: t.allocation_s)
        itype = self._catalogs.types.find(rec.instance_type_id, ADMIN)
        selector = (
            dict(itype.spec.host_label_selector.match_labels)
            if itype and itype.spec.host_label_selector
            else {}
        )
        async with self._lock:
            host = None
            if itype is not None and selector and not self._faults.no_free_hosts():
                host = self._inventory.allocate(selector, rec.id)
            if host is not None:
                rec.host_id = host.id
                self._audit.record(
                    AuditKind.HOST_ALLOCATED, host_id=host.id, bmi_id=rec.id, bmi_name=rec.name
                )
        if host is None:
            self._audit.record(
                AuditKind.ALLOCATION_FAILED, bmi_id=rec.id, bmi_name=rec.name, detail=f"selector {selector}"
            )
            self._fail(rec, "NoMatchingHosts", NO_HOSTS_MESSAGE)
            return
        # As the real service: the NICs are known from allocation on, long before the host runs.
        rec.obj.status.hardware = BmiHardwareStatus(nics=[Nic(mac=mac) for mac in host.macs])
        self._table.changed(rec)

        await self._clock.wait(lambda t: t.image_write_s)
        await self._clock.wait(lambda t: t.boot_s)
        if self._faults.provisioning_fails():
            self._audit.record(
                AuditKind.PROVISIONING_FAILED,
                host_id=host.id,
                bmi_id=rec.id,
                bmi_name=rec.name,
                detail="lab fault",
            )
            self._fail(
                rec, "ProvisioningFailed", "Provisioning failed: the host did not come up after power-on"
            )
            return
        booted = BootedHost(host_id=host.id, macs=host.macs, labels=dict(host.labels))
        user_data_bytes = len(rec.user_data.encode())
        try:
            await self._boot_seam.boot(booted, rec.user_data)
        except Exception as exc:
            # The exception text could quote the ignition; record only its type.
            self._audit.record(
                AuditKind.PROVISIONING_FAILED,
                host_id=host.id,
                bmi_id=rec.id,
                bmi_name=rec.name,
                detail=f"boot seam raised {type(exc).__name__}",
            )
            self._fail(rec, "ProvisioningFailed", "Provisioning failed: the host could not boot its image")
            return
        self._audit.record(
            AuditKind.HOST_BOOTED,
            host_id=host.id,
            bmi_id=rec.id,
            bmi_name=rec.name,
            user_data_bytes=user_data_bytes,
        )
        if rec.deleting:  # a boot seam that swallowed the cancellation: DELETING stays
            return
        rec.obj.status.state = BmiState.RUNNING
        self._set_conditions(
            rec,
            {
                BmiConditionType.PROVISIONED: (ConditionStatus.TRUE, "Provisioned", "Host allocated"),
                BmiConditionType.CONFIGURATION_APPLIED: (
                    ConditionStatus.TRUE,
                    "ConfigurationApplied",
                    "Image and user data written",
                ),
                BmiConditionType.READY: (ConditionStatus.TRUE, "Ready", "The instance is running"),
            },
        )
        self._table.changed(rec)

    # ----------------------------------------------------------------------------- deprovisioning

    async def _deprovision(self, rec: BmiRecord, provisioning: asyncio.Task[None] | None) -> None:
        if provisioning is not None:
            # Only once provisioning has really stopped is `rec.host_id` final.
            await asyncio.gather(provisioning, return_exceptions=True)
        host_id = rec.host_id
        if host_id is None:
            await self._clock.wait(lambda t: t.deprovision_s)
            self._table.remove(rec)
            return
        async with self._lock:
            self._inventory.start_wipe(host_id)
            self._audit.record(AuditKind.WIPE_STARTED, host_id=host_id, bmi_id=rec.id, bmi_name=rec.name)
        # Powered off for the wipe: whatever the host booted stops (no agent registers from it any
        # more). A seam that fails here must not keep the host from being wiped.
        try:
            self._boot_seam.halt(host_id)
        except Exception:
            log.exception("boot seam failed to halt host %s", host_id)
        await self._clock.wait(lambda t: t.wipe_s)
        async with self._lock:
            if self._faults.wipe_fails(host_id):
                self._inventory.quarantine(host_id, "disk wipe failed")
                self._audit.record(AuditKind.WIPE_FAILED, host_id=host_id, bmi_id=rec.id, bmi_name=rec.name)
                self._audit.record(
                    AuditKind.HOST_QUARANTINED,
                    host_id=host_id,
                    bmi_id=rec.id,
                    bmi_name=rec.name,
                    detail="wipe failed",
                )
                failed = True
            else:
                self._audit.record(AuditKind.WIPE_FINISHED, host_id=host_id, bmi_id=rec.id, bmi_name=rec.name)
                self._inventory.release(host_id)
                self._audit.record(AuditKind.HOST_RELEASED, host_id=host_id, bmi_id=rec.id, bmi_name=rec.name)
                failed = False
        if failed:
            self._set_conditions(
                rec,
                {
                    BmiConditionType.READY: (
                        ConditionStatus.FALSE,
                        "HostSanitizationFailed",
                        WIPE_FAILED_MESSAGE,
                    )
                },
            )
            self._table.changed(rec)
            return
        self._table.remove(rec)
