"""The harness's hands on the twins: arming their fault knobs and reading their state and audit.

The harness itself must see the truth through the chaos: hub reads use the lab controllers' token,
which the hub faults (aimed at the worker's user) never hit, and BMaaS API reads are retried past
the injected 503s. Lab routes (`/lab/v1/...`) are never faulted.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import httpx

from bench.chaos.config import ChaosConfig, ChaosPlan
from contracts.refs import OrderRef
from lab.hub.testing import ADMIN_USER
from tests.workflows.stack import Stack

BMIS = "/api/private/v1/baremetal_instances"
ORDER_LABEL = "osac.openshift.io/cluster-order"
CLUSTER_ORDERS = "/apis/osac.openshift.io/v1alpha1/namespaces/{ns}/clusterorders"
AGENTS = "/apis/agent-install.openshift.io/v1beta1/namespaces/{ns}/agents"
INFRA_ENVS = "/apis/agent-install.openshift.io/v1beta1/namespaces/{ns}/infraenvs"
MACHINES = "/apis/cluster.x-k8s.io/v1beta1/namespaces/{ns}/machines"
NODE_POOLS = "/apis/hypershift.openshift.io/v1beta1/namespaces/{ns}/nodepools"
UPDATES = ["update", "patch"]
READ_DEADLINE_S = 120.0

Obj = dict[str, Any]


class Twins:
    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        # The lab controllers' identity: outside the worker-aimed hub faults.
        self.hub = httpx.AsyncClient(
            base_url=stack.lab.url,
            headers=stack.lab.hub.headers(stack.lab.hub.controller_token),
            timeout=30.0,
        )
        self.bmaas = stack.bmaas_http

    async def aclose(self) -> None:
        await self.hub.aclose()

    # -------------------------------------------------------------------------------- reading

    async def _get(self, http: httpx.AsyncClient, path: str, **params: Any) -> Obj:
        """GET through injected 503s, latency and watch cuts: retried until a generous deadline."""
        deadline = time.monotonic() + READ_DEADLINE_S
        while True:
            try:
                response = await http.get(path, params=params or None)
                if response.status_code < 500:
                    response.raise_for_status()
                    result: Obj = response.json()
                    return result
                problem = f"HTTP {response.status_code}"
            except httpx.TransportError as err:
                problem = repr(err)
            if time.monotonic() > deadline:
                raise RuntimeError(f"GET {path} kept failing for {READ_DEADLINE_S}s: {problem}")
            await asyncio.sleep(0.2)

    async def bmis(self, order: OrderRef | None = None) -> list[Obj]:
        params: dict[str, Any] = {"limit": 10000}
        if order is not None:
            params["filter"] = f"this.metadata.labels['{ORDER_LABEL}'] == '{order.name}'"
        items: list[Obj] = (await self._get(self.bmaas, BMIS, **params)).get("items") or []
        return items

    async def audit(self) -> list[Obj]:
        records: list[Obj] = (await self._get(self.bmaas, "/lab/v1/audit"))["records"]
        return records

    async def audit_violations(self) -> list[str]:
        violations: list[str] = (await self._get(self.bmaas, "/lab/v1/audit/violations"))["violations"]
        return violations

    async def hosts(self) -> list[Obj]:
        items: list[Obj] = (await self._get(self.bmaas, "/lab/v1/hosts"))["items"]
        return items

    async def hub_items(self, template: str, namespace: str) -> list[Obj]:
        items: list[Obj] = (await self._get(self.hub, template.format(ns=namespace)))["items"]
        return items

    async def cluster_order(self, order: OrderRef) -> Obj:
        return await self._get(self.hub, CLUSTER_ORDERS.format(ns=order.namespace) + f"/{order.name}")

    async def hub_fault_status(self) -> Obj:
        return await self._get(self.hub, "/lab/v1/faults/api")

    # ------------------------------------------------------------------------------- faults

    async def _send(self, http: httpx.AsyncClient, method: str, path: str, body: Obj | None = None) -> Obj:
        response = await http.request(method, path, json=body)
        response.raise_for_status()
        result: Obj = response.json()
        return result

    async def arm(self, config: ChaosConfig, plan: ChaosPlan) -> None:
        """Every fault of the scenario at once, each with its seed from the plan."""
        await self._send(
            self.bmaas,
            "PUT",
            "/lab/v1/faults",
            {"error_rate": config.bmaas_error_rate, "seed": plan.bmaas_fault_seed},
        )
        # Every write fails at the configured rate: updates and patches half with 409 (where a
        # conflict is real) and half with 500, creates and deletes with 500.
        rate = config.hub_write_error_rate
        half = rate / 2
        await self._send(
            self.hub,
            "PUT",
            "/lab/v1/faults/api",
            {
                "seed": plan.hub_fault_seed,
                "errors": [
                    {"code": 409, "verbs": UPDATES, "users": [ADMIN_USER], "rate": half},
                    {"code": 500, "verbs": UPDATES, "users": [ADMIN_USER], "rate": half / (1 - half)},
                    {"code": 500, "verbs": ["create", "delete"], "users": [ADMIN_USER], "rate": rate},
                ],
                "watch": {"closeRate": config.hub_watch_cut_rate, "users": [ADMIN_USER]},
            },
        )
        await self._send(
            self.hub,
            "PUT",
            "/lab/v1/faults/agents",
            {"seed": plan.agent_fault_seed, "never_register": {"rate": config.never_register_rate}},
        )

    async def set_latency(self, seconds: float) -> None:
        await self._send(self.bmaas, "PATCH", "/lab/v1/faults", {"latency_s": seconds})

    async def fail_wipes_of(self, host_ids: list[str]) -> None:
        await self._send(self.bmaas, "PATCH", "/lab/v1/faults", {"wipe_failure_hosts": host_ids})

    async def disarm(self) -> None:
        """No more injected errors, latency or cuts; wipes of the chosen hosts still fail (a
        quarantine is for good, and those wipes already happened)."""
        await self._send(self.bmaas, "PATCH", "/lab/v1/faults", {"error_rate": 0.0, "latency_s": 0.0})
        await self._send(self.hub, "DELETE", "/lab/v1/faults/api")
        await self._send(self.hub, "DELETE", "/lab/v1/faults/agents")


def pick(rng_seed: int, items: list[str], count: int) -> list[str]:
    return sorted(random.Random(rng_seed).sample(sorted(items), count))
