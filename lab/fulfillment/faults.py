"""Fault knobs of the fulfillment twin (`/lab/v1/faults`).

JSON shape (GET answers it, PUT replaces it, PATCH replaces the top-level fields it names, DELETE
resets it to no faults):

    {
      "error_rate": 0.0,        # share of API requests answered 503 Unavailable (gRPC 14)
      "latency_s": 0.0,         # added to every API request before it is handled
      "hang_rate": 0.0,         # share of API requests that never answer (see below)
      "routes": {               # per-route knobs; an entry replaces the three above for that route
        "POST /api/private/v1/baremetal_instances": {"error_rate": 1.0, "latency_s": 0, "hang_rate": 0,
                                                     "echo_user_data": null},  # or "quoted", "text"
        "GET /api/private/v1/cluster_versions": {"error_rate": 1.0, "error_code": 7},  # 403
        "/api/private/v1/events/watch": {"hang_rate": 1.0}       # no method = every method
      },
      "provisioning_failure_rate": 0.0,  # share of allocated BMIs that end FAILED instead of RUNNING
      "no_free_hosts": false,            # allocation finds nothing: the BMI ends FAILED
      "wipe_failure_rate": 0.0,          # share of wipes that fail (host quarantined for good)
      "wipe_failure_hosts": [],          # host ids whose wipe always fails
      "watch_headers_with_first_event": false,  # the real gateway: a watch answers with its first event
      "seed": 0                          # given: reseeds the fault RNG now; answers show the last seed
    }

Route keys are the route templates the answers of `/lab/v1/stats` use. The knobs cover the BMaaS API
(`/api/...`) only, never `/lab/v1/...`, so a test can always clear them. A hanging request answers
nothing and changes nothing until the fault configuration changes or the server stops; it is then
released with 503. Rates of exactly 0 or 1 never draw from the RNG; rates in between draw from one
`random.Random` seeded from the lab seed (or the last `seed` given), so sequential runs repeat.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from lab.fulfillment.errors import GrpcCode

_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})


class UserDataEcho(StrEnum):
    """How an injected error quotes the request's `spec.user_data` back, as servers do."""

    # In the gateway's JSON message, quoted and escaped as JSON is (non-ASCII as \\uXXXX).
    QUOTED = "quoted"
    # In a plain-text answer (a proxy's or a gateway's own page), as it came, before anything else.
    TEXT = "text"


class RouteFault(BaseModel):
    model_config = ConfigDict(extra="forbid")

    error_rate: float = Field(default=0.0, ge=0, le=1)
    latency_s: float = Field(default=0.0, ge=0)
    hang_rate: float = Field(default=0.0, ge=0, le=1)
    # The gRPC code of the injected errors: 14 Unavailable (503) unless a route asks for another,
    # such as 7 PermissionDenied (403) or 16 Unauthenticated (401).
    error_code: GrpcCode = GrpcCode.UNAVAILABLE
    # The injected errors quote the request's user data (the discovery ignition, with its secrets).
    echo_user_data: UserDataEcho | None = None


class FaultConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    error_rate: float = Field(default=0.0, ge=0, le=1)
    latency_s: float = Field(default=0.0, ge=0)
    hang_rate: float = Field(default=0.0, ge=0, le=1)
    routes: dict[str, RouteFault] = Field(default_factory=dict)
    provisioning_failure_rate: float = Field(default=0.0, ge=0, le=1)
    no_free_hosts: bool = False
    wipe_failure_rate: float = Field(default=0.0, ge=0, le=1)
    wipe_failure_hosts: list[str] = Field(default_factory=list)
    # The real gateway's watch: grpc-gateway writes the HTTP status and headers with the stream's
    # first message (the upstream Watch never sends gRPC headers before its first event), so a
    # subscription answers nothing until an event matches. Off by default: the twin answers at once.
    watch_headers_with_first_event: bool = False
    seed: int | None = None

    @field_validator("routes")
    @classmethod
    def _route_keys(cls, routes: dict[str, RouteFault]) -> dict[str, RouteFault]:
        for key in routes:
            method, _, path = key.rpartition(" ")
            if not path.startswith("/") or (method and method not in _METHODS):
                raise ValueError(f"route key {key!r} must be '<METHOD> /path/template' or '/path/template'")
        return routes


@dataclass(frozen=True)
class RequestFault:
    latency_s: float = 0.0
    hang: bool = False
    error: bool = False
    error_code: GrpcCode = GrpcCode.UNAVAILABLE
    echo_user_data: UserDataEcho | None = None


class FaultInjector:
    """Owns the fault configuration and the one seeded RNG every fault decision draws from."""

    def __init__(self, seed: int) -> None:
        self._config = FaultConfig()
        self._rng = random.Random(seed)
        self._last_seed = seed
        self._hang_gate = asyncio.Event()
        self._closed = False

    @property
    def config(self) -> FaultConfig:
        # `seed` is an action (reseed now), so the stored config never holds one; answers show the last.
        return self._config.model_copy(update={"seed": self._last_seed})

    def replace(self, config: FaultConfig) -> FaultConfig:
        if config.seed is not None:
            self._rng.seed(config.seed)
            self._last_seed = config.seed
        self._config = config.model_copy(update={"seed": None})
        self._release_hangs()
        return self.config

    def patch(self, changes: dict[str, Any]) -> FaultConfig:
        return self.replace(FaultConfig.model_validate({**self._config.model_dump(), **changes}))

    def clear(self) -> FaultConfig:
        return self.replace(FaultConfig())

    def close(self) -> None:
        self._closed = True
        self._hang_gate.set()

    def _release_hangs(self) -> None:
        gate, self._hang_gate = self._hang_gate, asyncio.Event()
        gate.set()

    def _roll(self, rate: float) -> bool:
        if rate <= 0:
            return False
        if rate >= 1:
            return True
        return self._rng.random() < rate

    def _route_fault(self, method: str, route: str) -> RouteFault:
        cfg = self._config
        specific = cfg.routes.get(f"{method} {route}") or cfg.routes.get(route)
        if specific is not None:
            return specific
        return RouteFault(error_rate=cfg.error_rate, latency_s=cfg.latency_s, hang_rate=cfg.hang_rate)

    def for_request(self, method: str, route: str) -> RequestFault:
        knobs = self._route_fault(method, route)
        hang = not self._closed and self._roll(knobs.hang_rate)
        return RequestFault(
            latency_s=knobs.latency_s,
            hang=hang,
            error=self._roll(knobs.error_rate),
            error_code=knobs.error_code,
            echo_user_data=knobs.echo_user_data,
        )

    async def wait_until_released(self) -> None:
        await self._hang_gate.wait()

    def provisioning_fails(self) -> bool:
        return self._roll(self._config.provisioning_failure_rate)

    def no_free_hosts(self) -> bool:
        return self._config.no_free_hosts

    def wipe_fails(self, host_id: str) -> bool:
        if host_id in self._config.wipe_failure_hosts:
            return True
        return self._roll(self._config.wipe_failure_rate)
