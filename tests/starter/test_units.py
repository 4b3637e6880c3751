"""Pure parts of the starter: the node-set rules as the workflow's validator applies them, the
timing policy settings, the controller's work queue and update ids, the generated schemas."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.service import RPCError, RPCStatusCode

import starter.api
from activities.hub import order_facts
from activities.kube import HubKube
from contracts.hub import MANAGEMENT_STATE_ANNOTATION, Condition, ConditionStatus
from contracts.refs import OrderRef
from contracts.worker import TimingPolicy
from contracts.workflows import NodeSetRequest, ScaleDownGuard, SetNodeSets, node_set_problem, same_node_sets
from starter import schemas
from starter.api import StatusUnanswered, WorkersApi, WorkflowState
from starter.config import StarterSettings, TimingPreset, demo_policy
from starter.controller import ClusterOrderController, WorkQueue, apply_id
from starter.orders import FINALIZER
from starter.validation import InstanceTypeCatalog, order_problem
from workflows.cluster_workers import ClusterWorkersWorkflow

TYPES = ["bm-gpu", "bm-standard"]


def ns(name: str, count: int, instance_type: str | None = None) -> NodeSetRequest:
    # model_construct: negative counts must reach the rules, as they would from an order's spec
    return NodeSetRequest.model_construct(name=name, instance_type=instance_type or name, count=count)


CASES = {
    "valid": [ns("bm-standard", 3), ns("bm-gpu", 1)],
    "empty": [],
    "duplicate": [ns("bm-standard", 1), ns("bm-standard", 2)],
    "negative": [ns("bm-gpu", 1), ns("bm-standard", -1)],
    "unknown-type": [ns("bm-standard", 1), ns("bm-nope", 1)],
    "over-the-maximum": [ns("bm-standard", 6), ns("bm-gpu", 5)],
    "exactly-the-maximum": [ns("bm-standard", 5), ns("bm-gpu", 5)],
    # nodepool-<order>-bm-standard: 64 characters with the long order below
    "name-too-long": [ns("bm-standard", 1)],
}
SHORT, LONG = OrderRef(namespace="ns", name="o1"), OrderRef(namespace="ns", name="o" * 43)


def workflow_verdict(
    node_sets: list[NodeSetRequest],
    instance_types: list[str],
    maximum: int,
    current: int,
    confirm: bool,
    order: OrderRef,
) -> str | None:
    """What the workflow's own `set_node_sets` validator says (called on a stand-in instance)."""
    stand_in = SimpleNamespace(
        _decommissioning=False,
        _instance_types=set(instance_types),
        _node_sets={"bm-standard": ns("bm-standard", current)},
        _next_index=current,
        _order_generation=None,
        _input=SimpleNamespace(max_workers_per_order=maximum, scale_down_guard=ScaleDownGuard(), order=order),
    )
    command = SetNodeSets.model_construct(node_sets=node_sets, confirm_scale_down=confirm)
    try:
        ClusterWorkersWorkflow._validate_node_sets(stand_in, command)  # type: ignore[arg-type]
    except ValueError as err:
        return str(err)
    return None


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("instance_types", [TYPES, []], ids=["catalog", "no-catalog"])
@pytest.mark.parametrize(
    ("current", "confirm"), [(0, False), (9, False), (9, True)], ids=["new", "9", "9-confirmed"]
)
def test_the_starter_rules_say_what_the_workflow_validator_says(
    case: str, instance_types: list[str], current: int, confirm: bool
) -> None:
    node_sets = CASES[case]
    order = LONG if case == "name-too-long" else SHORT
    expected = workflow_verdict(node_sets, instance_types, 10, current, confirm, order)
    problem = node_set_problem(
        node_sets,
        instance_types,
        10,
        current=[ns("bm-standard", current)] if current else [],
        confirm_scale_down=confirm,
        order=order,
        next_index=current,
    )
    assert problem == expected
    # The cases do exercise each rule (not only agree on "fine").
    guarded = current == 9 and not confirm and sum(n.count for n in node_sets) < 5
    if case == "name-too-long" and current == 0:
        assert expected is not None and expected.startswith("order.name:")
    elif case == "name-too-long" and confirm:
        assert expected is None  # a scale-down makes no new names: never refused for them
    elif case in ("valid", "exactly-the-maximum", "empty") and not guarded:
        assert expected is None
    elif case == "unknown-type" and not instance_types and not guarded:
        assert expected is None
    else:
        assert expected is not None


@pytest.mark.parametrize(
    ("requested", "refused"),
    [
        ([ns("bm-gpu", 3)], True),  # the type mistyped: every standard worker would leave
        ([ns("bm-standard", 0), ns("bm-gpu", 3)], True),
        ([ns("bm-standard", 2), ns("bm-gpu", 1)], False),  # one leaves
        ([ns("bm-standard", 3), ns("bm-gpu", 3)], False),  # none leaves
    ],
    ids=["swapped", "zeroed-and-added", "one-moved", "added"],
)
def test_the_mass_scale_down_guard_counts_the_workers_leaving_per_node_set(
    requested: list[NodeSetRequest], refused: bool
) -> None:
    """The total alone would let a swap of node sets remove a whole order unconfirmed."""
    current = [ns("bm-standard", 3)]
    for verdict in (
        node_set_problem(requested, TYPES, 10, current=current, order=SHORT, next_index=3),
        workflow_verdict(requested, TYPES, 10, 3, False, SHORT),
    ):
        if refused:
            assert verdict is not None and "removes 3 at once" in verdict, verdict
            assert "changing the order's node sets" in verdict
        else:
            assert verdict is None
    assert node_set_problem(requested, TYPES, 10, current=current, confirm_scale_down=True) is None


def test_same_node_sets_ignores_order_but_not_counts_or_types() -> None:
    a = [ns("bm-standard", 3), ns("bm-gpu", 1)]
    assert same_node_sets(a, list(reversed(a)))
    assert not same_node_sets(a, [ns("bm-standard", 3), ns("bm-gpu", 2)])
    assert not same_node_sets(a, [ns("bm-standard", 3), ns("bm-gpu", 1, "bm-standard")])
    assert not same_node_sets(a, a[:1])


def test_update_ids_are_the_same_for_the_same_change_and_differ_otherwise() -> None:
    desired, observed = [ns("bm-standard", 3)], [ns("bm-standard", 2)]
    one = apply_id("uid-1", 4, desired, observed, WorkflowState.RUNNING)
    assert one == apply_id("uid-1", 4, list(desired), list(observed), WorkflowState.RUNNING)
    others = {
        apply_id("uid-2", 4, desired, observed, WorkflowState.RUNNING),
        apply_id("uid-1", 5, desired, observed, WorkflowState.RUNNING),
        apply_id("uid-1", 4, [ns("bm-standard", 4)], observed, WorkflowState.RUNNING),
        apply_id("uid-1", 4, desired, [ns("bm-standard", 1)], WorkflowState.RUNNING),
        apply_id("uid-1", 4, desired, None, WorkflowState.ABSENT),
        apply_id("uid-1", 4, desired, None, WorkflowState.COMPLETED, closed_run="run-a"),
        # Each completed run gets its own: the server answers an id a closed run completed from it.
        apply_id("uid-1", 4, desired, None, WorkflowState.COMPLETED, closed_run="run-b"),
    }
    assert one not in others and len(others) == 7


def test_timing_policy_presets_and_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OSAC_TIMING_POLICY", raising=False)
    monkeypatch.delenv("OSAC_TIMING_POLICY_FILE", raising=False)
    assert StarterSettings().policy() == TimingPolicy()  # production defaults unless told otherwise
    monkeypatch.setenv("OSAC_TIMING_POLICY", "demo")
    assert StarterSettings().timing_policy == TimingPreset.DEMO
    assert StarterSettings().policy() == demo_policy()
    assert demo_policy().agent_registration_timeout < TimingPolicy().agent_registration_timeout
    overrides = tmp_path / "policy.json"
    overrides.write_text(json.dumps({"agent_registration_timeout": 42, "status_coalesce": "PT1S"}))
    monkeypatch.setenv("OSAC_TIMING_POLICY_FILE", str(overrides))
    policy = StarterSettings().policy()
    assert policy.agent_registration_timeout == timedelta(seconds=42)
    assert policy.status_coalesce == timedelta(seconds=1)
    assert policy.transient_backoff == demo_policy().transient_backoff  # the rest from the preset
    monkeypatch.setenv("OSAC_TIMING_POLICY", "fastest")
    with pytest.raises(ValueError, match="timing_policy"):
        StarterSettings()
    monkeypatch.setenv("OSAC_TIMING_POLICY", "production")
    overrides.write_text(json.dumps({"call_timeout": "PT10S", "wait_heartbeat_timeout": 0}))
    with pytest.raises(ValueError, match="wait_heartbeat_timeout") as refused:
        StarterSettings().policy()
    assert "greater than 0" in str(refused.value) and "call_timeout" not in str(refused.value)
    # Named by its variable, so the commands can print it and exit 2 (README: exit codes).
    assert str(refused.value).startswith(f"OSAC_TIMING_POLICY_FILE={overrides}: wait_heartbeat_timeout: ")
    # Values a started workflow could not live with, and a misspelt field (which would leave the
    # preset's value in place unnoticed), are refused before any workflow gets them.
    for bad, named in (
        ({"agent_install_timeout": 0}, "agent_install_timeout: must be greater than 0"),
        ({"wipe_stuck_after": "-PT1S"}, "wipe_stuck_after: must be greater than 0"),
        ({"prerequisite_recheck": 0}, "prerequisite_recheck: must be greater than 0"),
        (
            {"transient_backoff": ["PT1S", "-PT1S"]},
            "transient_backoff.1: must not be negative",
        ),
        ({"no_hosts_backoff_cap": -1}, "no_hosts_backoff_cap: must not be negative"),
        # A deadline past what datetime holds failed the workflow task for good, with a host allocated.
        ({"bmi_running_timeout": "P3000000D"}, "bmi_running_timeout: must be at most 3650 days"),
        ({"transient_backoff": ["PT1S", "P3651D"]}, "transient_backoff.1: must be at most 3650 days"),
        ({"agent_registration_timout": "PT45M"}, "agent_registration_timout: Extra inputs are not permitted"),
    ):
        overrides.write_text(json.dumps(bad))
        with pytest.raises(ValueError) as refused:
            StarterSettings().policy()
        assert str(refused.value).startswith(f"OSAC_TIMING_POLICY_FILE={overrides}: {named}"), str(
            refused.value
        )
    # Library callers too; but a workflow's input recorded with such a value still decodes (a
    # workflow started by older code must still run, if only to be decommissioned).
    lax = TimingPolicy(agent_unbinding_timeout=timedelta(0), no_hosts_backoff=[timedelta(seconds=-1)])
    with pytest.raises(ValueError, match="agent_unbinding_timeout: must be greater than 0"):
        WorkersApi(cast(Client, None), policy=lax)
    assert TimingPolicy.model_validate_json(lax.model_dump_json()) == lax
    overrides.unlink()
    with pytest.raises(
        ValueError, match="^" + re.escape(f"OSAC_TIMING_POLICY_FILE={overrides}: cannot read it: ")
    ):
        StarterSettings().policy()


async def test_the_work_queue_dedupes_and_never_hands_out_a_key_twice_at_once() -> None:
    queue = WorkQueue()
    queue.add("a")
    queue.add("a", full=True)
    queue.add("b")
    assert len(queue) == 2
    key, full = await queue.get()
    assert (key, full) == ("a", True)  # the flags of duplicates are merged
    queue.add("a")  # while "a" is processed: queued again only after done()
    assert await queue.get() == ("b", False)
    getter = asyncio.create_task(queue.get())
    await asyncio.sleep(0)
    assert not getter.done()
    queue.done("a")
    assert await asyncio.wait_for(getter, 5) == ("a", False)
    queue.done("a")
    queue.add_after("c", 0.05)
    queue.add_after("c", 30)  # a later timer for the same key does not postpone the earlier one
    assert await asyncio.wait_for(queue.get(), 5) == ("c", True)
    queue.close()


def test_a_same_named_order_is_held_back_until_an_older_one_being_deleted_is_gone() -> None:
    """The older order's decommission still releases its hosts, some of them perhaps from before
    the namespace label, which BMaaS would let the newer order adopt: the newer one starts only
    once the older ClusterOrder is gone (found by review: a deleting one no longer counted)."""
    older = {
        "metadata": {
            "name": "x",
            "namespace": "ns1",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "deletionTimestamp": "2026-01-02T00:00:00Z",
            "finalizers": [FINALIZER, "osac.openshift.io/hosted-cluster"],
        }
    }
    newer = {"metadata": {"name": "x", "namespace": "ns2", "creationTimestamp": "2026-01-01T00:00:05Z"}}
    orders = [older, newer]
    hub = SimpleNamespace(informer=lambda resource: SimpleNamespace(items=lambda: list(orders)))
    catalog = cast(InstanceTypeCatalog, SimpleNamespace(client=None))
    ctl = ClusterOrderController(cast(HubKube, hub), cast(WorkersApi, None), catalog)
    problem = ctl._name_taken(OrderRef(namespace="ns2", name="x"), newer)
    assert problem is not None and "ClusterOrder ns1/x already has this name" in problem, problem
    assert "being decommissioned" in problem
    assert ctl._name_taken(OrderRef(namespace="ns1", name="x"), older) is None  # the older goes on
    # Decommissioned (our finalizer gone), held by another's only: it holds nothing of ours.
    older["metadata"]["finalizers"] = ["osac.openshift.io/hosted-cluster"]
    assert ctl._name_taken(OrderRef(namespace="ns2", name="x"), newer) is None
    orders.remove(older)
    assert ctl._name_taken(OrderRef(namespace="ns2", name="x"), newer) is None


@pytest.mark.parametrize("lost_as", ["the SDK's error", "nothing"])
async def test_a_controller_stopped_in_an_update_the_sdk_reports_as_an_error_stops(lost_as: str) -> None:
    """The SDK turns a cancelled update call into its own error (an Exception, not a
    CancelledError): a reconcile loop that counted it as a failed reconcile went on running, and
    the controller's stop waited for it for good. A cancel lost on the way (`wait_for` returns the
    call's result when the cancel comes as it finishes) is a stop too."""
    catalog = cast(InstanceTypeCatalog, SimpleNamespace(client=None))
    ctl = ClusterOrderController(cast(HubKube, None), cast(WorkersApi, None), catalog)
    entered = asyncio.Event()

    async def reconcile(key: str, *, full: bool = True) -> float | None:
        first = not entered.is_set()
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError as err:
            if not first:  # only once: a loop that goes on must still end at the test's teardown
                raise
            if lost_as == "nothing":
                return None
            raise WorkflowUpdateRPCTimeoutOrCancelledError() from err
        return None

    ctl.reconcile = reconcile  # type: ignore[method-assign]
    ctl._queue.add("ns/order")
    loop = asyncio.create_task(ctl._work())
    await asyncio.wait_for(entered.wait(), 30)
    loop.cancel()
    # Not wait_for: on its timeout it cancels again and waits, for good, on a loop that goes on.
    done, _ = await asyncio.wait({loop}, timeout=10)
    assert done, "the reconcile loop went on after it was cancelled"
    assert loop.cancelled()
    assert ctl.stats.errors == 0


def test_the_schemas_in_the_repository_are_up_to_date() -> None:
    assert schemas.stale() == [], "run: python -m starter.schemas"


def test_the_schemas_name_every_handler_and_a_stale_file_is_found(tmp_path: Path) -> None:
    contract = json.loads(schemas.generate()[schemas.CONTRACT_FILE])
    cluster = contract["workflows"]["ClusterWorkersWorkflow"]
    assert cluster["updates"]["set_node_sets"] == {
        "arg": "SetNodeSets.json",
        "result": "ClusterWorkersStatus.result.json",
    }
    assert cluster["signals"]["scale_down_worker"] == {"arg": "ScaleDownWorker.json"}
    assert cluster["queries"]["status"] == {"result": "ClusterWorkersStatus.result.json"}
    assert contract["workflows"]["WorkerNodeWorkflow"]["queries"]["status"] == {
        "result": "WorkerStatus.result.json"
    }
    schemas.write(tmp_path)
    assert schemas.stale(tmp_path) == []
    (tmp_path / "SetNodeSets.json").write_text("{}\n")
    (tmp_path / "Gone.json").write_text("{}\n")
    assert schemas.stale(tmp_path) == ["Gone.json", "SetNodeSets.json"]
    assert schemas.main(["--check", "--dir", str(tmp_path)]) == 1


@pytest.mark.parametrize(
    ("written", "unmanaged"), [("unmanaged", True), ("Unmanaged", False), (" unmanaged", False)]
)
def test_the_management_state_annotation_is_read_exactly_as_osac_reads_it(
    written: str, unmanaged: bool
) -> None:
    """OSAC's other controllers take only `unmanaged`: read more leniently here, an order they
    still manage (and delete the cluster of) would keep its hosts and its finalizer here."""
    order = OrderRef(namespace="ns", name="o")
    obj = {"metadata": {"name": "o", "annotations": {MANAGEMENT_STATE_ANNOTATION: written}}, "spec": {}}
    assert order_facts(order, obj).unmanaged == unmanaged


class _UnansweredRun:
    """A running order's workflow handle whose status query fails with `err` after `after` s."""

    def __init__(self, err: RPCError, after: float) -> None:
        self.err, self.after = err, after

    async def describe(self) -> SimpleNamespace:
        return SimpleNamespace(status=WorkflowExecutionStatus.RUNNING, run_id="run-1")

    async def query(self, *args: object, **kwargs: object) -> None:
        await asyncio.sleep(self.after)
        raise self.err


@pytest.mark.parametrize(
    ("status", "after", "unanswered"),
    [
        (RPCStatusCode.DEADLINE_EXCEEDED, 0.0, True),  # the server's deadline
        (RPCStatusCode.CANCELLED, 0.3, True),  # the client's own ("Timeout expired"), first
        (RPCStatusCode.CANCELLED, 0.0, False),  # cut off at once: something else, left as it is
        (RPCStatusCode.UNAVAILABLE, 0.3, False),
    ],
)
async def test_a_status_query_is_unanswered_only_when_its_time_ran_out(
    monkeypatch: pytest.MonkeyPatch, status: RPCStatusCode, after: float, unanswered: bool
) -> None:
    monkeypatch.setattr(starter.api, "QUERY_TIMEOUT", timedelta(seconds=0.3))
    run = _UnansweredRun(RPCError("refused", status, b""), after)
    api = WorkersApi(cast(Client, SimpleNamespace(get_workflow_handle_for=lambda *a, **k: run)))
    order = OrderRef(namespace="t", name="o")
    for ask in (lambda: api.status(order), lambda: api.run_status(order, "run-1")):
        with pytest.raises((StatusUnanswered, RPCError)) as failed:
            await ask()
        assert isinstance(failed.value, StatusUnanswered) == unanswered, failed.value
        if unanswered:
            assert "no worker answered the status query within 0s" in str(failed.value)
        else:
            assert failed.value is run.err


def test_an_order_with_many_broken_node_requests_gets_a_condition_it_can_hold() -> None:
    """The CRD bounds no list: a message naming all of 1,000 broken requests was over the 32,768
    characters of a condition's message, and no condition could be written at all."""
    requests = [{"numberOfNodes": 1, "bareMetal": {"instanceType": f"Bad_{i}"}} for i in range(1000)]
    facts = order_facts(
        OrderRef(namespace="ns", name="o"), {"metadata": {}, "spec": {"nodeRequests": requests}}
    )
    problem = order_problem(facts)
    assert problem is not None and len(problem) < 2000
    assert problem.startswith("spec.nodeRequests[0]: instance type is not a DNS label; ")
    assert problem.endswith("; and 990 more")
    Condition(
        type="NodeRequestsValid", status=ConditionStatus.FALSE, reason="InvalidNodeRequests", message=problem
    )
