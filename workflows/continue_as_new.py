"""When a run is due to continue as new, decided at points its replay decides alike."""

from __future__ import annotations

from temporalio import workflow


class ContinueAsNewDue:
    """Whether the server suggests this run continue as new, as seen where an event its history
    keeps resumed the run.

    The server's suggestion comes with each workflow task, and a `wait_condition` reading it passes
    in the first activation of a suggested task that checks conditions. One such activation is not
    in the history as it ran: a local activity's result, in a task that also answered a query, is
    left by the SDK to a task it forces, which replay does not see (it takes the result in the
    task that recorded it, whose activation has a job). A run that continued as new in the forced
    task failed to replay. So the suggestion is looked at (`look`) only where a signal, an accepted
    update, a timer that fired or a remote activity's result resumed the run, and kept from there.
    Never from a validator (a rejected update leaves no event), a query, or after a local
    activity; and a run whose history grows must look somewhere in that growth (a local activity
    retried on the SDK's timers does not)."""

    def __init__(self) -> None:
        self._kept = False
        self._due = False

    def decide(self, kept: bool) -> None:
        """`kept`: this run keeps the suggestion `look` saw; runs recorded before read it live."""
        self._kept = kept

    @property
    def kept(self) -> bool:
        return self._kept

    def look(self) -> None:
        if self._kept and workflow.info().is_continue_as_new_suggested():
            self._due = True

    @property
    def due(self) -> bool:
        return self._due if self._kept else workflow.info().is_continue_as_new_suggested()
