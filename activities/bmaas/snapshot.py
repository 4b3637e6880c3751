"""A compact, secret-free view of a BareMetalInstance (what the watcher keeps per BMI)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from activities.bmaas.errors import BmaasApiError
from activities.timestamps import parse_time
from contracts.bmaas import (
    LOST_STATES,
    ORDER_LABEL,
    ORDER_NAMESPACE_LABEL,
    SYSTEM_TENANT,
    BmaasErrorType,
    BmiState,
    LostInstance,
    WorkerInstance,
)
from contracts.hub import normalize_mac
from contracts.refs import OrderRef

# What a failed deprovisioning names: "HostSanitizationFailed", "disk wipe failed", "cleaning failed"...
_DELETION_WORDS = ("saniti", "wipe", "deprovision", "clean", "release", "delet")


def _nic_macs(addresses: Iterable[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The NICs' MACs normalised as an Agent's are (sorted, once each), and the addresses that are
    none: the workflow matches on the first, so nothing it cannot match may be among them."""
    macs, unusable = set(), set()
    for address in addresses:
        try:
            macs.add(normalize_mac(address))
        except ValueError:
            unusable.add(address)
    return tuple(sorted(macs)), tuple(sorted(unusable))


def _malformed(what: str) -> BmaasApiError:
    return BmaasApiError(f"BMaaS answered {what}", BmaasErrorType.PROTOCOL)


def _items(obj: Mapping[str, Any], key: str) -> list[Any]:
    """`obj[key]`, a list or absent ([])."""
    value = obj.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise _malformed(f"a BMI whose {key} is not a list")
    return value


def _part(obj: Mapping[str, Any], key: str, where: str | None = None) -> Mapping[str, Any]:
    """`obj[key]`, an object or absent ({})."""
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _malformed(f"a BMI whose {where or key} is not an object")
    return value


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str

    @property
    def is_true(self) -> bool:
        return self.status.upper().endswith("TRUE")

    @property
    def reports_failure(self) -> bool:
        """A condition whose reason or type says something failed."""
        text = f"{self.type} {self.reason}".lower()
        if "fail" not in text and "error" not in text:
            return False
        # `*_FAILED` types report a failure when true; a failure reason reports it whatever the status.
        return self.is_true if "fail" in self.type.lower() else True

    @property
    def reports_deletion_failure(self) -> bool:
        """A failure of the deprovisioning itself (wipe, sanitisation, cleaning).

        A FAILED instance that is then deleted still carries its provisioning failure; that one must not
        read as a stuck wipe, hence the check for what failed.
        """
        text = f"{self.reason} {self.message}".lower()
        return self.reports_failure and any(word in text for word in _DELETION_WORDS)


@dataclass(frozen=True)
class BmiSnapshot:
    id: str
    name: str
    tenant: str | None
    state: BmiState
    version: int | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    macs: tuple[str, ...] = ()
    # NIC addresses that are no MAC (see normalize_mac): never matched on, named when nothing else is.
    unusable_macs: tuple[str, ...] = ()
    conditions: tuple[Condition, ...] = ()
    instance_type: str | None = None
    created_at: datetime | None = None
    deleting_since: datetime | None = None

    @classmethod
    def from_api(cls, obj: Mapping[str, Any]) -> BmiSnapshot:
        """Keep only what waiting needs: `spec.user_data` (a secret) is never copied. An answer of
        another shape is a retryable protocol error, never a library exception's untyped failure."""
        if not isinstance(obj, Mapping):
            raise _malformed("a BMI that is not an object")
        metadata = _part(obj, "metadata")
        spec = _part(obj, "spec")
        status = _part(obj, "status")
        hardware = _part(status, "hardware", "status.hardware")
        nics = [nic for nic in _items(hardware, "nics") if isinstance(nic, dict) and nic.get("mac")]
        macs, unusable = _nic_macs(str(nic["mac"]) for nic in nics)
        conditions = tuple(
            Condition(
                type=str(c.get("type") or ""),
                status=str(c.get("status") or ""),
                reason=str(c.get("reason") or ""),
                message=str(c.get("message") or ""),
            )
            for c in _items(status, "conditions")
            if isinstance(c, dict)
        )
        labels = metadata.get("labels") or {}
        version: int | None
        try:
            version = int(metadata["version"])
        except (KeyError, TypeError, ValueError, OverflowError):
            version = None
        return cls(
            id=str(obj.get("id") or ""),
            name=str(metadata.get("name") or ""),
            tenant=metadata.get("tenant"),
            state=BmiState.parse(status.get("state")),
            version=version,
            labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {},
            macs=macs,
            unusable_macs=unusable,
            conditions=conditions,
            instance_type=spec.get("instance_type") if isinstance(spec.get("instance_type"), str) else None,
            created_at=parse_time(metadata.get("creation_timestamp")),
            deleting_since=parse_time(metadata.get("deletion_timestamp")),
        )

    @property
    def order_name(self) -> str | None:
        return self.labels.get(ORDER_LABEL)

    @property
    def is_caas_worker(self) -> bool:
        """Inside the watcher's scope: a system-tenant BMI labelled for a cluster order."""
        return self.tenant == SYSTEM_TENANT and ORDER_LABEL in self.labels

    @property
    def order_key(self) -> str:
        """`<namespace>/<name>` of its order (`?/<name>` for a BMI from before the namespace label)."""
        return f"{self.labels.get(ORDER_NAMESPACE_LABEL, '?')}/{self.order_name}"

    def belongs_to(self, order: OrderRef) -> bool:
        """A CaaS BMI of this order: its name label, and its namespace label unless it predates it."""
        namespace = self.labels.get(ORDER_NAMESPACE_LABEL)
        return (
            self.is_caas_worker
            and self.order_name == order.name
            and (namespace is None or namespace == order.namespace)
        )

    def failure_condition(self) -> Condition | None:
        """The condition that best explains a FAILED instance."""
        failing = [c for c in self.conditions if c.reports_failure]
        if failing:
            return failing[0]
        # No failure-looking reason (e.g. "NoMatchingHosts"): the first false condition explains it.
        false = [c for c in self.conditions if not c.is_true and (c.reason or c.message)]
        return false[0] if false else None

    def deletion_failure(self) -> Condition | None:
        """The condition by which a DELETING instance says its deprovisioning failed, if any."""
        failing = [c for c in self.conditions if c.reports_deletion_failure]
        return failing[0] if failing else None

    def lost(self) -> LostInstance | None:
        """This BMI as a lost host (failed or being deleted, not by its worker), or None while it
        may still run its node."""
        return LostInstance(bmi_id=self.id, state=self.state) if self.state in LOST_STATES else None

    def worker_instance(self) -> WorkerInstance:
        return WorkerInstance(
            id=self.id,
            name=self.name,
            state=self.state,
            instance_type=self.instance_type,
            order_name=self.order_name,
            created_at=self.created_at,
            deleting_since=self.deleting_since,
            macs=list(self.macs),
        )
