"""Lab routes of the hub twin: request stats and API faults. All need a valid bearer token."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request

from lab.hub.auth import hub_user
from lab.hub.faults import ApiFaultConfig, ApiFaultStatus
from lab.hub.hub import Hub
from lab.hub.stats import StatsReport

router = APIRouter(prefix="/lab/v1", dependencies=[Depends(hub_user)])


def _hub(request: Request) -> Hub:
    hub: Hub = request.app.state.hub
    return hub


@router.get("/stats", response_model=StatsReport, response_model_by_alias=True)
async def get_stats(
    request: Request, exclude_user: list[str] | None = Query(default=None, alias="excludeUser")
) -> StatsReport:
    """Requests by user, verb and resource; `?excludeUser=lab-controllers` leaves a user out."""
    return _hub(request).stats.report(frozenset(exclude_user or ()))


@router.delete("/stats", response_model=StatsReport, response_model_by_alias=True)
async def reset_stats(request: Request) -> StatsReport:
    hub = _hub(request)
    hub.stats.reset()
    return hub.stats.report()


def _fault_status(hub: Hub) -> ApiFaultStatus:
    return ApiFaultStatus(
        config=hub.faults.config,
        injected_errors=list(hub.faults.injected),
        watches_cut=hub.faults.watches_cut,
        open_watches=len(hub.store.watchers()),
    )


@router.get("/faults/api", response_model=ApiFaultStatus, response_model_by_alias=True)
async def get_api_faults(request: Request) -> ApiFaultStatus:
    return _fault_status(_hub(request))


@router.put("/faults/api", response_model=ApiFaultStatus, response_model_by_alias=True)
async def put_api_faults(request: Request, config: ApiFaultConfig) -> ApiFaultStatus:
    """Replace the fault configuration (re-seeding the RNG); `closeWatchesNow` also cuts open watches."""
    hub = _hub(request)
    hub.faults.configure(config)
    if config.close_watches_now:
        hub.faults.watches_cut += hub.close_watches()
    return _fault_status(hub)


@router.delete("/faults/api", response_model=ApiFaultStatus, response_model_by_alias=True)
async def delete_api_faults(request: Request) -> ApiFaultStatus:
    hub = _hub(request)
    hub.faults.reset()
    return _fault_status(hub)


@router.post("/faults/api/close-watches", response_model=ApiFaultStatus, response_model_by_alias=True)
async def close_watches(request: Request) -> ApiFaultStatus:
    """Cut every open watch stream now."""
    hub = _hub(request)
    hub.faults.watches_cut += hub.close_watches()
    return _fault_status(hub)
