"""Bad input, one table (issue #8 §2): each row gives one bad input the way a user gives it (CLI,
library call, ClusterOrder, kubectl-like client, process configuration, a rogue hub object) and
asserts the exact error where that user sees it (which field, why) and that no host was allocated
for it (the fulfillment twin's audit log shows no allocation for the order since the row began).

Rows that need behaviour the product lacks are strict xfails whose reason names what is missing.
ClusterOrder rows use namespaces the module's controller watches; library rows use others, so the
controller never acts on an order a row drives by hand.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import kubernetes
import pytest
from temporalio.testing import WorkflowEnvironment

from activities.bmaas.client import BmaasClient
from activities.kube import HubKube
from contracts.hub import WORKER_LABEL
from contracts.refs import OrderRef
from contracts.workflows import NodeSetRequest, SetNodeSets
from lab.http_server import refusing_port
from lab.hub.kubeconfig import write_kubeconfig
from lab.hub_controllers.inventory import host_inventory, to_agent_inventory
from starter.api import WorkflowState
from starter.controller import ClusterOrderController
from starter.validation import InstanceTypeCatalog
from tests.starter.harness import (
    ORDER_PATH,
    RunningController,
    bare_metal,
    cli_env,
    get_order,
    order_body,
    patch_order,
    wait_observed,
)
from tests.workflows.stack import (
    AGENT_API,
    INSTANCE_TYPES,
    Stack,
    condition,
    eventually,
    running_stack,
    wait_condition,
)
from workflows.cluster_workers import ClusterWorkersWorkflow

CLI = str(Path(sys.executable).parent / "osac-workers")
GUARD = "node_sets[].count: lowering the order from 3 to 0 workers removes 3 at once"
INFRAENV_LABEL = "infraenvs.agent-install.openshift.io"
# A valid dockerconfigjson big enough that the discovery ignition carrying it exceeds 64 KiB.
BIG_PULL_SECRET = json.dumps(
    {
        "auths": {
            f"r{i}.example.com": {"auth": base64.b64encode(b"u:" + b"p" * 600).decode()} for i in range(100)
        }
    }
)


def normalised(text: str) -> str:
    """One line: rich's boxes and wrapping removed, whitespace collapsed."""
    for box in "│╭╮╰╯─":
        text = text.replace(box, " ")
    return " ".join(text.split())


@dataclass
class Seen:
    """What the user saw, and whose allocations must not have grown since `since` (audit seq)."""

    message: str
    order: OrderRef | None = None
    since: int = 0
    # False when allocating is part of the row (it then proves its own outcome: released, unbound).
    check_allocation: bool = True


@dataclass
class Ctx:
    stack: Stack
    ctl: RunningController
    temporal_address: str
    workdir: Path
    controlled: Iterator[str]
    shared: dict[str, OrderRef] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        return {**cli_env(self.stack, self.temporal_address), "COLUMNS": "400", "NO_COLOR": "1"}

    async def audit_seq(self) -> int:
        response = await self.stack.bmaas_http.get("/lab/v1/audit", params={"since": 10**9})
        response.raise_for_status()
        return int(response.json()["last_seq"])

    async def allocations_since(self, order: OrderRef, since: int) -> list[dict[str, Any]]:
        response = await self.stack.bmaas_http.get(
            "/lab/v1/audit", params={"since": since, "kind": "HOST_ALLOCATED"}
        )
        response.raise_for_status()
        prefix = f"{order.name}-worker-"
        return [r for r in response.json()["records"] if str(r.get("bmi_name", "")).startswith(prefix)]

    async def cli(self, *args: str, env: dict[str, str] | None = None) -> str:
        result = await asyncio.to_thread(
            subprocess.run, [CLI, *args], env=env or self.env, capture_output=True, text=True, timeout=240
        )
        return f"exit {result.returncode}: {normalised(result.stderr)}"

    # -- orders ------------------------------------------------------------------------------

    async def managed_order(
        self, node_requests: list[dict[str, Any]], *, name: str | None = None, **spec: Any
    ) -> OrderRef:
        """A ClusterOrder in a namespace the controller watches (it acts on it like on a tenant's)."""
        namespace = next(self.controlled)
        response = await self.stack.hub_http.post(
            "/api/v1/namespaces", json={"metadata": {"name": namespace}}
        )
        response.raise_for_status()
        ref = OrderRef(namespace=namespace, name=name or f"o{uuid.uuid4().hex[:8]}")
        body = order_body(ref, node_requests)
        for key, value in spec.items():
            if value is None:
                body["spec"].pop(key, None)
            else:
                body["spec"][key] = value
        response = await self.stack.hub_http.post(ORDER_PATH.format(namespace=namespace), json=body)
        response.raise_for_status()
        return ref

    async def library_order(self, count: int | None = None) -> OrderRef:
        """A ClusterOrder the controller does not watch, driven through the library API."""
        order = await self.stack.create_order({"bm-standard": max(count or 0, 1)})
        if count is not None:
            await self.stack.apply(order, {"bm-standard": count})
        return order

    async def ready(self, key: str, count: int, *, managed: bool) -> OrderRef:
        """An order with `count` Ready workers, created once per key and shared by rows."""
        if key not in self.shared:
            if managed:
                order = await self.managed_order(bare_metal(bm_standard=count))
            else:
                order = await self.library_order(count)
            self.shared[key] = order

        order = self.shared[key]

        async def settled() -> bool:
            try:
                status = await self.stack.api.status(order)
            except Exception:  # the controller may not have started it yet
                return False
            return status.ready_workers == count == len(status.workers)

        await eventually(settled, f"{count} Ready workers of {order.key}", timeout=180)
        return order

    async def discard(self, order: OrderRef) -> None:
        """Delete a ClusterOrder a row is done with (its finalizer has the controller decommission
        it), so a worker retrying forever does not load the rows after it."""
        response = await self.stack.hub_http.delete(
            f"{ORDER_PATH.format(namespace=order.namespace)}/{order.name}"
        )
        if response.status_code != 404:
            response.raise_for_status()

    async def bmi_ids(self, order: OrderRef) -> set[str]:
        return {b["id"] for b in await self.stack.bmis(order)}


async def untouched(ctx: Ctx, order: OrderRef, before: set[str], count: int) -> None:
    """A refused change left the workers as they were: same BMIs, all still Ready."""
    status = await ctx.stack.api.status(order)
    assert status.ready_workers == count and len(status.workers) == count, status
    assert await ctx.bmi_ids(order) == before


# ------------------------------------------------------------------------------------ the rows
# Each act gives the bad input and returns what the user saw.


async def cli_unknown_node_set(ctx: Ctx) -> Seen:
    order = await ctx.ready("managed-1", 1, managed=True)
    since = await ctx.audit_seq()
    return Seen(await ctx.cli("scale", order.key, "--node-set", "bm-nope", "--count", "1"), order, since)


async def cli_negative_count(ctx: Ctx) -> Seen:
    order = await ctx.ready("managed-1", 1, managed=True)
    since = await ctx.audit_seq()
    return Seen(await ctx.cli("scale", order.key, "--node-set", "bm-standard", "--count", "-1"), order, since)


async def cli_over_maximum(ctx: Ctx) -> Seen:
    order = await ctx.ready("managed-1", 1, managed=True)
    since = await ctx.audit_seq()
    return Seen(
        await ctx.cli("scale", order.key, "--node-set", "bm-standard", "--count", "101"), order, since
    )


async def cli_non_dns_order(ctx: Ctx) -> Seen:
    return Seen(await ctx.cli("status", "Bad_NS/Order"))


async def cli_scale_down_unknown_worker(ctx: Ctx) -> Seen:
    order = await ctx.ready("managed-1", 1, managed=True)
    since = await ctx.audit_seq()
    return Seen(await ctx.cli("scale-down", order.key, "nope"), order, since)


async def cli_unreachable_hub(ctx: Ctx) -> Seen:
    order = await ctx.ready("managed-1", 1, managed=True)
    since = await ctx.audit_seq()
    with refusing_port() as port:
        dead = write_kubeconfig(ctx.workdir / "dead-hub.kubeconfig", f"http://127.0.0.1:{port}", "token")
        env = {**ctx.env, "KUBECONFIG": str(dead)}
        seen = await ctx.cli("scale", order.key, "--node-set", "bm-standard", "--count", "2", env=env)
    return Seen(seen, order, since)


async def cli_mass_scale_down(ctx: Ctx) -> Seen:
    order = await ctx.ready("managed-3", 3, managed=True)
    before, since = await ctx.bmi_ids(order), await ctx.audit_seq()
    seen = await ctx.cli("scale", order.key, "--node-set", "bm-standard", "--count", "0")
    # Refused means unchanged: the ClusterOrder still asks for 3 and the workers stay.
    obj = await get_order(ctx.stack, order)
    assert (obj or {})["spec"]["nodeRequests"][0]["numberOfNodes"] == 3
    await wait_observed(ctx.stack, ctx.ctl, order)
    await untouched(ctx, order, before, 3)
    return Seen(seen, order, since)


def spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """A long-running `osac-workers` process, its output in `log`; the row stops it by its pid."""
    with log.open("wb") as out:
        return subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)


def _refusal(err: Exception) -> str:
    return normalised(f"{type(err).__name__}: {err}")


async def api_unknown_instance_type(ctx: Ctx) -> Seen:
    order = await ctx.library_order()
    since = await ctx.audit_seq()
    try:
        await ctx.stack.api.apply(
            order,
            [NodeSetRequest(name="bm-nope", instance_type="bm-nope", count=1)],
            instance_types=INSTANCE_TYPES,
        )
    except Exception as err:
        return Seen(_refusal(err), order, since)
    return Seen("accepted", order, since)


def long_order_name() -> str:
    """A valid order name (50 characters) too long for its NodePool's: nodepool-<order>-bm-standard."""
    return f"o{uuid.uuid4().hex[:8]}-" + "x" * 40


async def api_order_name_too_long(ctx: Ctx) -> Seen:
    order = await ctx.stack.create_order({"bm-standard": 1}, name=long_order_name())
    since = await ctx.audit_seq()
    try:
        await ctx.stack.apply(order, {"bm-standard": 1})
    except Exception as err:
        return Seen(_refusal(err), order, since)
    return Seen("accepted", order, since)


async def api_duplicate_node_sets(ctx: Ctx) -> Seen:
    order = await ctx.library_order()
    since = await ctx.audit_seq()
    twice = [NodeSetRequest(name="bm-standard", instance_type="bm-standard", count=1)] * 2
    try:
        await ctx.stack.api.apply(order, twice, instance_types=INSTANCE_TYPES)
    except Exception as err:
        return Seen(_refusal(err), order, since)
    return Seen("accepted", order, since)


async def api_non_dns_name(ctx: Ctx) -> Seen:
    try:
        NodeSetRequest(name="Bad_Name", instance_type="bm-standard", count=1)
    except Exception as err:
        return Seen(_refusal(err))
    return Seen("accepted")


async def api_negative_count_on_the_wire(ctx: Ctx) -> Seen:
    """What a non-Python caller sending the documented payload with count -1 sees."""
    order = await ctx.library_order(0)
    since = await ctx.audit_seq()
    command = SetNodeSets.model_construct(
        node_sets=[NodeSetRequest.model_construct(name="bm-standard", instance_type="bm-standard", count=-1)],
        confirm_scale_down=False,
    )
    try:
        await ctx.stack.api.handle(order).execute_update(ClusterWorkersWorkflow.set_node_sets, command)
    except Exception as err:
        cause = getattr(err, "cause", None)
        return Seen(normalised(f"{err}: {getattr(cause, 'message', cause)}"), order, since)
    return Seen("accepted", order, since)


async def api_mass_scale_down(ctx: Ctx) -> Seen:
    order = await ctx.ready("library-3", 3, managed=False)
    before, since = await ctx.bmi_ids(order), await ctx.audit_seq()
    try:
        await ctx.stack.api.scale(order, "bm-standard", 0)
        seen = "accepted"
    except Exception as err:
        seen = _refusal(err)
    await untouched(ctx, order, before, 3)
    return Seen(seen, order, since)


@contextlib.asynccontextmanager
async def slow_wipes(stack: Stack) -> AsyncIterator[None]:
    """Wipes take long enough that a decommission is still under way for the next command."""
    (await stack.bmaas_http.patch("/lab/v1/timings", json={"wipe_s": 60})).raise_for_status()
    try:
        yield
    finally:  # a waiting wipe re-reads its duration and finishes now
        (await stack.bmaas_http.patch("/lab/v1/timings", json={"wipe_s": 0})).raise_for_status()


async def api_decommission_twice(ctx: Ctx) -> Seen:
    order = await ctx.library_order(1)
    await ctx.stack.wait_ready(order, 1)
    since = await ctx.audit_seq()
    async with slow_wipes(ctx.stack):
        await ctx.stack.api.decommission(order)
        try:
            await ctx.stack.api.decommission(order)
            seen = "accepted"
        except Exception as err:
            seen = _refusal(err)
    await asyncio.wait_for(ctx.stack.api.wait_finished(order), 120)
    return Seen(seen, order, since)


async def _decommissioned(ctx: Ctx) -> OrderRef:
    if "decommissioned" not in ctx.shared:
        order = await ctx.library_order(1)
        await ctx.stack.wait_ready(order, 1)
        await ctx.stack.decommission_and_wait(order)
        ctx.shared["decommissioned"] = order
    return ctx.shared["decommissioned"]


async def api_scale_after_decommission(ctx: Ctx) -> Seen:
    order = await _decommissioned(ctx)
    since = await ctx.audit_seq()
    try:
        await ctx.stack.api.scale(order, "bm-standard", 2)
        return Seen("accepted", order, since)
    except Exception as err:
        return Seen(_refusal(err), order, since)


async def api_scale_down_after_decommission(ctx: Ctx) -> Seen:
    order = await _decommissioned(ctx)
    since = await ctx.audit_seq()
    try:
        await ctx.stack.api.scale_down_worker(order, order.worker_name(0))
        return Seen("accepted", order, since)
    except Exception as err:
        return Seen(_refusal(err), order, since)


async def _rejected_order(ctx: Ctx, node_requests: list[dict[str, Any]]) -> Seen:
    order = await ctx.managed_order(node_requests)
    cond = await wait_condition(ctx.stack, order, "NodeRequestsValid", "False")
    await wait_observed(ctx.stack, ctx.ctl, order)
    assert await ctx.stack.api.workflow_state(order) == WorkflowState.ABSENT  # nothing started
    return Seen(f"{cond['reason']}: {cond['message']}", order)


async def order_unknown_instance_type(ctx: Ctx) -> Seen:
    return await _rejected_order(ctx, bare_metal(bm_nope=1))


async def order_over_maximum(ctx: Ctx) -> Seen:
    return await _rejected_order(ctx, bare_metal(bm_standard=101))


async def order_name_too_long(ctx: Ctx) -> Seen:
    order = await ctx.managed_order(bare_metal(bm_standard=1), name=long_order_name())
    cond = await wait_condition(ctx.stack, order, "NodeRequestsValid", "False")
    await wait_observed(ctx.stack, ctx.ctl, order)
    assert await ctx.stack.api.workflow_state(order) == WorkflowState.ABSENT  # nothing started
    return Seen(f"{cond['reason']}: {cond['message']}", order)


async def order_name_taken_in_another_namespace(ctx: Ctx) -> Seen:
    first = await ctx.managed_order(bare_metal(bm_standard=0))
    created = (await get_order(ctx.stack, first) or {})["metadata"]["creationTimestamp"]

    async def a_second_later() -> bool:  # creation times have whole seconds: the first is older
        return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") > created

    await eventually(a_second_later, "the hub's clock to pass the first order's creation")
    second = await ctx.managed_order(bare_metal(bm_standard=1), name=first.name)
    cond = await wait_condition(ctx.stack, second, "NodeRequestsValid", "False")
    await wait_observed(ctx.stack, ctx.ctl, second)
    assert await ctx.stack.api.workflow_state(second) == WorkflowState.ABSENT  # nothing started
    return Seen(f"{cond['reason']}: {cond['message']}", second)


async def order_duplicate_node_sets(ctx: Ctx) -> Seen:
    return await _rejected_order(ctx, bare_metal(bm_standard=1) + bare_metal(bm_standard=2))


async def order_non_dns_instance_type(ctx: Ctx) -> Seen:
    return await _rejected_order(ctx, [{"numberOfNodes": 1, "bareMetal": {"instanceType": "BM_Standard"}}])


async def order_instance_type_with_a_trailing_newline(ctx: Ctx) -> Seen:
    """What a YAML `|` block makes of a name: rejected with the field, not taken for a DNS label."""
    return await _rejected_order(ctx, [{"numberOfNodes": 1, "bareMetal": {"instanceType": "bm-standard\n"}}])


async def order_empty_and_repeated_security_groups(ctx: Ctx) -> Seen:
    """The CRD lets `""` through (no minLength on the items): every BMI create was refused by BMaaS
    and each worker showed a generic BMIProvisioningFailed for good, its field never named. (The
    repeat is no problem: it adds no group.)"""
    order = await ctx.managed_order(
        bare_metal(bm_standard=1),
        networkAttachment={"subnetRef": "subnet-a", "securityGroupRefs": ["", "sg-1", "sg-1"]},
    )
    cond = await wait_condition(ctx.stack, order, "NodeRequestsValid", "False")
    await wait_observed(ctx.stack, ctx.ctl, order)
    assert await ctx.stack.api.workflow_state(order) == WorkflowState.ABSENT  # nothing started
    return Seen(f"{cond['reason']}: {cond['message']}", order)


async def order_missing_pull_secret(ctx: Ctx) -> Seen:
    return await _pull_secret_surfaces(ctx, None)


async def order_pull_secret_not_json(ctx: Ctx) -> Seen:
    return await _pull_secret_surfaces(ctx, "robot:not-a-docker-config")


async def _pull_secret_surfaces(ctx: Ctx, pull_secret: str | None) -> Seen:
    order = await ctx.managed_order(bare_metal(bm_standard=1), pullSecret=pull_secret)

    async def surfaced() -> str | None:
        if await ctx.stack.api.workflow_state(order) == WorkflowState.FAILED:
            return "the workers workflow Failed"
        for cond in ((await get_order(ctx.stack, order)) or {}).get("status", {}).get("conditions") or []:
            if "pullSecret" in (cond.get("message") or ""):
                return f"{cond['type']}={cond['status']} {cond['reason']}: {cond['message']}"
        return None

    return Seen(await eventually(surfaced, "the missing pull secret to surface", timeout=60), order)


async def order_ignition_too_large(ctx: Ctx) -> Seen:
    order = await ctx.managed_order(bare_metal(bm_standard=1), pullSecret=BIG_PULL_SECRET)

    async def failed() -> str | None:
        workers = ((await get_order(ctx.stack, order)) or {}).get("status", {}).get("workers") or []
        if workers and workers[0].get("lastFailureReason"):
            w = workers[0]
            return f"{w['phase']} {w['lastFailureReason']}: {w['lastFailureMessage']}"
        return None

    seen = Seen(await eventually(failed, "the worker's failure on the ClusterOrder"), order)
    await ctx.discard(order)  # it would retry every few seconds for the rest of the module
    return seen


async def order_cluster_version_without_boot_image(ctx: Ctx) -> Seen:
    release = "quay.io/openshift-release-dev/ocp-release:4.99.0-x86_64"
    order = await ctx.managed_order(bare_metal(bm_standard=1), releaseImage=release)
    cond = await wait_condition(ctx.stack, order, "RHCOSImageNotFound", "True")
    assert (await ctx.stack.api.status(order)).workers == []
    await ctx.discard(order)
    return Seen(f"RHCOSImageNotFound={cond['status']} {cond['reason']}: {cond['message']}", order)


async def order_mass_scale_down(ctx: Ctx) -> Seen:
    order = await ctx.ready("managed-3b", 3, managed=True)
    before, since = await ctx.bmi_ids(order), await ctx.audit_seq()
    await patch_order(ctx.stack, order, {"spec": {"nodeRequests": bare_metal(bm_standard=0)}})
    cond = await wait_condition(ctx.stack, order, "NodeRequestsValid", "False")
    await wait_observed(ctx.stack, ctx.ctl, order)
    await untouched(ctx, order, before, 3)
    return Seen(f"{cond['reason']}: {cond['message']}", order, since)


async def order_node_set_removed_while_provisioning(ctx: Ctx) -> Seen:
    stack = ctx.stack
    await stack.set_agent_faults({"never_register": {"rate": 1.0}})  # workers stay before Ready
    try:
        order = await ctx.managed_order(bare_metal(bm_standard=2))

        async def waiting() -> bool:
            try:
                status = await stack.api.status(order)
            except Exception:
                return False
            return len(status.workers) == 2 and all(
                w.phase.value == "WaitingForAgent" for w in status.workers
            )

        await eventually(waiting, "2 workers waiting for their agents")
        allocated = {b["id"] for b in await stack.bmis(order)}
        changed = await patch_order(stack, order, {"spec": {"nodeRequests": []}})

        async def taken() -> dict[str, Any] | None:
            cond = condition(await get_order(stack, order), "NodeRequestsValid")
            fresh = cond and cond.get("observedGeneration") == changed["metadata"]["generation"]
            return cond if fresh else None

        cond = await eventually(taken, "the controller to take the removal")

        async def released() -> bool:
            status = await stack.api.status(order)
            return status.workers == [] and await stack.bmis(order) == []

        await eventually(released, "the removed node set's workers to be released")
    finally:
        await stack.clear_agent_faults()
    audit = await stack.audit()
    wiped = {r["bmi_id"] for r in audit if r["kind"] == "WIPE_FINISHED"}
    assert allocated and allocated <= wiped  # every host it had was wiped before going back
    assert await stack.audit_violations() == []
    return Seen(f"{cond['reason']}: {cond['message']}", order, check_allocation=False)


def _create_with_client(ctx: Ctx, body: dict[str, Any]) -> str:
    api = kubernetes.client.CustomObjectsApi(ctx.stack.lab.hub.api_client())
    try:
        api.create_namespaced_custom_object(
            "osac.openshift.io", "v1alpha1", body["metadata"]["namespace"], "clusterorders", body
        )
    except kubernetes.client.ApiException as err:
        return f"{err.status}: {json.loads(err.body or '{}').get('message')}"
    return "created"


async def _malformed(ctx: Ctx, node_requests: list[dict[str, Any]]) -> Seen:
    order = OrderRef(namespace=next(ctx.controlled), name=f"o{uuid.uuid4().hex[:8]}")
    response = await ctx.stack.hub_http.post(
        "/api/v1/namespaces", json={"metadata": {"name": order.namespace}}
    )
    response.raise_for_status()
    seen = await asyncio.to_thread(_create_with_client, ctx, order_body(order, node_requests))
    assert await get_order(ctx.stack, order) is None
    return Seen(seen, order)


async def hub_order_without_count(ctx: Ctx) -> Seen:
    return await _malformed(ctx, [{"bareMetal": {"instanceType": "bm-standard"}}])


async def hub_order_with_negative_count(ctx: Ctx) -> Seen:
    return await _malformed(ctx, bare_metal(bm_standard=-1))


async def hub_order_with_text_count(ctx: Ctx) -> Seen:
    return await _malformed(ctx, [{"numberOfNodes": "three", "bareMetal": {"instanceType": "bm-standard"}}])


async def worker_with_wrong_bmaas_token(ctx: Ctx) -> Seen:
    """The operator configured a token BMaaS rejects: the worker must say so when it starts."""
    bad = ctx.workdir / "wrong-fulfillment-token"
    bad.write_text("not-the-token")
    bad.chmod(0o600)
    queue = f"wrong-token-{uuid.uuid4().hex[:6]}"
    env = {
        **ctx.env,
        "OSAC_FULFILLMENT_TOKEN_FILE": str(bad),
        "OSAC_TASK_QUEUE": queue,
        "OSAC_BMAAS_TASK_QUEUE": f"{queue}-bmaas",
        "OSAC_GRACEFUL_SHUTDOWN_SECONDS": "1",
    }
    log = ctx.workdir / f"{queue}.log"
    proc = spawn([CLI, "worker"], env, log)
    try:
        code = await asyncio.to_thread(proc.wait, 30)
        return Seen(f"exit {code}: {normalised(log.read_text())[-600:]}")
    except subprocess.TimeoutExpired:
        return Seen(f"still running after 30s: {normalised(log.read_text())[-300:]}")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(proc.wait, 30)


async def controller_with_unreachable_hub(ctx: Ctx) -> Seen:
    """The controller starts while the hub is down: it keeps trying, and says why it is not synced."""
    with refusing_port() as port:  # refusing for as long as the scenario runs
        dead = write_kubeconfig(ctx.workdir / "dead-hub-ctl.kubeconfig", f"http://127.0.0.1:{port}", "token")
        health = ctx.workdir / "controller-health.json"
        log = ctx.workdir / "controller-dead-hub.log"
        proc = spawn(
            [CLI, "controller", "--health-file", str(health)], {**ctx.env, "KUBECONFIG": str(dead)}, log
        )
        try:

            async def reported() -> str | None:
                if proc.poll() is not None:
                    return f"exited {proc.returncode}: {normalised(log.read_text())[-400:]}"
                text = log.read_text()
                if not health.exists() or "HubUnavailable" not in text:
                    return None
                synced = json.loads(health.read_text()).get("synced")
                line = next(line for line in text.splitlines() if "HubUnavailable" in line)
                return f"running, synced={synced}: {line.split(': ', 1)[-1]}"

            return Seen(
                await eventually(reported, "the controller to report the unreachable hub", timeout=60)
            )
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                await asyncio.to_thread(proc.wait, 30)


async def _watch_rogue(stack: Stack, agents: str, taken: list[str]) -> None:
    """Every version of the rogue Agent, from a watch: a worker may take and drop it between polls."""
    while True:
        with contextlib.suppress(httpx.HTTPError):
            async with stack.hub_http.stream("GET", agents, params={"watch": "true"}, timeout=None) as stream:
                async for line in stream.aiter_lines():
                    obj = json.loads(line)["object"] if line.strip() else {}
                    if (obj.get("metadata") or {}).get("name") != "rogue":
                        continue
                    labels = obj["metadata"].get("labels") or {}
                    if obj.get("spec", {}).get("approved") or WORKER_LABEL in labels:
                        taken.append(str(obj["metadata"].get("resourceVersion")))
        await asyncio.sleep(0.1)


async def agent_mac_matching_two_bmis(ctx: Ctx) -> Seen:
    """A rogue Agent reports the MACs of the two hosts the order got; their own agents never
    register. Neither worker may take it: it is not unambiguously either host."""
    stack = ctx.stack
    order = await ctx.library_order()
    agents = f"{AGENT_API}/namespaces/{order.namespace}/agents"
    rogue = {
        "apiVersion": "agent-install.openshift.io/v1beta1",
        "kind": "Agent",
        "metadata": {"name": "rogue", "labels": {INFRAENV_LABEL: order.infraenv_name}},
        "spec": {"approved": False, "role": "worker"},
    }
    await stack.set_agent_faults({"never_register": {"rate": 1.0}})
    taken: list[str] = []  # versions of the rogue Agent that a worker approved or labelled
    watcher: asyncio.Task[None] | None = None
    try:
        since = await ctx.audit_seq()
        await stack.apply(order, {"bm-standard": 2})

        # The hosts the order actually got (others' releases may free hosts meanwhile), found
        # well inside the registration timeout the workers wait for their own agents.
        async def allocated_hosts() -> list[str] | None:
            records = await ctx.allocations_since(order, since)
            hosts = {str(r["bmi_name"]): str(r["host_id"]) for r in records}
            return sorted(hosts.values()) if len(hosts) == 2 else None

        host_ids = await eventually(allocated_hosts, "both workers' hosts allocated", timeout=60)
        hosts = {h["id"]: h for h in (await stack.bmaas_http.get("/lab/v1/hosts")).json()["items"]}
        macs = [hosts[host_id]["nics"][-1]["mac"] for host_id in host_ids]
        watcher = asyncio.create_task(_watch_rogue(stack, agents, taken))
        (await stack.hub_http.post(agents, json=rogue)).raise_for_status()
        inventory = to_agent_inventory(host_inventory("rogue", macs))
        (
            await stack.hub_http.patch(
                f"{agents}/rogue/status",
                json={"status": {"inventory": inventory}},
                headers={"Content-Type": "application/merge-patch+json"},
            )
        ).raise_for_status()

        async def both_failed() -> list[dict[str, Any]] | None:
            workers = ((await get_order(stack, order)) or {}).get("status", {}).get("workers") or []
            done = len(workers) == 2 and all(w.get("lastFailureReason") for w in workers)
            return workers if done else None

        workers = await eventually(both_failed, "both workers to report a failure", timeout=90)
        seen = "; ".join(
            sorted(f"{w['name']}: {w['lastFailureReason']}: {w['lastFailureMessage']}" for w in workers)
        )
        seen += "; rogue Agent " + ("taken by a worker" if taken else "never approved or labelled")
    finally:
        if watcher is not None:
            watcher.cancel()
        await stack.hub_http.delete(f"{agents}/rogue")
        await stack.clear_agent_faults()
    await stack.wait_ready(order, 2, timeout=180)
    assert await stack.audit_violations() == []
    await stack.decommission_and_wait(order)
    return Seen(seen, order, check_allocation=False)


# ------------------------------------------------------------------------------------ the table


@dataclass(frozen=True)
class Row:
    id: str
    where: str  # where the user sees the error
    act: Callable[[Ctx], Awaitable[Seen]]
    expect: tuple[str, ...]  # every fragment, with {order} and {name} filled in, must be shown
    missing: str | None = None  # the product behaviour this row needs and lacks (strict xfail)


ROWS = [
    Row(
        "cli-unknown-instance-type",
        "CLI",
        cli_unknown_node_set,
        ("exit 1: error: node_set: order {order} has no bare-metal node set 'bm-nope' (known: bm-standard)",),
    ),
    Row(
        "cli-negative-count",
        "CLI",
        cli_negative_count,
        ("exit 1: error: node_sets[0].count: must not be negative (got -1)",),
    ),
    Row(
        "cli-over-maximum",
        "CLI",
        cli_over_maximum,
        ("exit 1: error: node_sets[].count: 101 workers exceed the maximum of 100 per order",),
    ),
    Row(
        "cli-non-dns-order-name",
        "CLI",
        cli_non_dns_order,
        ("exit 2:", "expected <namespace>/<order> (DNS labels), got 'Bad_NS/Order'"),
    ),
    Row(
        "cli-scale-down-of-an-unknown-worker",
        "CLI",
        cli_scale_down_unknown_worker,
        ("exit 1: error: worker: order {order} has no worker 'nope' (workers: {name}-worker-0)",),
    ),
    Row(
        "cli-unreachable-hub-at-start",
        "CLI",
        cli_unreachable_hub,
        ("exit 3: error: cannot reach the hub: HubTransportError",),
    ),
    Row(
        "cli-mass-scale-down-unconfirmed", "CLI", cli_mass_scale_down, ("exit 1: error:", GUARD, "--confirm")
    ),
    Row(
        "api-unknown-instance-type",
        "update rejection",
        api_unknown_instance_type,
        (
            "CommandError: node_sets[0].instance_type: unknown instance type 'bm-nope'"
            " (known: bm-gpu, bm-standard)",
        ),
    ),
    Row(
        "api-order-name-too-long-for-its-nodepool",
        "update rejection",
        api_order_name_too_long,
        (
            "CommandError: order.name: '{name}' is too long for the names made from it: its NodePool"
            " would be named 'nodepool-{name}-bm-standard', 71 characters, over the 63 of a DNS label",
        ),
    ),
    Row(
        "api-duplicate-node-set-names",
        "update rejection",
        api_duplicate_node_sets,
        ("CommandError: node_sets[].name: duplicate node set 'bm-standard'",),
    ),
    Row(
        "api-non-dns-node-set-name",
        "library call",
        api_non_dns_name,
        ("ValidationError: 1 validation error for NodeSetRequest name String should match pattern",),
    ),
    Row(
        "api-negative-count-on-the-wire",
        "update rejection",
        api_negative_count_on_the_wire,
        ("node_sets[0].count: must not be negative (got -1)",),
    ),
    Row(
        "api-mass-scale-down-unconfirmed",
        "update rejection",
        api_mass_scale_down,
        (f"CommandError: {GUARD} (more than 50% of the order and more than 2 workers); confirm it",),
    ),
    Row(
        "api-decommission-twice",
        "update rejection",
        api_decommission_twice,
        ("CommandError: decommission: the order is already being decommissioned",),
    ),
    Row(
        "api-scale-after-decommission",
        "library call",
        api_scale_after_decommission,
        ("CommandError:", "{order}", "decommissioned"),
    ),
    Row(
        "api-scale-down-after-decommission",
        "library call",
        api_scale_down_after_decommission,
        ("CommandError: worker: order {order} is decommissioned",),
    ),
    Row(
        "order-unknown-instance-type",
        "ClusterOrder condition",
        order_unknown_instance_type,
        (
            "InvalidNodeRequests: spec.nodeRequests[0].bareMetal.instanceType: unknown instance type"
            " 'bm-nope' (known:",
        ),
    ),
    Row(
        "order-over-maximum",
        "ClusterOrder condition",
        order_over_maximum,
        (
            "InvalidNodeRequests: spec.nodeRequests[].numberOfNodes: 101 workers exceed the maximum of 100"
            " per order",
        ),
    ),
    Row(
        "order-name-too-long-for-its-nodepool",
        "ClusterOrder condition",
        order_name_too_long,
        ("InvalidNodeRequests: order.name: '{name}' is too long", "over the 63 of a DNS label"),
    ),
    Row(
        "order-name-taken-in-another-namespace",
        "ClusterOrder condition",
        order_name_taken_in_another_namespace,
        (
            "InvalidNodeRequests: metadata.name: ClusterOrder",
            "/{name} already has this name; ClusterOrder names are OSAC order ids and must be unique"
            " across namespaces",
        ),
    ),
    Row(
        "order-duplicate-node-sets",
        "ClusterOrder condition",
        order_duplicate_node_sets,
        ("InvalidNodeRequests: spec.nodeRequests[1]: duplicate instance type bm-standard",),
    ),
    Row(
        "order-non-dns-instance-type",
        "ClusterOrder condition",
        order_non_dns_instance_type,
        ("InvalidNodeRequests: spec.nodeRequests[0]: instance type is not a DNS label",),
    ),
    Row(
        "order-instance-type-with-a-trailing-newline",
        "ClusterOrder condition",
        order_instance_type_with_a_trailing_newline,
        ("InvalidNodeRequests: spec.nodeRequests[0]: instance type is not a DNS label",),
    ),
    Row(
        "order-empty-and-repeated-security-groups",
        "ClusterOrder condition",
        order_empty_and_repeated_security_groups,
        ("InvalidNodeRequests: spec.networkAttachment.securityGroupRefs[0]: not a security group name",),
    ),
    Row(
        "order-missing-pull-secret",
        "ClusterOrder condition",
        order_missing_pull_secret,
        ("=False", "spec.pullSecret"),
    ),
    Row(
        "order-pull-secret-not-json",
        "ClusterOrder condition",
        order_pull_secret_not_json,
        (
            "InfraEnvReady=False PullSecretInvalid: spec.pullSecret is not a pull secret: it is not JSON;"
            " no workers are created until it is corrected.",
        ),
    ),
    Row(
        "order-discovery-ignition-over-64KiB",
        "ClusterOrder status.workers[]",
        order_ignition_too_large,
        (
            "Failed DiscoveryIgnitionTooLarge: The discovery configuration, which carries spec.pullSecret"
            " and spec.sshPublicKey, is too large for the host; waiting for a smaller one.",
        ),
    ),
    Row(
        "order-cluster-version-without-boot-image",
        "ClusterOrder condition",
        order_cluster_version_without_boot_image,
        (
            "RHCOSImageNotFound=True RHCOSImageNotFound: No boot image is linked to the cluster version"
            " of the release the workers boot (spec.releaseImage, or the hosted cluster's when it names"
            " none), or no cluster version offers that release; no workers are created until one is.",
        ),
    ),
    Row(
        "order-mass-scale-down-unannotated",
        "ClusterOrder condition",
        order_mass_scale_down,
        (GUARD.replace("node_sets[].count", "spec.nodeRequests[].numberOfNodes"),),
    ),
    Row(
        "order-node-set-removed-while-provisioning",
        "ClusterOrder condition",
        order_node_set_removed_while_provisioning,
        ("NodeRequestsAccepted: Bare-metal node requests applied: none",),
    ),
    Row(
        "hub-order-without-numberOfNodes",
        "422 from the hub",
        hub_order_without_count,
        (
            '422: ClusterOrder.osac.openshift.io "{name}" is invalid:'
            " spec.nodeRequests[0].numberOfNodes: Required value",
        ),
    ),
    Row(
        "hub-order-with-negative-count",
        "422 from the hub",
        hub_order_with_negative_count,
        (
            '422: ClusterOrder.osac.openshift.io "{name}" is invalid: spec.nodeRequests[0].numberOfNodes:'
            " Invalid value: -1: spec.nodeRequests[0].numberOfNodes in body should be greater than or"
            " equal to 0",
        ),
    ),
    Row(
        "hub-order-with-text-numberOfNodes",
        "422 from the hub",
        hub_order_with_text_count,
        (
            '422: ClusterOrder.osac.openshift.io "{name}" is invalid: spec.nodeRequests[0].numberOfNodes:'
            ' Invalid value: "string": spec.nodeRequests[0].numberOfNodes in body must be of type integer',
        ),
    ),
    Row(
        "worker-wrong-bmaas-token",
        "worker exit",
        worker_with_wrong_bmaas_token,
        ("exit ", "OSAC_FULFILLMENT_TOKEN_FILE", "401"),
    ),
    Row(
        "controller-unreachable-hub-at-start",
        "controller log and health file",
        controller_with_unreachable_hub,
        ("running, synced=False:", "hub watch of clusterorders interrupted (HubUnavailable)"),
    ),
    Row(
        "agent-mac-matching-two-bmis",
        "ClusterOrder status.workers[]",
        agent_mac_matching_two_bmis,
        (
            "{name}-worker-0: AmbiguousAgentMatch: The host could not be identified unambiguously; retrying.",
            "{name}-worker-1: AmbiguousAgentMatch: The host could not be identified unambiguously; retrying.",
            "rogue Agent never approved or labelled",
        ),
    ),
]


# ------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
async def stack(
    temporal_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    async with running_stack(temporal_env.client, tmp_path_factory.mktemp("bad-input")) as running:
        yield running


@pytest.fixture(scope="module")
async def ctx(
    stack: Stack, temporal_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Ctx]:
    prefix = f"bi{uuid.uuid4().hex[:6]}"
    namespaces = [f"{prefix}-{i}" for i in range(40)]
    kube = HubKube.from_kubeconfig(str(stack.lab.hub.kubeconfig))
    bmaas = BmaasClient(stack.settings.fulfillment_url, stack.settings.fulfillment_token_file)
    controller = ClusterOrderController(
        kube,
        stack.api,
        InstanceTypeCatalog(bmaas),
        namespaces=namespaces,  # only the rows' ClusterOrders: library rows drive theirs by hand
        error_backoff=(0.2, 2.0),
        decommission_poll_seconds=5.0,
    )
    stop = asyncio.Event()
    running = RunningController(controller, kube, bmaas, asyncio.create_task(controller.run(stop)), stop)

    async def synced() -> bool:
        if running.task.done():
            running.task.result()
        return controller.synced

    await eventually(synced, "the controller's informer to sync", timeout=60)
    try:
        yield Ctx(
            stack,
            running,
            temporal_env.client.service_client.config.target_host,
            tmp_path_factory.mktemp("bad-input-files"),
            iter(namespaces),
        )
    finally:
        await running.stop()


@pytest.mark.parametrize(
    "row",
    [
        pytest.param(
            r, id=r.id, marks=[pytest.mark.xfail(strict=True, reason=r.missing)] if r.missing else []
        )
        for r in ROWS
    ],
)
async def test_bad_input_is_refused_clearly_and_allocates_nothing(ctx: Ctx, row: Row) -> None:
    started = time.monotonic()
    seen = await row.act(ctx)
    names = {"order": seen.order.key if seen.order else "?", "name": seen.order.name if seen.order else "?"}
    for fragment in row.expect:
        wanted = fragment.format(**names)
        assert wanted in seen.message, f"{row.where} showed {seen.message!r}; expected {wanted!r}"
    if seen.order is not None and seen.check_allocation:
        allocated = await ctx.allocations_since(seen.order, seen.since)
        assert allocated == [], f"hosts were allocated for {seen.order.key}: {allocated}"
    print(f"{row.id} ({row.where}, {time.monotonic() - started:.1f}s): {seen.message}")


def test_the_table_covers_the_issue() -> None:
    """At least 15 rows, each of the issue's kinds of bad input, every row id unique."""
    ids = [r.id for r in ROWS]
    assert len(ids) == len(set(ids)) >= 15
    for needed in (
        "unknown-instance-type",
        "negative-count",
        "over-maximum",
        "duplicate-node-set",
        "non-dns",
        "missing-pull-secret",
        "ignition-over-64KiB",
        "without-boot-image",
        "scale-down-of-an-unknown-worker",
        "decommission-twice",
        "after-decommission",
        "hub-order-",
        "wrong-bmaas-token",
        "unreachable-hub",
        "mac-matching-two-bmis",
        "node-set-removed-while-provisioning",
        "mass-scale-down",
    ):
        assert any(needed in i for i in ids), needed
