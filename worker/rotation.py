"""Restart to load rotated TLS material the process only reads at start.

The Temporal client reads its mTLS certificate, key and CA once, at connect (envconfig gives it
bytes), and the BMaaS client builds its SSL context once. When cert-manager renews the mounted
Secret, the process would keep the old certificate until it expires, and then fail every reconnect
while its probes stay green (the SDK retries an unavailable server for ever). Watching the files and
stopping gracefully when one changes lets the supervisor (Kubernetes) start the process again, with
the new material: the in-flight work drains as for a SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from worker.settings import Settings
from worker.temporal_client import tls_files

log = logging.getLogger(__name__)

# The exit code of a process stopped to load rotated TLS material: any supervisor restarts it.
ROTATED_EXIT_CODE = 4
POLL_SECONDS = 10.0

Signature = tuple[int, int, int, int] | None


def signature(path: Path) -> Signature:
    """What changes when the file is replaced or rewritten (kubelet swaps a symlink: the target's
    inode changes); None while it cannot be read."""
    try:
        st = os.stat(path)  # follows the Secret volume's ..data symlinks
    except OSError:
        return None
    return (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns)


def read_once(settings: Settings) -> list[Path]:
    """The TLS files a process reads only at start: Temporal's (envconfig) and the BMaaS CA bundle.
    (The BMaaS token and the kubeconfig's token file are re-read by their clients.)"""
    ca = [settings.fulfillment_ca_file] if settings.fulfillment_ca_file is not None else []
    return [*tls_files(), *ca]


async def wait_until_changed(paths: Sequence[Path], poll_seconds: float = POLL_SECONDS) -> Path:
    """Return the first of `paths` whose file changed since this call began."""
    seen = {path: signature(path) for path in paths}
    while True:
        await asyncio.sleep(poll_seconds)
        for path, before in seen.items():
            if signature(path) != before:
                return path


async def stop_when_rotated(
    paths: Sequence[Path], stop: asyncio.Event, poll_seconds: float = POLL_SECONDS
) -> Path | None:
    """Set `stop` when one of `paths` changes; the changed file, or None when `stop` came first or
    there is nothing to watch."""
    if not paths:
        return None
    changed = asyncio.ensure_future(wait_until_changed(paths, poll_seconds))
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({changed, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not changed.done():
            changed.cancel()
    if changed.cancelled() or not changed.done():
        return None
    path = changed.result()
    log.warning(
        "%s changed (a rotated certificate or key): stopping gracefully so the process is started"
        " again with it (exit %d)",
        path,
        ROTATED_EXIT_CODE,
    )
    stop.set()
    return path
