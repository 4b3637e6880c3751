"""The `osac-workers` commands as an operator runs them (real processes, configured by environment)
against a stack with a running controller: output, effects on the ClusterOrder and the workflow,
and the exit codes of bad input and unreachable servers."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

import starter.api
import starter.cli
from contracts.refs import OrderRef
from contracts.worker import WorkerPhase
from contracts.workflows import ClusterWorkersStatus, cluster_workflow_id
from lab.http_server import bound_socket, free_port, refusing_port
from starter.api import CommandError, StatusUnanswered, WorkflowState
from starter.orders import ControllerCondition, condition_of
from tests.starter.harness import (
    CONFIRM,
    UNMANAGED,
    RunningController,
    bare_metal,
    cli_env,
    create_order,
    get_order,
    patch_order,
    wait_observed,
    wait_ready,
)
from tests.workflows.stack import Stack, eventually

CLI = str(Path(sys.executable).parent / "osac-workers")
BMI_ROUTE = "/api/private/v1/baremetal_instances"


@pytest.fixture(scope="module")
def env(stack: Stack, temporal_env: WorkflowEnvironment) -> dict[str, str]:
    return cli_env(stack, temporal_env.client.service_client.config.target_host)


async def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run, [CLI, *args], env=env, capture_output=True, text=True, timeout=240
    )


def count_of(obj: dict | None, instance_type: str) -> int:
    for request in (obj or {})["spec"]["nodeRequests"]:
        if (request.get("bareMetal") or {}).get("instanceType") == instance_type:
            return int(request["numberOfNodes"])
    raise AssertionError(f"no node request {instance_type}")


async def test_status_as_a_table_and_as_json(
    stack: Stack, ctl: RunningController, env: dict[str, str]
) -> None:
    order = await create_order(stack, bare_metal(bm_standard=2))
    await wait_ready(stack, order, 2)
    table = await cli(env, "status", order.key)
    assert table.returncode == 0, table.stderr
    for name in (order.worker_name(0), order.worker_name(1)):
        assert name in table.stdout
    assert "Ready" in table.stdout and "ready 2/2" in table.stdout
    as_json = await cli(env, "status", order.key, "--output", "json")
    assert as_json.returncode == 0, as_json.stderr
    data = json.loads(as_json.stdout)
    assert data["ready_workers"] == 2
    assert {w["phase"] for w in data["workers"]} == {WorkerPhase.READY.value}
    assert all(w["resourceID"] for w in data["workers"])  # the OSAC status.workers[] shape


async def test_scale_and_a_named_scale_down_keep_the_order_and_the_workflow_in_agreement(
    stack: Stack, ctl: RunningController, env: dict[str, str]
) -> None:
    order = await create_order(stack, bare_metal(bm_standard=2))
    await wait_ready(stack, order, 2)

    scaled = await cli(env, "scale", order.key, "--node-set", "bm-standard", "--count", "3")
    assert scaled.returncode == 0, scaled.stderr
    assert "taken by the workflow" in scaled.stdout
    assert count_of(await get_order(stack, order), "bm-standard") == 3  # the source of truth changed
    await wait_ready(stack, order, 3)

    victim = order.worker_name(1)
    down = await cli(env, "scale-down", order.key, victim)
    assert down.returncode == 0, down.stderr
    assert count_of(await get_order(stack, order), "bm-standard") == 2
    status = await wait_ready(stack, order, 2)
    await wait_observed(stack, ctl, order)
    # Exactly the named worker left, and the controller did not provision a replacement.
    status = await stack.api.status(order)
    assert {w.name for w in status.workers} == {order.worker_name(0), order.worker_name(2)}
    assert [(n.name, n.count) for n in status.node_sets] == [("bm-standard", 2)]


async def test_a_second_scale_down_of_a_leaving_worker_is_refused_and_releases_no_other(
    stack: Stack, ctl: RunningController, env: dict[str, str]
) -> None:
    """Run again while the named worker is still leaving, `scale-down` exits 1 and changes nothing:
    lowering the order once more would make the workflow release a Ready worker nobody named."""
    order = await create_order(stack, bare_metal(bm_standard=3))
    await wait_ready(stack, order, 3)
    victim = order.worker_name(2)
    # BMaaS refuses the release's DELETE until the faults are cleared: the worker stays leaving.
    await stack.set_bmaas_faults(routes={f"DELETE {BMI_ROUTE}/{{id}}": {"error_rate": 1.0}})
    try:
        first = await cli(env, "scale-down", order.key, victim)
        assert first.returncode == 0, first.stderr
        assert count_of(await get_order(stack, order), "bm-standard") == 2
        again = await cli(env, "scale-down", order.key, victim)
        assert again.returncode == 1, (again.stdout, again.stderr)
        assert f"{victim} of order {order.key} is already leaving" in again.stderr
        assert count_of(await get_order(stack, order), "bm-standard") == 2
    finally:
        await stack.clear_bmaas_faults()
    await wait_ready(stack, order, 2)
    await wait_observed(stack, ctl, order)
    status = await stack.api.status(order)
    assert {w.name for w in status.workers} == {order.worker_name(0), order.worker_name(1)}


async def test_a_mass_scale_down_needs_confirm(
    stack: Stack, ctl: RunningController, env: dict[str, str]
) -> None:
    order = await create_order(stack, bare_metal(bm_standard=3))
    await wait_ready(stack, order, 3)
    refused = await cli(env, "scale", order.key, "--node-set", "bm-standard", "--count", "0")
    assert refused.returncode == 1
    assert "lowering the order from 3 to 0 workers" in refused.stderr
    assert count_of(await get_order(stack, order), "bm-standard") == 3  # refused before the order changed

    # The tenant writes the count: the guard holds it back, and the operator confirms it. The refusal
    # already on the order is not the answer to the confirmation (it was taken for one, and the
    # confirmation removed while the controller could still act on it).
    await patch_order(stack, order, {"spec": {"nodeRequests": bare_metal(bm_standard=0)}})

    async def held_back() -> bool:
        valid = condition_of(await get_order(stack, order) or {}, ControllerCondition.NODE_REQUESTS_VALID)
        return valid is not None and valid["status"] == "False" and "from 3 to 0" in valid["message"]

    await eventually(held_back, "the tenant's mass scale-down held back by the guard")
    confirmed = await cli(env, "scale", order.key, "--node-set", "bm-standard", "--count", "0", "--confirm")
    assert confirmed.returncode == 0, confirmed.stderr
    await wait_ready(stack, order, 0)
    obj = await get_order(stack, order)
    assert count_of(obj, "bm-standard") == 0
    # The confirmation was for this change only: the guard protects the next one again.
    assert CONFIRM not in ((obj or {})["metadata"].get("annotations") or {})


async def test_watch_follows_an_order_until_it_settles(
    stack: Stack, ctl: RunningController, env: dict[str, str]
) -> None:
    order = await create_order(stack, bare_metal(bm_standard=1, bm_gpu=1))
    watched = await cli(env, "watch", order.key, "--timeout", "180")
    assert watched.returncode == 0, watched.stderr
    assert "ready 2/2" in watched.stdout
    missing = await cli(env, "watch", f"{order.namespace}/nothing-here", "--timeout", "1")
    assert missing.returncode == 1
    assert "no workers workflow yet; waiting for the controller" in missing.stderr  # said at once
    assert "no workers workflow appeared" in missing.stderr


async def test_commands_on_an_order_whose_workflow_was_stopped_say_so_and_change_nothing(
    stack: Stack, ctl: RunningController, env: dict[str, str]
) -> None:
    """The workers workflow terminated from outside: the controller applies nothing to the order
    until an operator acts, so `scale` refuses before it writes a count (it wrote, then blamed the
    controller after its timeout), and `scale-down` names the state (it said "decommissioned")."""
    order = await create_order(stack, bare_metal(bm_standard=0))

    async def started() -> bool:
        # Answered by a worker: its first task ran (a run closed before that is the next test's).
        try:
            return (
                await stack.api.workflow_state(order) == WorkflowState.RUNNING
                and (await stack.api.status(order)).node_sets != []
            )
        except (RPCError, CommandError):
            return False  # not answered yet

    await eventually(started, "the controller to start the order's workflow")
    run = await stack.api.run_id(order)
    await stack.api.handle(order).terminate(reason="test")
    # Followers stop at once and say why: its last status (0 of 0 Ready) reads as settled, and a
    # decommission's as still under way for as long as anyone waits.
    watched = await cli(env, "watch", order.key, "--timeout", "60")
    assert watched.returncode == 1, (watched.stdout, watched.stderr)
    assert f"the workers workflow of order {order.key} is Terminated" in " ".join(watched.stderr.split())
    with pytest.raises(CommandError, match="is Terminated"):
        await stack.api.run_status(order, run)  # `decommission --wait`
    scaled = await cli(env, "scale", order.key, "--node-set", "bm-standard", "--count", "1")
    assert scaled.returncode == 1, scaled.stderr
    assert f"the workers workflow of order {order.key} is Terminated: it takes no change" in " ".join(
        scaled.stderr.split()
    )
    assert count_of(await get_order(stack, order), "bm-standard") == 0
    released = await cli(env, "scale-down", order.key, order.worker_name(0))
    assert released.returncode == 1, released.stderr
    assert f"the workers workflow of order {order.key} is Terminated" in " ".join(released.stderr.split())
    # It asks for no worker, but the controller manages it: that, not a count, is the reason given.
    refused = await cli(env, "decommission", order.key, "--no-wait")
    assert refused.returncode == 1, refused.stderr
    assert "the controller manages the ClusterOrder (it carries the finalizer" in " ".join(
        refused.stderr.split()
    )


async def test_commands_on_an_order_whose_workflow_was_stopped_before_its_first_task_say_so(
    stack: Stack, ctl: RunningController, env: dict[str, str]
) -> None:
    """Terminated before any worker ran its first task, a run has no state to replay and the
    server refuses queries on it ("closed before WorkflowTaskStarted"): the commands still name
    the state, as for any stopped run. One nobody polls for stays in that state."""
    order = OrderRef(namespace=f"t-{uuid.uuid4().hex[:8]}", name="unstarted")
    handle = await stack.client.start_workflow(
        "ClusterWorkersWorkflow",
        id=cluster_workflow_id(order),
        task_queue=f"{stack.settings.task_queue}-nobody",
    )
    await handle.terminate(reason="test")
    stopped = f"the workers workflow of order {order.key} is Terminated: it takes no change"
    commands: list[Callable[[], Awaitable[object]]] = [
        lambda: stack.api.status(order),
        lambda: stack.api.scale(order, "bm-standard", 1),
        lambda: stack.api.scale_down_worker(order, order.worker_name(0)),
        lambda: stack.api.run_status(order, handle.result_run_id or ""),  # `decommission --wait`
    ]
    for command in commands:
        with pytest.raises(CommandError) as refused:
            await command()
        assert stopped in str(refused.value)
    shown = await cli(env, "status", order.key)
    assert shown.returncode == 1, (shown.stdout, shown.stderr)
    assert stopped in " ".join(shown.stderr.split())
    assert await stack.bmis(order) == []


async def test_a_status_no_worker_answers_in_time_is_said_to_be_unanswered(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A running order's workflow nobody polls for: the query times out, and the error says so in
    its own type, which callers (and the tests' waits) take as "ask again"."""
    monkeypatch.setattr(starter.api, "QUERY_TIMEOUT", timedelta(seconds=2))
    order = OrderRef(namespace=f"t-{uuid.uuid4().hex[:8]}", name="unpolled")
    handle = await stack.client.start_workflow(
        "ClusterWorkersWorkflow",
        id=cluster_workflow_id(order),
        task_queue=f"{stack.settings.task_queue}-nobody",
    )
    try:
        with pytest.raises(StatusUnanswered) as unanswered:
            await stack.api.status(order)
        assert f"order {order.key}: no worker answered the status query within 2s" in str(unanswered.value)
        with pytest.raises(AssertionError, match="no worker answered"):
            await eventually(lambda: stack.api.status(order), "an answer", timeout=1)
        # `watch` and `decommission --wait` go on past it (a worker restarting), saying so once.
        done = ClusterWorkersStatus.model_validate(
            {
                "order": order, "node_sets": [], "desired_workers": 0, "current_workers": 0,
                "ready_workers": 0, "workers": [], "conditions": [], "decommissioning": False,
                "finished": True, "ignored_scale_downs": [],
            }
        )  # fmt: skip
        asked: list[OrderRef] = []

        async def answered_after_two_gaps(ref: OrderRef) -> ClusterWorkersStatus:
            asked.append(ref)
            return done if len(asked) > 2 else await stack.api.status(ref)

        followed = await starter.cli._follow(answered_after_two_gaps, order, timeout=120)
        assert followed == done and len(asked) == 3
        warned = " ".join(capsys.readouterr().err.split())
        assert warned.count("no worker answered the status query") == 1, warned
        assert "still waiting" in warned
    finally:
        await handle.terminate(reason="test")


async def test_decommission_of_an_order_the_controller_leaves_alone(
    stack: Stack, ctl: RunningController, env: dict[str, str]
) -> None:
    order = await create_order(stack, bare_metal(bm_standard=1))
    await wait_ready(stack, order, 1)
    refused = await cli(env, "decommission", order.key, "--timeout", "180")
    assert refused.returncode == 1
    assert "still asks for 1 bare-metal worker" in refused.stderr
    # The operator takes the order over, as the refusal suggests, then decommissions.
    await patch_order(stack, order, {"metadata": {"annotations": UNMANAGED}})
    result = await cli(env, "decommission", order.key, "--timeout", "180")
    assert result.returncode == 0, result.stderr
    assert "decommissioned" in result.stdout
    assert await stack.bmis(order) == []


async def test_a_count_over_the_workflows_maximum_is_refused_before_it_is_written(
    stack: Stack, ctl: RunningController, env: dict[str, str]
) -> None:
    """The CLI's maximum is not the one the order's workflow was started with (and keeps): the CLI
    checks by the workflow's, which its status reports. Before, its own check passed, the count was
    written and then refused by the workflow, and the order went on asking for it."""
    order = await create_order(stack, bare_metal(bm_standard=1))
    await wait_ready(stack, order, 1)
    args = ["scale", order.key, "--node-set", "bm-standard", "--count", "101"]
    refused = await cli({**env, "OSAC_MAX_WORKERS_PER_ORDER": "200"}, *args)
    assert refused.returncode == 1, (refused.stdout, refused.stderr)
    assert "exceed the maximum of 100" in refused.stderr and "rejected:" not in refused.stderr
    assert count_of(await get_order(stack, order), "bm-standard") == 1
    assert (await stack.api.status(order)).ready_workers == 1


async def test_refusals_exit_1_with_the_reason(
    stack: Stack, ctl: RunningController, env: dict[str, str]
) -> None:
    order = await create_order(stack, bare_metal(bm_standard=1))
    await wait_ready(stack, order, 1)
    cases: list[tuple[list[str], str]] = [
        (["status", f"{order.namespace}/missing"], "no workers workflow exists"),
        (["scale", order.key, "--node-set", "bm-large", "--count", "1"], "no bare-metal node set 'bm-large'"),
        (
            ["scale", order.key, "--node-set", "bm-standard", "--count", "-1"],
            "node_sets[0].count: must not be negative",
        ),
        (["scale", order.key, "--node-set", "bm-standard", "--count", "101"], "exceed the maximum of 100"),
        (
            ["scale", f"{order.namespace}/missing", "--node-set", "bm-standard", "--count", "1"],
            "no ClusterOrder",
        ),
        (["scale-down", order.key, "nope"], "has no worker 'nope'"),
    ]
    results = await asyncio.gather(*(cli(env, *args) for args, _ in cases))
    for (args, message), result in zip(cases, results, strict=True):
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        assert message in result.stderr, (args, result.stderr)
    # Nothing changed.
    assert count_of(await get_order(stack, order), "bm-standard") == 1
    assert (await stack.api.status(order)).ready_workers == 1


def spawn_worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([CLI, "worker"], env=env, stdout=out, stderr=subprocess.STDOUT)


async def test_worker_waits_for_temporal_at_start_then_gives_up_with_exit_3(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Started before Temporal (or while it restarts), the worker keeps trying instead of exiting."""
    reserved = bound_socket()  # refuses until it serves, and nobody else can take it meanwhile
    port = reserved.getsockname()[1]
    target = env["TEMPORAL_ADDRESS"].rsplit(":", 1)
    queue = f"late-temporal-{free_port()}"
    worker_env = {
        **env,
        "TEMPORAL_ADDRESS": f"127.0.0.1:{port}",
        "OSAC_TASK_QUEUE": queue,
        "OSAC_BMAAS_TASK_QUEUE": f"{queue}-bmaas",
        "OSAC_GRACEFUL_SHUTDOWN_SECONDS": "1",
    }
    log = tmp_path / "worker.log"

    async def logged(text: str) -> None:
        deadline = asyncio.get_running_loop().time() + 120
        while text not in (log.read_text() if log.exists() else ""):
            assert proc.poll() is None, log.read_text()
            assert asyncio.get_running_loop().time() < deadline, f"no {text!r} in: {log.read_text()}"
            await asyncio.sleep(0.2)

    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(target[0], int(target[1]))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True)

    proc = spawn_worker(worker_env, log)
    server = None
    try:
        await logged("Temporal is not reachable yet")
        # Temporal "comes up" on the configured address: the worker connects without a restart.
        server = await asyncio.start_server(forward, sock=reserved)
        await logged(f"worker running on task queues {queue}")
        proc.terminate()
        assert await asyncio.to_thread(proc.wait, 60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
        if server is not None:
            server.close()
        reserved.close()

    with refusing_port() as dead:
        gone = await asyncio.to_thread(
            subprocess.run,
            [CLI, "worker"],
            env={
                **worker_env,
                "TEMPORAL_ADDRESS": f"127.0.0.1:{dead}",
                "OSAC_TEMPORAL_CONNECT_SECONDS": "1",
            },
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert gone.returncode == 3, gone.stderr
    assert "cannot reach Temporal at 127.0.0.1:" in gone.stderr
    assert "after 1s (OSAC_TEMPORAL_CONNECT_SECONDS)" in gone.stderr


async def test_usage_errors_exit_2_and_unreachable_servers_exit_3(env: dict[str, str]) -> None:
    controller_options = [
        # A zero resync was 300 s, a negative one a busy loop.
        ("--resync-seconds", "0", "greater than or equal to 0.001"),
        ("--log-level", "chatty", "'chatty' is not a log level"),
        ("--namespace", "Bad_NS", "not a namespace name: 'Bad_NS'"),
    ]
    # Independent processes: run at once.
    with refusing_port() as dead:
        bad, no_temporal, no_hub, port, namespace, timeout, *controller = await asyncio.gather(
            cli(env, "status", "not-an-order"),
            cli({**env, "TEMPORAL_ADDRESS": f"127.0.0.1:{dead}"}, "status", "ns/order"),
            cli({**env, "KUBECONFIG": "/nonexistent/kubeconfig"}, "scale-down", "ns/order", "w"),
            # Refused before any process is started, naming the option (they were a traceback, or
            # a pydantic error after the whole stack came up).
            cli(env, "dev", "up", "--temporal-port", "70000", "--state-dir", "/nonexistent/dev"),
            cli(env, "demo", "--namespace", "Bad_NS", "--state-dir", "/nonexistent/dev"),
            cli(env, "scale", "ns/order", "--node-set", "bm-standard", "--count", "1", "--timeout", "0"),
            *(cli(env, "controller", option, value) for option, value, _ in controller_options),
        )
    assert bad.returncode == 2
    assert "expected <namespace>/<order>" in bad.stderr
    assert no_temporal.returncode == 3
    assert "cannot reach Temporal" in no_temporal.stderr
    assert no_hub.returncode == 3
    assert "KUBECONFIG" in no_hub.stderr
    assert port.returncode == 2 and "'--temporal-port'" in port.stderr and "Traceback" not in port.stderr
    assert namespace.returncode == 2 and "'--namespace'" in namespace.stderr
    assert "'Bad_NS' is not a DNS label" in namespace.stderr
    assert timeout.returncode == 2 and "'--timeout'" in timeout.stderr
    for (option, _, reason), refused in zip(controller_options, controller, strict=True):
        assert refused.returncode == 2 and f"'{option}'" in refused.stderr, (option, refused.stderr)
        assert reason in " ".join(refused.stderr.replace("│", " ").split()), (option, refused.stderr)


async def test_bad_configuration_exits_2_naming_each_variable(env: dict[str, str], tmp_path: Path) -> None:
    """Every command: one line per bad variable with the reason, exit 2, no traceback."""
    policy = tmp_path / "policy.json"
    policy.write_text('{"agent_registration_timeout": "soon"}')
    cases: list[tuple[list[str], dict[str, str], list[str]]] = [
        (
            ["controller"],
            {"OSAC_CONTROLLER_RESYNC_SECONDS": "abc", "OSAC_MAX_WORKERS_PER_ORDER": "0"},
            [
                "OSAC_CONTROLLER_RESYNC_SECONDS: Input should be a valid number",
                "OSAC_MAX_WORKERS_PER_ORDER: Input should be greater than 0",
            ],
        ),
        (
            ["decommission", "ns/order"],
            {"OSAC_CONTROLLER_NAMESPACES": "[tenant-a"},
            ["OSAC_CONTROLLER_NAMESPACES: not valid JSON"],
        ),
        (
            ["worker"],
            {
                "OSAC_MAX_CONCURRENT_ACTIVITIES": "0",
                "OSAC_HEALTH_BIND": "8081",
                "OSAC_METRICS_BIND": "localhost:9",
            },
            [
                "OSAC_MAX_CONCURRENT_ACTIVITIES: Input should be greater than 0",
                "OSAC_HEALTH_BIND: Value error, expected host:port, got '8081'",
                "OSAC_METRICS_BIND: Value error, expected ip:port (the runtime takes no host name)",
            ],
        ),
        (
            ["status", "ns/order"],
            {"OSAC_TIMING_POLICY_FILE": "/nonexistent/policy.json"},
            ["OSAC_TIMING_POLICY_FILE=/nonexistent/policy.json: cannot read it"],
        ),
        (
            ["scale-down", "ns/order", "w"],
            {"OSAC_TIMING_POLICY_FILE": str(policy), "OSAC_WORKER_ROLE": "everything"},
            [
                "OSAC_WORKER_ROLE: Input should be 'all', 'workflows' or 'activities'",
                f"OSAC_TIMING_POLICY_FILE={policy}: agent_registration_timeout: Input should be a valid",
            ],
        ),
        (
            ["watch", "ns/order"],
            {"OSAC_TIMING_POLICY": "fast"},
            ["OSAC_TIMING_POLICY: Input should be 'production' or 'demo'"],
        ),
        (
            # Each was a traceback (exit 1) when the first client was built, or filtered every order out.
            ["scale-down", "ns/order", "w"],
            {"OSAC_FULFILLMENT_CA_FILE": "/nonexistent/ca.pem", "OSAC_CONTROLLER_NAMESPACES": '["Tenant_A"]'},
            [
                "OSAC_FULFILLMENT_CA_FILE: Value error, /nonexistent/ca.pem is not a readable PEM CA bundle",
                "OSAC_CONTROLLER_NAMESPACES: Value error, not a namespace name (a DNS label): 'Tenant_A'",
            ],
        ),
    ]
    results = await asyncio.gather(*(cli({**env, **extra}, *args) for args, extra, _ in cases))
    for (args, _, messages), result in zip(cases, results, strict=True):
        assert result.returncode == 2, (args, result.stderr)
        assert "Traceback" not in result.stderr, (args, result.stderr)
        problems = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(problems) == len(messages), (args, result.stderr)
        for message in messages:
            assert any(message in line for line in problems), (args, message, result.stderr)
