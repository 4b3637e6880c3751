"""How the workflows call activities: one place for timeouts, retries and cancellation."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, RetryState
from temporalio.exceptions import TimeoutError as ActivityTimedOut
from temporalio.workflow import ActivityCancellationType

from contracts.bmaas import NOT_SERVING_ERRORS
from contracts.worker import FailingRequests, TimingPolicy

T = TypeVar("T")

# Calls to a backend: retried by Temporal without end (an outage is waited out, never a give-up).
# How long one attempt may take, and how long a wait may go without a heartbeat, are the order's
# TimingPolicy (call_timeout, wait_heartbeat_timeout).
CALL_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=60))
# A local call's retry waits on a workflow timer, not inside the workflow task: waiting inside it
# held the task, and every command behind it, for the whole backoff (a hub refusing status writes
# held each command 8-16 s). Any backoff above this goes on a timer; 0 would mean the SDK's 1 min.
LOCAL_RETRY_ON_A_TIMER = timedelta(milliseconds=1)
WAIT_RETRY = RetryPolicy(initial_interval=timedelta(seconds=2), maximum_interval=timedelta(seconds=30))
# A wait ends when its condition holds or the workflow stops it; the timeout is only a backstop.
WAIT_LIMIT = timedelta(days=365)


# While a BMaaS call keeps failing, each further round of it: attempts from the longest backoff on
# (or the time an outage takes to be shown, if shorter), for about half an hour: BMaaS gets a
# request a minute from it, the history one round's events per half hour.
ATTEMPTS_WHILE_FAILING = 30


def call_backoff(failures: int) -> timedelta:
    """The wait CALL_RETRY makes after `failures` (>= 1) failed attempts in a row."""
    assert CALL_RETRY.maximum_interval is not None
    interval = CALL_RETRY.initial_interval
    for _ in range(failures - 1):
        if interval >= CALL_RETRY.maximum_interval:
            break
        interval *= CALL_RETRY.backoff_coefficient
    return min(interval, CALL_RETRY.maximum_interval)


def attempts_before_shown(shown_after: timedelta) -> int:
    """How many attempts CALL_RETRY makes before the backoffs between them add up to `shown_after`:
    a call given that many returns to its workflow, which shows that it keeps failing and calls again.
    Once the backoff is at its longest the rest is counted, not stepped through (or grown: a policy's
    `bmaas_failing_shown_after` of 45 min overflowed a timedelta, failing every BMaaS call's task)."""
    waited, attempts = timedelta(0), 1
    while waited < shown_after:
        backoff = call_backoff(attempts)
        if backoff == CALL_RETRY.maximum_interval:
            return attempts + math.ceil((shown_after - waited) / backoff)
        waited += backoff
        attempts += 1
    return attempts


def call_retry(attempts: int, *, first_interval: timedelta | None = None) -> RetryPolicy:
    """CALL_RETRY with at most `attempts` (0: no limit), its first backoff `first_interval` if given."""
    return dataclasses.replace(
        CALL_RETRY, maximum_attempts=attempts, initial_interval=first_interval or CALL_RETRY.initial_interval
    )


def _failing_interval(policy: TimingPolicy) -> timedelta:
    assert CALL_RETRY.maximum_interval is not None
    return min(CALL_RETRY.maximum_interval, policy.bmaas_failing_shown_after)


def ran_out_of_attempts(err: ActivityError) -> bool:
    """The call ended on an error it would have retried: it was given too few attempts to outlast it."""
    return err.retry_state == RetryState.MAXIMUM_ATTEMPTS_REACHED


def bmaas_not_serving(err: ActivityError) -> bool:
    """The last attempt of a BMaaS call timed out, or failed for BMaaS not serving (NOT_SERVING_ERRORS)."""
    cause = err.cause
    if isinstance(cause, ActivityTimedOut):
        return True
    return isinstance(cause, ApplicationError) and cause.type in {t.value for t in NOT_SERVING_ERRORS}


async def bmaas_call_through_outages(
    call_round: Callable[[int, bool], Awaitable[T]],
    *,
    policy: TimingPolicy,
    name: str,
    on_failing: Callable[[FailingRequests | None], None],
) -> T:
    """Make a BMaaS call until it is answered, in rounds: `call_round(attempts, failing)` makes one
    (`call_activity`'s `attempts` and `failing`). A round that runs out on BMaaS not serving calls
    `on_failing` with since when it has (each round: it must be idempotent), one that runs out on a
    wait (a BMI still being deleted) with None, and the end of the call (answered, failed for good,
    cancelled) with None."""
    first_round = attempts_before_shown(policy.bmaas_failing_shown_after)
    attempts, failing, began = first_round, False, workflow.now()
    try:
        while True:
            try:
                return await call_round(attempts, failing)
            except ActivityError as err:
                if not ran_out_of_attempts(err):
                    raise
                failing = bmaas_not_serving(err)
                if failing:
                    workflow.logger.warning("BMaaS keeps failing %s, retrying: %s", name, err.cause or err)
                    on_failing(FailingRequests(since=began))
                else:
                    began = workflow.now()
                    on_failing(None)
                attempts = ATTEMPTS_WHILE_FAILING if failing else first_round
    finally:
        on_failing(None)


async def call_activity(
    name: str,
    arg: Any,
    result_type: type[T] | None,
    *,
    policy: TimingPolicy,
    summary: str,
    wait: bool = False,
    task_queue: str | None = None,
    local: bool = False,
    attempts: int = 0,
    failing: bool = False,
) -> T:
    """Execute an activity by name. A cancelled call returns only once the activity has stopped,
    so teardown never races a create that is still running. `local`: a short call run by the
    workflow's own worker, recorded as one marker instead of three events and a workflow task.
    `policy` gives one attempt's timeout (calls) or the heartbeat timeout (waits). `attempts`: a
    call's limit (0: none), after which it fails with the last attempt's error (`ran_out_of_attempts`);
    `failing`: the call is known to keep failing, so its retries start at the longest backoff (or at
    the policy's `bmaas_failing_shown_after`, if shorter)."""
    if local:
        assert not (wait or task_queue or failing), "a local activity: short, the workflow's queue"
        local_result: T = await workflow.execute_local_activity(
            name,
            arg,
            result_type=result_type,
            start_to_close_timeout=policy.call_timeout,
            retry_policy=call_retry(attempts),
            local_retry_threshold=LOCAL_RETRY_ON_A_TIMER,
            cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            summary=summary,
        )
        return local_result
    retry = call_retry(attempts, first_interval=_failing_interval(policy) if failing else None)
    result: T = await workflow.execute_activity(
        name,
        arg,
        result_type=result_type,
        task_queue=task_queue,
        start_to_close_timeout=WAIT_LIMIT if wait else policy.call_timeout,
        heartbeat_timeout=policy.wait_heartbeat_timeout if wait else None,
        retry_policy=WAIT_RETRY if wait else retry,
        cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        summary=summary,
    )
    return result
