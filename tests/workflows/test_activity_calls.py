"""How a workflow tells a BMaaS outage from a BMaaS wait, and when it shows one (no server needed)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from temporalio.exceptions import ActivityError, ApplicationError, RetryState, TimeoutType
from temporalio.exceptions import TimeoutError as ActivityTimedOut

from contracts.bmaas import NON_RETRYABLE_ERRORS, NOT_SERVING_ERRORS, BmaasErrorType
from workflows.activity_calls import (
    ATTEMPTS_WHILE_FAILING,
    CALL_RETRY,
    attempts_before_shown,
    bmaas_not_serving,
    call_backoff,
    call_retry,
    ran_out_of_attempts,
)


def _failed(cause: BaseException | None, retry_state: RetryState) -> ActivityError:
    err = ActivityError(
        "activity error",
        scheduled_event_id=5,
        started_event_id=6,
        identity="worker",
        activity_type="create_worker_instance",
        activity_id="1",
        retry_state=retry_state,
    )
    err.__cause__ = cause
    return err


@pytest.mark.parametrize(
    ("shown_after", "attempts"),
    [
        (timedelta(milliseconds=1), 2),  # one backoff (1 s) covers it
        (timedelta(seconds=1), 2),
        (timedelta(seconds=1.5), 3),  # 1 + 2 s
        (timedelta(minutes=2), 8),  # 1 + 2 + 4 + 8 + 16 + 32 + 60 = 123 s
        (timedelta(minutes=5), 11),  # then at the 60 s maximum: 183, 243, 303 s
        # Past 42 min the backoff, doubled on each step, overflowed a timedelta.
        (timedelta(minutes=45), 51),  # 63 s, then 44 x 60 s
        (timedelta(days=3650), 7 + 5_255_999),  # the longest a policy holds: 63 s, then the rest / 60 s
    ],
)
def test_a_call_gets_the_attempts_whose_backoffs_cover_the_time_before_an_outage_is_shown(
    shown_after: timedelta, attempts: int
) -> None:
    assert CALL_RETRY.initial_interval == timedelta(seconds=1)
    assert CALL_RETRY.maximum_interval == timedelta(seconds=60)
    assert attempts_before_shown(shown_after) == attempts


def test_the_backoff_after_failures_doubles_up_to_the_longest() -> None:
    waits = [call_backoff(failures).total_seconds() for failures in (1, 2, 3, 6, 7, 8, 10_000_000)]
    assert waits == [1, 2, 4, 32, 60, 60, 60]


@pytest.mark.parametrize("error_type", sorted(NOT_SERVING_ERRORS))
def test_bmaas_not_serving_is_an_outage(error_type: BmaasErrorType) -> None:
    err = _failed(ApplicationError("down", type=error_type.value), RetryState.MAXIMUM_ATTEMPTS_REACHED)
    assert ran_out_of_attempts(err) and bmaas_not_serving(err)


def test_a_bmaas_call_that_times_out_is_an_outage() -> None:
    timed_out = ActivityTimedOut("timed out", type=TimeoutType.START_TO_CLOSE, last_heartbeat_details=[])
    assert bmaas_not_serving(_failed(timed_out, RetryState.MAXIMUM_ATTEMPTS_REACHED))


@pytest.mark.parametrize("error_type", [BmaasErrorType.INSTANCE_DELETING, BmaasErrorType.CONFLICT])
def test_bmaas_answering_with_a_wait_or_a_conflict_is_no_outage(error_type: BmaasErrorType) -> None:
    """A slot's old BMI still being wiped (a create waits it out by retrying) says BMaaS works."""
    err = _failed(ApplicationError("wait", type=error_type.value), RetryState.MAXIMUM_ATTEMPTS_REACHED)
    assert ran_out_of_attempts(err) and not bmaas_not_serving(err)


def test_only_retried_errors_can_be_an_outage() -> None:
    assert not NOT_SERVING_ERRORS & {BmaasErrorType.INVALID_ARGUMENT, BmaasErrorType.NOT_FOUND}
    # A refusal is in both: non-retryable as raised, made retryable where a host is at stake.
    assert NOT_SERVING_ERRORS & NON_RETRYABLE_ERRORS == {
        BmaasErrorType.UNAUTHENTICATED,
        BmaasErrorType.PERMISSION_DENIED,
    }


def test_a_call_known_to_be_failing_retries_from_a_longer_backoff() -> None:
    first = call_retry(8)
    failing = call_retry(ATTEMPTS_WHILE_FAILING, first_interval=timedelta(seconds=60))
    assert (first.initial_interval, first.maximum_attempts) == (timedelta(seconds=1), 8)
    assert (failing.initial_interval, failing.maximum_attempts) == (
        timedelta(seconds=60),
        ATTEMPTS_WHILE_FAILING,
    )
    assert failing.maximum_interval == CALL_RETRY.maximum_interval
    assert call_retry(0).maximum_attempts == 0  # no limit: every call but BMaaS's
