"""The BMaaS activities: create, wait running, delete, wait gone, resolve the boot image, list, and
find the BMIs owning given MACs.

Constructed once at worker start with the process's client, watcher and ignition source; Temporal
calls the bound `@activity.defn` methods. Every input and output is a contracts.bmaas model and none
of them carries a secret: the discovery ignition is fetched here, by InfraEnv reference, and only its
size leaves this module.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn, Protocol, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.bmaas.client import (
    CLUSTER_VERSIONS,
    DISK_IMAGES,
    INSTANCE_TYPES,
    INSTANCES,
    BmaasClient,
    cel_string,
    invisible_objects_error,
)
from activities.bmaas.errors import BmaasApiError, redact
from activities.bmaas.snapshot import BmiSnapshot
from activities.bmaas.watcher import GONE, LIST_FILTER, BmiWatcher, Observed
from activities.heartbeats import Heartbeat, tick_seconds
from activities.inflight import InFlight
from activities.reporting import delivers_reports
from contracts.bmaas import (
    CAAS_CATALOG_ITEM,
    LOST_STATES,
    ORDER_LABEL,
    ORDER_NAMESPACE_LABEL,
    OWNER_ANNOTATION,
    SYSTEM_TENANT,
    ApplySecurityGroupsInput,
    BmaasErrorType,
    BmiState,
    BootImage,
    CreateWorkerInstanceInput,
    CreateWorkerInstanceResult,
    DeleteInstanceResult,
    FindInstancesWithMacsInput,
    FindLostInstancesInput,
    InstanceGone,
    InstanceRef,
    InstanceRunning,
    InstancesWithMacs,
    ListOrderInstancesInput,
    LostInstance,
    LostInstances,
    OrderInstances,
    ResolveBootImageInput,
    SecurityGroupsApplied,
    WaitInstanceGoneInput,
    WaitInstanceRunningInput,
    WaitProgress,
    create_margin,
)
from contracts.refs import OrderRef

log = logging.getLogger(__name__)
In = TypeVar("In")
R = TypeVar("R")

REFUSALS = frozenset({BmaasErrorType.UNAUTHENTICATED, BmaasErrorType.PERMISSION_DENIED})


def raise_refusal_as_retryable(err: BmaasApiError, note: str) -> NoReturn:
    """Raise `err`, a 401 or 403 retryable (`note`: why it is worth waiting out)."""
    if err.error_type not in REFUSALS or not err.non_retryable:
        raise err
    raise BmaasApiError(
        f"{err.message} ({note})",
        err.error_type,
        http_status=err.http_status,
        grpc_code=err.grpc_code,
        non_retryable=False,
    ) from None


def refusals_waited_out(
    run: Callable[[Any, In], Awaitable[R]],
) -> Callable[[Any, In], Awaitable[R]]:
    """For the activities that run while a host is allocated to the attempt: BMaaS refusing the
    token (401: a rotation the file has not followed yet) or the permission (403: a role a rollout
    forgot) is retried, not the attempt failed, which would delete the BMI and wipe a healthy host
    for a refusal that says nothing about it. The release's delete and wait for the wipe likewise:
    failing them showed a leaving worker as BMIProvisioningFailed and began its release again."""

    @functools.wraps(run)
    async def wrapper(self: Any, req: In) -> R:
        try:
            return await run(self, req)
        except BmaasApiError as err:
            raise_refusal_as_retryable(err, "retried: the host stays allocated meanwhile")

    return wrapper


_attempt_began: contextvars.ContextVar[float] = contextvars.ContextVar("attempt_began")


def attempt_clock(run: Callable[[Any, In], Awaitable[R]]) -> Callable[[Any, In], Awaitable[R]]:
    """Outermost: note when the attempt began, before anything it does first (a report it delivers)."""

    @functools.wraps(run)
    async def wrapper(self: Any, req: In) -> R:
        _attempt_began.set(time.monotonic())
        return await run(self, req)

    return wrapper


def _time_left_to_create(bmi_name: str) -> float | None:
    """How long the create's POST may take: it must be over before the attempt's timeout, else the
    BMI could land after the workflow saw the attempt end, when it may already have looked for it
    and found none (a scale-down then leaves it allocated for good). None: no timeout to keep."""
    timeout = activity.info().start_to_close_timeout
    if not timeout:
        return None
    began = _attempt_began.get(time.monotonic())
    left = (timeout - create_margin(timeout)).total_seconds() - (time.monotonic() - began)
    if left <= 0:
        raise BmaasApiError(
            f"create of BMI {bmi_name}: too little of this attempt left to send it safely",
            BmaasErrorType.UNAVAILABLE,
        )
    return left


IMAGE_SOURCE_DISK_IMAGE = "disk_image"
FABRIC_ROLE = "fabric"
NETWORK_ATTACHMENTS_MASK = "spec.network_attachments"
USER_DATA_MAX_BYTES = 64 * 1024
USER_DATA_WARN_BYTES = 48 * 1024
# Condition texts by which BMaaS says allocation found no host ("No matching hosts available").
_NO_HOSTS_MARKERS = ("no matching host", "no hosts available", "no host available", "nomatchinghosts")


class IgnitionSource(Protocol):
    """Where the discovery ignition comes from (the hub side implements it)."""

    async def discovery_ignition(self, namespace: str, infraenv_name: str) -> str: ...


def _now() -> datetime:
    return datetime.now(UTC)


def order_filter(order_name: str) -> str:
    """CEL for the BMIs of one order; the `in` guard keeps unlabelled BMIs from being evaluation errors."""
    label = cel_string(ORDER_LABEL)
    return (
        f"this.metadata.tenant == {cel_string(SYSTEM_TENANT)} && "
        f"{label} in this.metadata.labels && this.metadata.labels[{label}] == {cel_string(order_name)}"
    )


async def order_snapshots(client: BmaasClient, order: OrderRef) -> list[BmiSnapshot]:
    """Every BMI of an order, any state (DELETING included: not wiped yet), from one list."""
    items = await client.list_instances(order_filter(order.name))
    return [s for s in map(BmiSnapshot.from_api, items) if s.belongs_to(order)]


class BmaasActivities:
    """Activities over the fulfillment-service private API.

    Args:
        client: the process's BmaasClient.
        watcher: the process's BmiWatcher (one stream for all waiting activities).
        ignition: source of discovery ignitions (user data of new BMIs).
        catalog_item: name of the system pass-through catalog item.
        heartbeat_interval: upper bound between heartbeats of the waiting activities; a third of the
            activity's heartbeat timeout is used when that is shorter.
    """

    def __init__(
        self,
        client: BmaasClient,
        watcher: BmiWatcher,
        ignition: IgnitionSource,
        *,
        catalog_item: str = CAAS_CATALOG_ITEM,
        heartbeat_interval: float = 5.0,
    ) -> None:
        self.client = client
        self.watcher = watcher
        self.ignition = ignition
        self._boot_images: InFlight[str, BootImage] = InFlight()
        self.catalog_item = catalog_item
        self.heartbeat_interval = heartbeat_interval

    def all(self) -> list[Any]:
        """Every activity of this class, bound, for `Worker(activities=...)`."""
        return [
            self.create_worker_instance,
            self.wait_instance_running,
            self.delete_instance,
            self.wait_instance_gone,
            self.resolve_boot_image,
            self.list_order_instances,
            self.find_instances_with_macs,
            self.find_lost_instances,
            self.apply_security_groups,
        ]

    # -- create --------------------------------------------------------------------------------

    @activity.defn
    @attempt_clock
    @delivers_reports
    async def create_worker_instance(self, req: CreateWorkerInstanceInput) -> CreateWorkerInstanceResult:
        """Create the slot's BMI, or adopt the one a previous attempt (or a racing one) created.
        Without a disk image, the release's boot image is resolved first (RHCOSImageNotFound).
        A name held by a BMI that is not the order's is a non-retryable BmaasAlreadyExists naming it."""
        existing = await self._find_slot(req.order, req.bmi_name)
        if existing is not None:
            return self._adopt(existing)
        if req.disk_image_id is None:
            assert req.release_image is not None  # the model requires one of the two
            image = await self.resolve_boot_image(ResolveBootImageInput(release_image=req.release_image))
            req = req.model_copy(update={"disk_image_id": image.disk_image_id})

        interface = await self._fabric_interface(req.instance_type) if req.network_attachment else None
        namespace, infraenv = req.ignition_ref
        ignition = await self.ignition.discovery_ignition(namespace, infraenv)
        size = len(ignition.encode())
        if size > USER_DATA_MAX_BYTES:
            raise ApplicationError(
                f"discovery ignition of InfraEnv {namespace}/{infraenv} is {size} bytes, "
                f"above the {USER_DATA_MAX_BYTES}-byte user_data limit",
                type=BmaasErrorType.IGNITION_TOO_LARGE.value,
                non_retryable=True,
            )
        body = self._instance_body(req, ignition, interface)
        try:
            async with asyncio.timeout(_time_left_to_create(req.bmi_name)):
                created = await self.client.create_instance(body, secrets=(ignition,))
        except TimeoutError:
            raise BmaasApiError(
                f"POST of BMI {req.bmi_name} unanswered before this attempt's timeout: the next attempt"
                " adopts the BMI if it was made",
                BmaasErrorType.TRANSPORT,
            ) from None
        except BmaasApiError as err:
            if not err.is_already_exists:
                raise
            # A concurrent or earlier create won the name: adopt what is there.
            existing = await self._find_slot(req.order, req.bmi_name)
            if existing is None:
                raise await self._name_holder_error(req.order, req.bmi_name) from None
            return self._adopt(existing)
        snapshot = BmiSnapshot.from_api(created)
        log.info("created BMI %s (%s) for %s", snapshot.name, snapshot.id, req.order.key)
        return CreateWorkerInstanceResult(
            instance=snapshot.worker_instance(),
            created=True,
            user_data_bytes=size,
            user_data_size_warning=size > USER_DATA_WARN_BYTES,
        )

    def _instance_body(
        self, req: CreateWorkerInstanceInput, ignition: str, interface: str | None
    ) -> dict[str, Any]:
        order = req.order.name
        spec: dict[str, Any] = {
            "catalog_item": {"name": self.catalog_item},
            "instance_type": req.instance_type,
            "image": {"source_type": IMAGE_SOURCE_DISK_IMAGE, "source_ref": req.disk_image_id},
            "user_data": ignition,
        }
        if req.network_attachment is not None:
            attachment: dict[str, Any] = {
                "security_groups": [_reference(ref) for ref in req.network_attachment.security_groups],
                "interface": interface or "",
                "primary": True,
            }
            if req.network_attachment.subnet:
                attachment["subnet"] = _reference(req.network_attachment.subnet)
            spec["network_attachments"] = [attachment]
        return {
            "metadata": {
                "name": req.bmi_name,
                "tenant": SYSTEM_TENANT,
                "labels": {ORDER_LABEL: order, ORDER_NAMESPACE_LABEL: req.order.namespace},
                "annotations": {OWNER_ANNOTATION: f"ClusterOrder/{order}"},
            },
            "spec": spec,
        }

    async def _find_slot(self, order: OrderRef, bmi_name: str) -> BmiSnapshot | None:
        """The slot's BMI, if one exists. One of a same-named order in another namespace is never
        taken: a non-retryable AlreadyExists that names it, before anything is allocated."""
        cel = f"{order_filter(order.name)} && this.metadata.name == {cel_string(bmi_name)}"
        named = [BmiSnapshot.from_api(item) for item in await self.client.list_instances(cel)]
        # The filter is the server's; check again here so a lax filter can never adopt a stranger.
        named = [s for s in named if s.name == bmi_name and s.is_caas_worker and s.order_name == order.name]
        found = [s for s in named if s.belongs_to(order)]
        if not found and named:
            raise BmaasApiError(
                f"BMI {bmi_name} belongs to ClusterOrder {named[0].order_key}, not {order.key}: ClusterOrder"
                " names are OSAC order ids and must be unique across namespaces",
                BmaasErrorType.ALREADY_EXISTS,
            )
        if not found:
            return None
        live = [s for s in found if s.state != BmiState.DELETING]
        return sorted(live or found, key=lambda s: s.id)[0]

    async def _name_holder_error(self, order: OrderRef, bmi_name: str) -> BmaasApiError:
        """Why a POST answered AlreadyExists though the order has no BMI of that name. A BMI not of the
        order (made by hand, without our labels) holds it until someone removes it: retrying the call
        would keep the worker Provisioning for ever with no reason shown, so the call fails for good
        with the holder named (never adopted, never deleted). A name freed meanwhile, or taken by the
        order's own BMI since, is a retryable conflict: the next try creates or adopts it."""
        items = await self.client.list_instances(f"this.metadata.name == {cel_string(bmi_name)}")
        # The filter is the server's; check again here so a lax filter can never blame a stranger.
        named = sorted(
            (s for s in map(BmiSnapshot.from_api, items) if s.name == bmi_name), key=lambda s: s.id
        )
        if not named or any(s.belongs_to(order) for s in named):
            return BmaasApiError(
                f"BMI {bmi_name} already exists but is not listed for order {order.name}",
                BmaasErrorType.CONFLICT,
            )
        return BmaasApiError(
            f"BMI {bmi_name} ({named[0].id}) is not a worker of order {order.key}: the slot cannot be"
            " created until that BMI is removed or renamed",
            BmaasErrorType.ALREADY_EXISTS,
        )

    def _adopt(self, snapshot: BmiSnapshot) -> CreateWorkerInstanceResult:
        if snapshot.state == BmiState.DELETING:
            # The slot's previous BMI is still being wiped: it is not a live worker. Retry later.
            raise ApplicationError(
                f"BMI {snapshot.name} ({snapshot.id}) of this slot is still being deleted",
                type=BmaasErrorType.INSTANCE_DELETING.value,
                non_retryable=False,
            )
        log.info("adopted BMI %s (%s) in state %s", snapshot.name, snapshot.id, snapshot.state.short)
        return CreateWorkerInstanceResult(instance=snapshot.worker_instance(), created=False)

    async def _fabric_interface(self, instance_type: str) -> str:
        cel = f"this.id == {cel_string(instance_type)} || this.metadata.name == {cel_string(instance_type)}"
        types = await self.client.list_all(INSTANCE_TYPES, cel)
        types = [t for t in types if instance_type in (t.get("id"), (t.get("metadata") or {}).get("name"))]
        if not types:
            raise BmaasApiError(f"unknown instance type {instance_type!r}", BmaasErrorType.INVALID_ARGUMENT)
        hardware = (types[0].get("spec") or {}).get("hardware") or {}
        for port in hardware.get("network_ports") or []:
            if isinstance(port, dict) and port.get("role") == FABRIC_ROLE and port.get("name"):
                return str(port["name"])
        raise BmaasApiError(
            f"instance type {instance_type!r} has no fabric network port", BmaasErrorType.INVALID_ARGUMENT
        )

    # -- wait running --------------------------------------------------------------------------

    @activity.defn
    @refusals_waited_out
    async def wait_instance_running(self, req: WaitInstanceRunningInput) -> InstanceRunning:
        """Heartbeating wait until the BMI runs; a FAILED BMI, a running one none of whose NICs
        reports a MAC (no Agent could ever be matched to it), or one not running by the deadline
        (stuck provisioning, starting or stopped) fails for good."""

        def done(obs: Observed) -> bool:
            if not isinstance(obs, BmiSnapshot):
                return True
            # RUNNING is final for this wait, MACs or not: they are filled at allocation, before the
            # host runs, so a running BMI without one will not get one by waiting.
            return obs.state in (BmiState.RUNNING, BmiState.FAILED, BmiState.DELETING)

        every = self._tick()
        beat = Heartbeat(every)

        def progress(obs: Observed, streaming: bool) -> None:
            beat(lambda: _wait_progress(req.bmi_id, obs, streaming))

        remaining = (req.deadline - _now()).total_seconds() if req.deadline is not None else None
        try:
            async with asyncio.timeout(max(remaining, 0) if remaining is not None else None):
                obs = await self.watcher.wait(req.bmi_id, done, tick=every, on_tick=progress)
        except TimeoutError:
            # Look once more before failing a host: the cache may be stale (an outage across the
            # deadline, a retry that starts past it). A GET that fails raises retryably: waited out.
            obs = await self.watcher.refresh(req.bmi_id)
            if not done(obs):
                state = obs.state.value if isinstance(obs, BmiSnapshot) else "unknown"
                raise ApplicationError(
                    f"BMI {req.bmi_id} is not running by its deadline {req.deadline} (state {state})",
                    type=BmaasErrorType.PROVISIONING_FAILED.value,
                    non_retryable=True,
                ) from None
        if not isinstance(obs, BmiSnapshot):
            raise BmaasApiError(
                f"BMI {req.bmi_id} disappeared while waiting for it to run", BmaasErrorType.NOT_FOUND
            )
        if obs.state == BmiState.FAILED:
            raise self._provisioning_failure(obs)
        if obs.state == BmiState.DELETING:
            # Deleted by someone else while it booted: to the tenant a failed provisioning (the
            # workflow maps only FailureReason values and Bmaas* types; BMIDeleting read as internal).
            raise ApplicationError(
                f"BMI {obs.name} ({obs.id}) is being deleted while waiting for it to run",
                type=BmaasErrorType.PROVISIONING_FAILED.value,
                non_retryable=True,
            )
        if not obs.macs:
            # No Agent could ever be matched to this host: fail the attempt now, not at the deadline.
            reported = ", ".join(obs.unusable_macs)[:200] if obs.unusable_macs else "no address at all"
            raise ApplicationError(
                f"BMI {obs.name} ({obs.id}) is running but none of its NICs reports a MAC address"
                f" (reported: {reported})",
                type=BmaasErrorType.PROVISIONING_FAILED.value,
                non_retryable=True,
            )
        return InstanceRunning(bmi_id=obs.id, name=obs.name, macs=list(obs.macs))

    def _provisioning_failure(self, obs: BmiSnapshot) -> ApplicationError:
        condition = obs.failure_condition()
        reason = condition.reason if condition else ""
        detail = condition.message if condition else ""
        text = f"{reason} {detail}".lower().replace(" ", "")
        no_hosts = any(marker.replace(" ", "") in text for marker in _NO_HOSTS_MARKERS)
        error_type = BmaasErrorType.NO_HOSTS_AVAILABLE if no_hosts else BmaasErrorType.PROVISIONING_FAILED
        explanation = ": ".join(part for part in (reason, detail) if part) or "no reason given"
        message = f"BMI {obs.name} ({obs.id}) failed: {redact(explanation, self._secrets())}"
        return ApplicationError(message, type=error_type.value, non_retryable=True)

    # -- delete --------------------------------------------------------------------------------

    @activity.defn
    @refusals_waited_out
    async def delete_instance(self, req: InstanceRef) -> DeleteInstanceResult:
        """Ask BMaaS to release the BMI (it then wipes the host); NotFound means already released."""
        try:
            await self.client.delete_instance(req.bmi_id)
        except BmaasApiError as err:
            if err.is_not_found:
                return DeleteInstanceResult(bmi_id=req.bmi_id, already_gone=True)
            raise
        return DeleteInstanceResult(bmi_id=req.bmi_id, already_gone=False)

    @activity.defn
    @delivers_reports
    @refusals_waited_out
    async def wait_instance_gone(self, req: WaitInstanceGoneInput) -> InstanceGone:
        """Heartbeating wait until BMaaS confirms the BMI is gone (its wipe finished).

        A stuck wipe (a failure condition, or DELETING longer than `stuck_after_seconds`) is reported
        in the heartbeat details and the wait goes on: stuck is never gone. With `delete_first`, the
        BMI is deleted first (again on a retry: a delete of a DELETING or gone BMI changes nothing).
        """
        # The pace starts now: a delete slow to answer is followed at once by the first heartbeat,
        # which the heartbeat timeout counts from the start of the attempt.
        every = self._tick()
        beat = Heartbeat(every)
        if req.delete_first:
            await self.delete_instance(InstanceRef(bmi_id=req.bmi_id))
        was_stuck = False
        started = _now()
        first_seen_deleting: datetime | None = _previous_deleting_since()
        stuck_after = timedelta(seconds=req.stuck_after_seconds)

        def progress(obs: Observed, streaming: bool) -> None:
            # Every observation is judged (stuck, deleting since); only the heartbeats are paced.
            nonlocal was_stuck, first_seen_deleting
            details = _wait_progress(req.bmi_id, obs, streaming)
            if isinstance(obs, BmiSnapshot):
                if obs.state == BmiState.DELETING:
                    first_seen_deleting = first_seen_deleting or _now()
                    since = obs.deleting_since or first_seen_deleting
                    details.deleting_since = since
                    failure = obs.deletion_failure()
                    if failure is not None:
                        details.stuck = True
                        details.stuck_reason = redact(
                            ": ".join(p for p in (failure.reason, failure.message) if p) or "deletion failed",
                            self._secrets(),
                        )
                    elif _now() - since > stuck_after:
                        details.stuck = True
                        details.stuck_reason = f"deleting for more than {int(req.stuck_after_seconds)}s"
                elif _now() - started > stuck_after:
                    details.stuck = True
                    details.stuck_reason = "BMI is not being deleted (was the delete requested?)"
                if details.stuck and not was_stuck:
                    log.warning("BMI %s deletion looks stuck: %s", req.bmi_id, details.stuck_reason)
                was_stuck = was_stuck or details.stuck
            beat(lambda: details)

        while True:
            await self.watcher.wait(req.bmi_id, lambda obs: obs is GONE, tick=every, on_tick=progress)
            # Gone as seen by the stream or a relist; confirm with the server before trusting it.
            if await self.watcher.refresh(req.bmi_id) is GONE:
                return InstanceGone(bmi_id=req.bmi_id, was_stuck=was_stuck)

    # -- boot image ----------------------------------------------------------------------------

    @activity.defn
    async def resolve_boot_image(self, req: ResolveBootImageInput) -> BootImage:
        """The RHCOS DiskImage for a release: ClusterVersion(spec.image) → spec.disk_image → DiskImage.
        Workers of a scale-up ask at once: they share one lookup (see `InFlight`)."""
        return await self._boot_images.run(req.release_image, lambda: self._resolve_boot_image(req))

    async def _resolve_boot_image(self, req: ResolveBootImageInput) -> BootImage:
        cel = f"this.spec.image == {cel_string(req.release_image)}"
        versions = await self.client.list_all(CLUSTER_VERSIONS, cel)
        versions = sorted(
            (v for v in versions if (v.get("spec") or {}).get("image") == req.release_image),
            key=lambda v: str(v.get("id")),
        )
        linked: list[tuple[dict[str, Any], str]] = []
        for v in versions:
            image_ref = _reference_id((v.get("spec") or {}).get("disk_image"))
            if image_ref:
                linked.append((v, image_ref))
        if not linked:
            why = "its ClusterVersion links no disk image"
            if not versions:
                why = "no ClusterVersion has this release image"
            raise ApplicationError(
                f"no RHCOS boot image for release {req.release_image}: {why}",
                type=BmaasErrorType.RHCOS_IMAGE_NOT_FOUND.value,
                non_retryable=True,
            )
        version, image_id = linked[0]
        try:
            image = await self.client.get(DISK_IMAGES, image_id)
        except BmaasApiError as err:
            if not err.is_not_found:
                raise
            raise ApplicationError(
                f"ClusterVersion {version.get('id')} links DiskImage {image_id}, which does not exist",
                type=BmaasErrorType.RHCOS_IMAGE_NOT_FOUND.value,
                non_retryable=True,
            ) from None
        return BootImage(
            disk_image_id=str(image.get("id") or image_id),
            disk_image_name=(image.get("metadata") or {}).get("name"),
            cluster_version=str(version.get("id")),
            cluster_version_name=(version.get("metadata") or {}).get("name"),
        )

    # -- listing -------------------------------------------------------------------------------

    @activity.defn
    @delivers_reports
    async def list_order_instances(self, req: ListOrderInstancesInput) -> OrderInstances:
        """Every BMI of an order (any state, DELETING included), or only those named `req.name`,
        or only those whose NICs carry one of `req.macs`; sorted by name. Releases call it (a
        restarted one, one after an unanswered create): a refusal is retried, as for the release's
        delete, unless the caller gives up on one (`give_up_on_refusal`: the sweep after a wipe)."""
        listed_at = _now()
        try:
            snapshots = await order_snapshots(self.client, req.order)
        except BmaasApiError as err:
            if req.give_up_on_refusal:
                raise
            raise_refusal_as_retryable(err, "retried: the release needs the answer")
        wanted = None if req.macs is None else set(req.macs)
        instances = [
            s.worker_instance()
            for s in snapshots
            if req.name in (None, s.name) and (wanted is None or wanted.intersection(s.macs))
        ]
        return OrderInstances(instances=sorted(instances, key=lambda i: (i.name, i.id)), listed_at=listed_at)

    @activity.defn
    @delivers_reports
    @refusals_waited_out
    async def find_instances_with_macs(self, req: FindInstancesWithMacsInput) -> InstancesWithMacs:
        """The CaaS BMIs, of any order, other than `exclude_bmi_id` whose NICs carry one of the MACs.

        A fresh list, not the watcher's cache: an Agent is bound on this answer, so a host that
        started running moments ago must be seen. DELETING BMIs count (the host still has its NICs).
        The server cannot filter by MAC: its List filter becomes SQL, and a macro over the NICs
        (`nics.exists(...)`) is refused with Internal (HTTP 500, for ever). So this lists every CaaS
        BMI and matches here, on MACs normalised as an Agent's are (`BmiSnapshot.macs`); the request
        carries no MAC, so the spelling of either side cannot matter."""
        wanted = set(req.macs)
        items = await self.client.list_instances(LIST_FILTER)
        snapshots = [BmiSnapshot.from_api(item) for item in items]
        found = {
            s.id
            for s in snapshots
            if s.is_caas_worker and s.id != req.exclude_bmi_id and wanted.intersection(s.macs)
        }
        return InstancesWithMacs(bmi_ids=sorted(found))

    @activity.defn
    @refusals_waited_out  # given up on, a refusal would leave lost hosts unnoticed, and unshown
    async def find_lost_instances(self, req: FindLostInstancesInput) -> LostInstances:
        """Of the given BMIs (an order's Ready workers'), those whose host no longer runs their
        node: FAILED, DELETING, or gone. One list of the order's BMIs answers for most; a BMI missing
        from it (its labels changed by hand, say) is read by id and counts as gone only on its own
        NotFound, since a host taken for lost is released and wiped: and only while the token sees
        CaaS's objects, asked afresh then (a node is destroyed on this answer, not on a minute-old
        look, which a token rotated meanwhile to the wrong identity would not have had)."""
        listed = {
            s.id: s
            for s in map(BmiSnapshot.from_api, await self.client.list_instances(order_filter(req.order.name)))
        }
        lost: list[LostInstance] = []
        for bmi_id in sorted(set(req.bmi_ids)):
            snapshot = listed.get(bmi_id)
            if snapshot is None:
                try:
                    snapshot = BmiSnapshot.from_api(await self.client.get_instance(bmi_id))
                except BmaasApiError as err:
                    if err.type != BmaasErrorType.NOT_FOUND.value:
                        raise
                    lost.append(LostInstance(bmi_id=bmi_id))
                    continue
            if (found := snapshot.lost()) is not None:
                lost.append(found)
        gone = [found.bmi_id for found in lost if found.state is None]
        if gone and not await self.client.sees_system_objects(fresh=True):
            raise invisible_objects_error(f"GET /{INSTANCES}/{gone[0]}", self.client.visibility_canary)
        return LostInstances(lost=lost)

    @activity.defn
    async def apply_security_groups(self, req: ApplySecurityGroupsInput) -> SecurityGroupsApplied:
        """Put every live BMI of the order in the order's security groups now. A tenant may change
        them on a live order (`securityGroupRefs` is mutable, the subnet is not), and a host left in
        the old groups keeps whatever they allowed. Only the attachments' groups change (update mask
        `spec.network_attachments`, locked to the listed version: a concurrent change makes a
        retryable conflict, never a lost write). BMIs being deleted or failed, and BMIs without a
        network attachment, are left as they are."""
        wanted = sorted(set(req.security_groups))
        changed: list[str] = []
        for obj in await self.client.list_instances(order_filter(req.order.name)):
            snapshot = BmiSnapshot.from_api(obj)
            if not snapshot.belongs_to(req.order) or snapshot.state in LOST_STATES:
                continue
            listed = (obj.get("spec") or {}).get("network_attachments") or []
            attachments = [a for a in listed if isinstance(a, dict)]
            if all(_group_names(a) == wanted for a in attachments):
                continue  # already in the groups, or no attachment to put in them
            body: dict[str, Any] = {
                "spec": {
                    "network_attachments": [
                        {**a, "security_groups": [_reference(ref) for ref in req.security_groups]}
                        for a in attachments
                    ]
                },
            }
            if snapshot.version is not None:
                body["metadata"] = {"version": snapshot.version}
            try:
                await self.client.update_instance(
                    snapshot.id, body, update_mask=NETWORK_ATTACHMENTS_MASK, lock=snapshot.version is not None
                )
            except BmaasApiError as err:
                if err.type != BmaasErrorType.NOT_FOUND.value:
                    raise
                continue  # deleted meanwhile: nothing left to put in the groups
            log.info(
                "BMI %s (%s) of %s put in security groups %s",
                snapshot.name,
                snapshot.id,
                req.order.key,
                wanted,
            )
            changed.append(snapshot.id)
        return SecurityGroupsApplied(bmi_ids=sorted(changed))

    # -- helpers -------------------------------------------------------------------------------

    def _secrets(self) -> list[str]:
        token = self.client.token.current
        return [token] if token else []

    def _tick(self) -> float:
        return tick_seconds(self.heartbeat_interval)


def _wait_progress(bmi_id: str, obs: Observed, streaming: bool) -> WaitProgress:
    details = WaitProgress(bmi_id=bmi_id, observed_via="watch" if streaming else "polling")
    if isinstance(obs, BmiSnapshot):
        details.state = obs.state
    return details


def _reference(ref: str) -> dict[str, str]:
    # The order's `subnetRef` and `securityGroupRefs` are Subnet and SecurityGroup CR names (the
    # CRD), so BMaaS is asked to resolve them by name, as OSAC's own worker reconciler does; what it
    # lists back (as sent, or resolved to `{id, name}`) is compared by name.
    return {"name": ref}


def _group_names(attachment: dict[str, Any]) -> list[str]:
    groups = attachment.get("security_groups") or []
    return sorted({ref for ref in map(_reference_name, groups) if ref})


def _reference_name(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("name") or None
    return None


def _reference_id(value: Any) -> str | None:
    if isinstance(value, str):
        return value or None
    if isinstance(value, dict):
        return value.get("id") or value.get("name") or None
    return None


def _previous_deleting_since() -> datetime | None:
    """When an earlier attempt of this activity first saw the BMI deleting (from its heartbeats)."""
    for detail in activity.info().heartbeat_details or ():
        try:
            progress = detail if isinstance(detail, WaitProgress) else WaitProgress.model_validate(detail)
        except (ValueError, TypeError):
            continue
        if progress.deleting_since is not None:
            return progress.deleting_since
    return None
