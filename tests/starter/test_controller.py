"""The ClusterOrder controller against the hub twin, the BMaaS twin, a real worker and Temporal:
create, change, unmanaged, delete with the finalizer (and without it), invalid orders."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from activities.bmaas.client import BmaasClient
from activities.kube import HubKube
from contracts.hub import MANAGEMENT_STATE_ANNOTATION
from contracts.refs import OrderRef
from contracts.workflows import NodeSetRequest, cluster_workflow_id
from lab.http_server import free_port
from starter.api import WorkflowState
from starter.controller import ClusterOrderController
from starter.validation import InstanceTypeCatalog
from tests.ops.promtext import Sample, parse, select
from tests.starter.harness import (
    CONFIRM,
    FINALIZER,
    OSAC_FINALIZER,
    UNMANAGED,
    RunningController,
    bare_metal,
    create_order,
    delete_order,
    finalizers,
    get_order,
    patch_order,
    purge_cluster_workflow,
    release_hosts,
    remove_condition,
    run_id,
    terminate_cluster_workflow,
    update_names,
    wait_observed,
    wait_ready,
    workflow_state,
)
from tests.workflows.stack import PULL_SECRET, Stack, condition, eventually, wait_condition
from worker.telemetry import build_runtime


async def test_create_change_and_delete_with_the_finalizer(stack: Stack, ctl: RunningController) -> None:
    order = await create_order(stack, bare_metal(bm_standard=2))

    # Create: finalizer first, then the workflow, then the condition recording the generation.
    accepted = await wait_condition(stack, order, "NodeRequestsValid", "True")
    assert accepted["reason"] == "NodeRequestsAccepted"
    assert accepted["observedGeneration"] == 1
    obj = await get_order(stack, order)
    assert FINALIZER in finalizers(obj)
    assert "pullSecret" in (obj or {})["spec"]  # the order is the tenant's; we only never copy it
    await wait_ready(stack, order, 2)
    first_run = await run_id(stack, order)
    # The pull secret stays on the hub: nothing of it in the workflow's inputs or history.
    history = await stack.client.get_workflow_handle(cluster_workflow_id(order)).fetch_history()
    payloads = " ".join(_payload_texts(history.to_json_dict()))
    assert order.name in payloads  # the decoding works: the order's facts are there
    encoded = json.loads(PULL_SECRET)["auths"]["quay.io"]["auth"]
    assert encoded not in payloads and base64.b64decode(encoded).decode() not in payloads

    # Change: the order's count is the source of truth.
    await patch_order(stack, order, {"spec": {"nodeRequests": bare_metal(bm_standard=3)}})
    await wait_ready(stack, order, 3)
    cond = await wait_condition(stack, order, "NodeRequestsValid", "True")
    assert "bm-standard=3" in cond["message"]
    assert await run_id(stack, order) == first_run
    assert await update_names(stack, order) == ["set_node_sets", "set_node_sets"]

    # Delete: the order stays (finalizer) until the workflow has released and wiped every host.
    bmis = {b["id"] for b in await stack.bmis(order)}
    assert len(bmis) == 3
    await delete_order(stack, order)

    async def gone() -> bool:
        obj = await get_order(stack, order)
        if obj is not None:
            assert obj["metadata"].get("deletionTimestamp")
            assert FINALIZER in finalizers(obj)
        return obj is None

    await eventually(gone, f"{order.key} to be finalized", timeout=120)
    assert await workflow_state(stack, order) == WorkflowState.COMPLETED
    assert await stack.bmis(order) == []
    assert await stack.agents(order.namespace) == []
    audit = await stack.audit()
    wiped = {r["bmi_id"] for r in audit if r["kind"] == "WIPE_FINISHED"}
    assert bmis <= wiped
    assert await stack.audit_violations() == []


async def test_unmanaged_orders_are_left_alone(stack: Stack, ctl: RunningController) -> None:
    order = await create_order(stack, bare_metal(bm_standard=1), annotations=UNMANAGED)
    await wait_observed(stack, ctl, order)
    obj = await get_order(stack, order)
    assert finalizers(obj) == []
    assert condition(obj, "NodeRequestsValid") is None
    assert await workflow_state(stack, order) == WorkflowState.ABSENT

    # A managed order that becomes unmanaged keeps its workers but no longer follows its spec.
    managed = await create_order(stack, bare_metal(bm_standard=1))
    await wait_ready(stack, managed, 1)
    await patch_order(stack, managed, {"metadata": {"annotations": UNMANAGED}})
    await patch_order(stack, managed, {"spec": {"nodeRequests": bare_metal(bm_standard=2)}})
    await wait_observed(stack, ctl, managed)
    status = await stack.api.status(managed)
    assert [(n.name, n.count) for n in status.node_sets] == [("bm-standard", 1)]
    # Handing it back: the controller picks the spec up again.
    await patch_order(
        stack, managed, {"metadata": {"annotations": {"osac.openshift.io/management-state": None}}}
    )
    await wait_ready(stack, managed, 2)


async def test_an_order_taken_over_and_decommissioned_by_an_operator_can_be_deleted(
    stack: Stack, ctl: RunningController
) -> None:
    """The path `decommission` points operators to: annotate the order unmanaged, decommission it
    by hand. Deleted later, it still carries our finalizer: removed once nothing of ours holds a
    host for it (a workflow still running for it is the operator's, and keeps it), as for a
    managed order."""
    order = await create_order(stack, bare_metal(bm_standard=1))
    await wait_ready(stack, order, 1)
    await patch_order(stack, order, {"metadata": {"annotations": UNMANAGED}})
    await delete_order(stack, order)
    poked = await patch_order(stack, order, {"metadata": {"annotations": {"example.com/poke": "1"}}})

    async def looked_at() -> bool:
        return ctl.controller.observed.get(order.key) == poked["metadata"]["resourceVersion"]

    await eventually(looked_at, f"the controller to have looked at the deleting {order.key}")
    assert FINALIZER in finalizers(await get_order(stack, order)), "removed while its workflow runs"
    assert await workflow_state(stack, order) == WorkflowState.RUNNING, "decommissioned though unmanaged"

    await stack.api.decommission(order)
    await eventually(lambda: _absent(stack, order), f"{order.key} finalized once decommissioned", timeout=120)
    assert await stack.bmis(order) == []


async def test_orders_without_bare_metal_requests_are_ignored(stack: Stack, ctl: RunningController) -> None:
    order = await create_order(stack, [{"numberOfNodes": 2, "resourceClass": "vm-small"}])
    await wait_observed(stack, ctl, order)
    obj = await get_order(stack, order)
    assert finalizers(obj) == []
    assert condition(obj, "NodeRequestsValid") is None
    assert await workflow_state(stack, order) == WorkflowState.ABSENT


@pytest.mark.parametrize(
    ("node_requests", "field", "detail"),
    [
        (bare_metal(bm_nope=1), "spec.nodeRequests[0].bareMetal.instanceType", "'bm-nope'"),
        # The index is the order's, not the bare-metal requests' (a VM request comes first).
        (
            [{"numberOfNodes": 2, "resourceClass": "vm"}, *bare_metal(bm_nope=1)],
            "spec.nodeRequests[1].bareMetal.instanceType",
            "'bm-nope'",
        ),
        (
            [{"numberOfNodes": 1, "bareMetal": {"instanceType": "BM_Standard"}}],
            "nodeRequests[0]",
            "DNS label",
        ),
        (bare_metal(bm_standard=1) + bare_metal(bm_standard=2), "nodeRequests[1]", "duplicate"),
        (bare_metal(bm_standard=101), "spec.nodeRequests[].numberOfNodes", "maximum of 100"),
    ],
    ids=[
        "unknown-instance-type",
        "unknown-instance-type-after-a-vm-request",
        "malformed-instance-type",
        "duplicate-instance-type",
        "over-the-maximum",
    ],
)
async def test_invalid_orders_get_a_condition_and_nothing_is_allocated(
    stack: Stack, ctl: RunningController, node_requests: list, field: str, detail: str
) -> None:
    order = await create_order(stack, node_requests)
    cond = await wait_condition(stack, order, "NodeRequestsValid", "False")
    assert cond["reason"] == "InvalidNodeRequests"
    assert field in cond["message"] and detail in cond["message"], cond["message"]
    await wait_observed(stack, ctl, order)
    assert await workflow_state(stack, order) == WorkflowState.ABSENT
    assert await stack.bmis(order) == []
    assert finalizers(await get_order(stack, order)) == []

    # Fixed by the tenant: the same order is accepted and provisioned.
    await patch_order(stack, order, {"spec": {"nodeRequests": bare_metal(bm_standard=1)}})
    await wait_condition(stack, order, "NodeRequestsValid", "True")
    await wait_ready(stack, order, 1)
    await delete_order(stack, order)
    await eventually(lambda: _absent(stack, order), f"{order.key} finalized", timeout=120)


async def test_an_order_whose_name_is_no_dns_label_gets_a_condition_and_nothing_else(
    stack: Stack, ctl: RunningController
) -> None:
    """Kubernetes takes names with dots; its name would be its hosts' names, so a bare-metal order
    named so is told why nothing happens (it was retried for ever with a pydantic error), and an
    order of other kinds named so is left alone."""
    order = await create_order(stack, bare_metal(bm_standard=1), name=f"o{uuid.uuid4().hex[:6]}.v2")
    cond = await wait_condition(stack, order, "NodeRequestsValid", "False")
    assert cond["reason"] == "InvalidNodeRequests"
    assert cond["message"].startswith(f"metadata.name: '{order.name}' is not a DNS label"), cond["message"]
    await wait_observed(stack, ctl, order)
    assert finalizers(await get_order(stack, order)) == []
    assert await stack.bmis(order) == []

    other = await create_order(
        stack, [{"numberOfNodes": 2, "resourceClass": "vm-small"}], name=f"o{uuid.uuid4().hex[:6]}.vm"
    )
    await wait_observed(stack, ctl, other)
    assert condition(await get_order(stack, other), "NodeRequestsValid") is None
    await delete_order(stack, order)
    await delete_order(stack, other)
    await eventually(lambda: _absent(stack, order), f"{order.key} gone", timeout=60)


async def test_reconciles_that_fail_are_counted_on_the_metrics_endpoint(
    stack: Stack, ctl: RunningController, tmp_path: Path
) -> None:
    """A controller that cannot do its work (here: no BMaaS token, as the deployed one lacked) is
    alive and synced, so its probes say ready; its failed reconciles show on /metrics, by error type,
    for an alert to catch."""
    runtime, url = None, ""
    for _ in range(5):  # a port can be taken between the probe and the bind
        port = free_port()
        with contextlib.suppress(Exception):
            runtime = build_runtime(f"127.0.0.1:{port}")
            url = f"http://127.0.0.1:{port}/metrics"
            break
    assert runtime is not None
    order = await create_order(stack, bare_metal(bm_nope=1))  # the module's controller refuses it
    kube = HubKube.from_kubeconfig(str(stack.lab.hub.kubeconfig))
    tokenless = BmaasClient(stack.settings.fulfillment_url, tmp_path / "no-token")
    controller = ClusterOrderController(
        kube,
        stack.api,
        InstanceTypeCatalog(tokenless),
        namespaces=[order.namespace],
        error_backoff=(0.2, 1.0),
        meter=runtime.metric_meter,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(controller.run(stop))
    try:

        async def counted() -> list[Sample] | None:
            async with httpx.AsyncClient() as http:
                samples = parse((await http.get(url)).text)
            errors = [s for s in select(samples, "osac_controller_reconcile_errors_total") if s.value >= 2]
            return errors if errors and select(samples, "osac_controller_reconciles_total") else None

        (errors, *_) = await eventually(counted, "failed reconciles counted on /metrics", timeout=60)
        assert errors.labels["error_type"] and controller.synced
        assert controller.stats.errors >= 2 and controller.stats.applies == 0
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await tokenless.aclose()
        await kube.close()


async def test_an_invalid_change_keeps_the_running_workers(stack: Stack, ctl: RunningController) -> None:
    order = await create_order(stack, bare_metal(bm_standard=1))
    await wait_ready(stack, order, 1)
    await patch_order(stack, order, {"spec": {"nodeRequests": bare_metal(bm_standard=1, bm_nope=1)}})
    cond = await wait_condition(stack, order, "NodeRequestsValid", "False")
    assert "'bm-nope'" in cond["message"]
    status = await stack.api.status(order)
    assert [(n.name, n.count) for n in status.node_sets] == [("bm-standard", 1)]
    assert status.ready_workers == 1


async def test_an_edit_of_the_pull_secret_alone_reaches_the_infraenv(
    stack: Stack, ctl: RunningController
) -> None:
    """Same counts, new generation: the controller still sends the order's node sets, so the
    workflow brings the InfraEnv in line (a rotated pull secret for the hosts booted after)."""
    order = await create_order(stack, bare_metal(bm_standard=1))
    await wait_ready(stack, order, 1)
    await wait_condition(stack, order, "NodeRequestsValid", "True")
    rotated = json.dumps({"auths": {"quay.io": {"auth": base64.b64encode(b"robot:r0tated").decode()}}})
    edited = await patch_order(stack, order, {"spec": {"pullSecret": rotated}})
    assert edited["metadata"]["generation"] == 2

    async def in_line() -> bool:
        return (await stack.infraenv_inputs(order))[0] == rotated

    await eventually(in_line, "the InfraEnv's pull Secret to follow the order")

    async def accepted() -> bool:
        cond = condition(await get_order(stack, order), "NodeRequestsValid") or {}
        return cond.get("status") == "True" and cond.get("observedGeneration") == 2

    await eventually(accepted, "generation 2 accepted")
    assert await update_names(stack, order) == ["set_node_sets", "set_node_sets"]
    assert (await stack.api.status(order)).ready_workers == 1


async def _absent(stack: Stack, order: OrderRef) -> bool:
    return await get_order(stack, order) is None


async def test_a_mass_scale_down_waits_for_the_confirmation_annotation(
    stack: Stack, ctl: RunningController
) -> None:
    order = await create_order(stack, bare_metal(bm_standard=3))
    await wait_ready(stack, order, 3)
    await patch_order(stack, order, {"spec": {"nodeRequests": bare_metal(bm_standard=0)}})
    refused = await wait_condition(stack, order, "NodeRequestsValid", "False")
    assert "lowering the order from 3 to 0 workers" in refused["message"]
    assert CONFIRM in refused["message"]
    assert (await stack.api.status(order)).ready_workers == 3  # nothing left

    await patch_order(stack, order, {"metadata": {"annotations": {CONFIRM: "true"}}})
    await wait_condition(stack, order, "NodeRequestsValid", "True")
    await wait_ready(stack, order, 0)

    # The confirmation was for that scale-down: the next mistyped count is refused again.
    async def consumed() -> bool:
        obj = await get_order(stack, order)
        return obj is not None and CONFIRM not in (obj["metadata"].get("annotations") or {})

    await eventually(consumed, "the confirmation annotation removed once used")
    await patch_order(stack, order, {"spec": {"nodeRequests": bare_metal(bm_standard=3)}})
    await eventually(lambda: _counts(stack, order, 3), "the scale-up applied")
    await patch_order(stack, order, {"spec": {"nodeRequests": bare_metal(bm_standard=0)}})
    refused = await wait_condition(stack, order, "NodeRequestsValid", "False")
    assert "lowering the order from 3 to 0 workers" in refused["message"]
    await patch_order(stack, order, {"metadata": {"annotations": {CONFIRM: "true"}}})
    await eventually(lambda: _counts(stack, order, 0), "the confirmed scale-down applied")
    await eventually(lambda: _no_workers(stack, order), "the workers released")  # their hosts free


async def test_a_confirmation_that_came_with_a_new_order_or_a_scale_up_is_used_up_by_it(
    stack: Stack, ctl: RunningController
) -> None:
    """A confirmation confirms the change it came with, whatever it was: left on the order, it would
    wave a mistyped count weeks later through the guard."""
    order = await create_order(stack, bare_metal(bm_standard=1), annotations={CONFIRM: "true"})

    async def consumed() -> bool:
        obj = await get_order(stack, order)
        return obj is not None and CONFIRM not in (obj["metadata"].get("annotations") or {})

    await eventually(consumed, "the confirmation that came with the new order removed")
    await wait_ready(stack, order, 1)
    await patch_order(
        stack,
        order,
        {"metadata": {"annotations": {CONFIRM: "true"}}, "spec": {"nodeRequests": bare_metal(bm_standard=4)}},
    )
    await eventually(consumed, "the confirmation that came with the scale-up removed")
    await eventually(lambda: _counts(stack, order, 4), "the scale-up applied")
    await patch_order(stack, order, {"spec": {"nodeRequests": bare_metal(bm_standard=0)}})
    refused = await wait_condition(stack, order, "NodeRequestsValid", "False")
    assert "lowering the order from 4 to 0 workers" in refused["message"]
    assert (await stack.api.status(order)).desired_workers == 4
    await delete_order(stack, order)
    await eventually(lambda: _absent(stack, order), f"{order.key} finalized", timeout=180)


async def _no_workers(stack: Stack, order: OrderRef) -> bool:
    return (await stack.api.status(order)).workers == []


async def test_a_confirmation_used_by_a_controller_stopped_before_it_removed_it_is_removed_later(
    stack: Stack, ctl: RunningController
) -> None:
    """The confirmed scale-down reached the workflow, then the controller stopped (or the hub
    refused the removal) before it removed the confirmation and accepted the change: the next look
    finishes both, rather than leave the confirmation for every later count."""
    order = await create_order(stack, bare_metal(bm_standard=3))
    accepted = await wait_condition(stack, order, "NodeRequestsValid", "True")
    gen = accepted["observedGeneration"] + 1  # the edit below
    # What the stopped controller had sent for that edit: the confirmed change. (The workflow now
    # differs from the order; only a full resync, minutes away, would look.)
    await stack.api.apply(
        order,
        [NodeSetRequest(name="bm-standard", instance_type="bm-standard", count=0)],
        ["bm-standard"],
        confirm_scale_down=True,
        order_generation=gen,
    )
    edited = await patch_order(
        stack,
        order,
        {"metadata": {"annotations": {CONFIRM: "true"}}, "spec": {"nodeRequests": bare_metal(bm_standard=0)}},
    )
    assert edited["metadata"]["generation"] == gen

    async def accepted_at_gen() -> dict[str, Any] | None:
        cond = condition(await get_order(stack, order), "NodeRequestsValid")
        return cond if cond and cond["status"] == "True" and cond.get("observedGeneration") == gen else None

    await eventually(accepted_at_gen, f"NodeRequestsValid=True at generation {gen}")
    obj = await get_order(stack, order)
    assert obj is not None and CONFIRM not in (obj["metadata"].get("annotations") or {})


async def _counts(stack: Stack, order: OrderRef, total: int) -> bool:
    return sum(n.count for n in (await stack.api.status(order)).node_sets) == total


def _payload_texts(node: Any) -> list[str]:
    """Every payload's data in a history (JSON form: base64 `data` beside `metadata`), decoded."""
    found: list[str] = []
    if isinstance(node, dict):
        if isinstance(node.get("data"), str) and "metadata" in node:
            found.append(base64.b64decode(node["data"]).decode(errors="replace"))
        for value in node.values():
            found.extend(_payload_texts(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(_payload_texts(value))
    return found


MANAGED_AGAIN = {"metadata": {"annotations": {MANAGEMENT_STATE_ANNOTATION: None}}}


async def test_a_deleted_order_without_a_workflow_keeps_its_finalizer_while_bmaas_lists_its_hosts(
    stack: Stack, ctl: RunningController
) -> None:
    """No workflow found (a stopped run purged by retention) is no proof that the hosts were
    released: its abandoned worker workflows still hold them. BMaaS is asked."""
    order = await create_order(stack, bare_metal(bm_standard=1))
    await wait_ready(stack, order, 1)
    await wait_condition(stack, order, "NodeRequestsValid", "True")
    # Hands off while the workflow goes, so that the controller only ever finds it absent.
    await patch_order(stack, order, {"metadata": {"annotations": UNMANAGED}})
    await wait_observed(stack, ctl, order)
    await terminate_cluster_workflow(stack, order)
    await purge_cluster_workflow(stack, order)
    held = await stack.bmis(order)
    assert len(held) == 1
    await delete_order(stack, order)
    await patch_order(stack, order, MANAGED_AGAIN)

    async def flagged() -> dict[str, Any] | None:
        obj = await get_order(stack, order)
        assert obj is not None, "finalizer removed while BMaaS still lists a BMI of the order"
        assert FINALIZER in finalizers(obj)
        cond = condition(obj, "WorkersWorkflowStopped")
        return cond if cond is not None and cond["status"] == "True" else None

    cond = await eventually(flagged, "WorkersWorkflowStopped=True on the deleting order")
    assert cond["reason"] == "HostsStillAllocated"
    assert held[0]["metadata"]["name"] in cond["message"]

    # Released by an operator: the finalizer goes once BMaaS lists none (the controller polls).
    await release_hosts(stack, order)
    await eventually(lambda: _absent(stack, order), f"{order.key} finalized", timeout=120)


async def test_a_deleted_order_whose_workflow_stopped_keeps_its_finalizer_until_an_operator_looked(
    stack: Stack, ctl: RunningController
) -> None:
    order = await create_order(stack, bare_metal(bm_standard=1))
    await wait_ready(stack, order, 1)
    await wait_condition(stack, order, "NodeRequestsValid", "True")
    await terminate_cluster_workflow(stack, order)
    await delete_order(stack, order)
    stopped = await wait_condition(stack, order, "WorkersWorkflowStopped", "True")
    assert stopped["reason"] == WorkflowState.TERMINATED.value
    # The hosts are released meanwhile, and retention purges the stopped run: nothing tells the
    # controller any more that an operator has yet to look, but the condition.
    await release_hosts(stack, order)
    await purge_cluster_workflow(stack, order)
    poked = await patch_order(stack, order, {"metadata": {"annotations": {"example.com/poke": "1"}}})

    async def looked_at() -> bool:
        obj = await get_order(stack, order)
        assert obj is not None, "finalizer removed while the order shows WorkersWorkflowStopped"
        assert FINALIZER in finalizers(obj)
        return ctl.controller.observed.get(order.key) == poked["metadata"]["resourceVersion"]

    await eventually(looked_at, f"the controller to have reconciled {order.key} after the poke")
    assert condition(await get_order(stack, order), "WorkersWorkflowStopped") is not None

    # The operator has looked and removes the condition: the finalizer goes.
    await remove_condition(stack, order, "WorkersWorkflowStopped")
    await eventually(lambda: _absent(stack, order), f"{order.key} finalized", timeout=120)


async def test_a_workflow_running_for_an_order_deleted_without_our_finalizer_is_decommissioned(
    stack: Stack, ctl: RunningController
) -> None:
    """Our finalizer already gone (a controller found no workflow yet), the order held by OSAC's
    own: a start that lands now (another controller's, a library caller's) is decommissioned, and
    the finalizer is not added back."""
    # A cluster first (no bare-metal request yet: the controller ignores it), hands off while it
    # gets one and is deleted.
    order = await create_order(
        stack, [{"numberOfNodes": 0, "resourceClass": "small"}], finalizers=[OSAC_FINALIZER]
    )

    async def cluster() -> Any:
        return ((await get_order(stack, order)) or {}).get("status", {}).get("clusterReference")

    await eventually(cluster, f"the hosted cluster of {order.key}")
    await patch_order(stack, order, {"metadata": {"annotations": UNMANAGED}})
    await patch_order(stack, order, {"spec": {"nodeRequests": bare_metal(bm_standard=1)}})
    await delete_order(stack, order)
    await patch_order(stack, order, MANAGED_AGAIN)
    await wait_observed(stack, ctl, order)
    assert await workflow_state(stack, order) == WorkflowState.ABSENT

    await stack.apply(order, {"bm-standard": 1})

    async def decommissioned() -> bool:
        return await workflow_state(stack, order) == WorkflowState.COMPLETED

    await eventually(decommissioned, f"the workflow of the deleted {order.key} decommissioned", timeout=120)
    assert await stack.bmis(order) == []
    obj = await get_order(stack, order)
    assert finalizers(obj) == [OSAC_FINALIZER]
    await patch_order(stack, order, {"metadata": {"finalizers": []}})
    await eventually(lambda: _absent(stack, order), f"{order.key} gone")
