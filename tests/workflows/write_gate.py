"""Shared by a test's status-write activity and its workflow interceptor (held_queries): the gate
a status query's answer waits for."""

from __future__ import annotations

import threading

# Well under the SDK's 2 s deadlock detection of a workflow thread that does not yield.
WAIT_SECONDS = 1.0

# Set by the test: a status query waits for it; the write it waits for sets it once it ended.
query_waits_for: threading.Event | None = None
