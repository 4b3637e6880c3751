"""Lab-only admin routes (`/lab/v1`, admin token): hosts, faults, audit, stats, timings.

GET  /lab/v1/hosts                 {size, total, items: [host]}
POST /lab/v1/hosts                 {id?, labels, nics?} -> host (two NICs generated when omitted)
GET  /lab/v1/hosts/{id}            host
GET|PUT|PATCH|DELETE /lab/v1/faults        fault config (see faults.py)
GET  /lab/v1/audit?since=&kind=&host_id=&bmi_id=   {records, last_seq} (see audit.py)
GET  /lab/v1/audit/violations      {violations: [...]}: double allocations, unwiped reuse
GET|DELETE /lab/v1/stats           {total, requests, in_flight: {"<METHOD> <route>": n}, watchers}
GET  /lab/v1/timings               {allocation_s, image_write_s, boot_s, wipe_s, deprovision_s}
PUT  /lab/v1/timings               {profile?: demo|realistic|zero (default demo), <field>: s, ...}
PATCH /lab/v1/timings              {<field>: s, ...} on top of the current timings
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel

from lab.fulfillment.audit import AuditKind, find_violations
from lab.fulfillment.deps import admin_caller, get_lab, read_json
from lab.fulfillment.errors import ApiError
from lab.fulfillment.faults import FaultConfig
from lab.fulfillment.inventory import NewHost
from lab.fulfillment.objects import as_object, validate_as
from lab.fulfillment.timings import TimingProfile, Timings

LAB_PREFIX = "/lab/v1"


def lab_router() -> APIRouter:
    router = APIRouter(prefix=LAB_PREFIX, dependencies=[Depends(admin_caller)])

    # ------------------------------------------------------------------------------------- hosts

    @router.get("/hosts")
    async def list_hosts(request: Request) -> dict[str, Any]:
        hosts = [h.model_dump(mode="json") for h in get_lab(request).inventory.all()]
        return {"size": len(hosts), "total": len(hosts), "items": hosts}

    @router.post("/hosts")
    async def add_host(request: Request) -> dict[str, Any]:
        new = validate_as(NewHost, await read_json(request))
        return get_lab(request).add_host(new).model_dump(mode="json")

    @router.get("/hosts/{id}")
    async def get_host(id: str, request: Request) -> dict[str, Any]:
        host = get_lab(request).inventory.get(id)
        if host is None:
            raise ApiError.not_found("host", id)
        return host.model_dump(mode="json")

    @router.post("/baremetal_instances/{id}/break")
    async def break_host(id: str, request: Request) -> dict[str, Any]:
        """Make the host under a BMI fail, as hardware does: the BMI turns FAILED."""
        lab = get_lab(request)
        rec = lab.table.get(id)
        if rec is None:
            raise ApiError.not_found("baremetal_instance", id)
        lab.lifecycle.break_host(rec)
        return {"id": id, "state": rec.obj.status.state.value}

    # ------------------------------------------------------------------------------------ faults

    @router.get("/faults")
    async def get_faults(request: Request) -> dict[str, Any]:
        return get_lab(request).faults.config.model_dump(mode="json")

    @router.put("/faults")
    async def put_faults(request: Request) -> dict[str, Any]:
        config = validate_as(FaultConfig, await read_json(request))
        return get_lab(request).faults.replace(config).model_dump(mode="json")

    @router.patch("/faults")
    async def patch_faults(request: Request) -> dict[str, Any]:
        changes = as_object(await read_json(request))
        faults = get_lab(request).faults
        validate_as(FaultConfig, {**faults.config.model_dump(), **changes})  # named errors, nothing applied
        return faults.patch(changes).model_dump(mode="json")

    @router.delete("/faults")
    async def clear_faults(request: Request) -> dict[str, Any]:
        return get_lab(request).faults.clear().model_dump(mode="json")

    # ------------------------------------------------------------------------------- audit, stats

    @router.get("/audit")
    async def audit(
        request: Request,
        since: int = Query(0, ge=0, description="only records with a larger seq"),
        kind: AuditKind | None = Query(None),
        host_id: str | None = Query(None),
        bmi_id: str | None = Query(None),
    ) -> dict[str, Any]:
        log = get_lab(request).audit
        records = log.records(since=since, kind=kind, host_id=host_id, bmi_id=bmi_id)
        return {
            "records": [r.model_dump(mode="json", exclude_none=True) for r in records],
            "last_seq": log.last_seq,
        }

    @router.get("/audit/violations")
    async def violations(request: Request) -> dict[str, Any]:
        return {"violations": find_violations(get_lab(request).audit.records())}

    @router.get("/stats")
    async def stats(request: Request) -> dict[str, Any]:
        lab = get_lab(request)
        return {**lab.stats.snapshot(), "watchers": lab.bus.subscriber_count}

    @router.delete("/stats")
    async def reset_stats(request: Request) -> dict[str, Any]:
        lab = get_lab(request)
        lab.stats.reset()
        return {**lab.stats.snapshot(), "watchers": lab.bus.subscriber_count}

    # ----------------------------------------------------------------------------------- timings

    @router.get("/timings")
    async def get_timings(request: Request) -> dict[str, Any]:
        return get_lab(request).timings.model_dump()

    @router.put("/timings")
    async def put_timings(request: Request) -> dict[str, Any]:
        body = dict(as_object(await read_json(request)))
        profile = validate_as(_ProfileChoice, {"profile": body.pop("profile", TimingProfile.DEMO.value)})
        timings = validate_as(Timings, {**Timings.for_profile(profile.profile).model_dump(), **body})
        get_lab(request).timings = timings
        return timings.model_dump()

    @router.patch("/timings")
    async def patch_timings(request: Request) -> dict[str, Any]:
        lab = get_lab(request)
        body = as_object(await read_json(request))
        lab.timings = validate_as(Timings, {**lab.timings.model_dump(), **body})
        return lab.timings.model_dump()

    return router


class _ProfileChoice(BaseModel):
    profile: TimingProfile
