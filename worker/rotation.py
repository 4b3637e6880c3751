"""Restart to load rotated TLS material the process only reads at start.

The Temporal client reads its mTLS certificate, key and CA once, at connect (envconfig gives it
bytes), and the BMaaS client builds its SSL context once. When cert-manager renews the mounted
Secret, the process would keep the old certificate until it expires, and then fail every reconnect
while its probes stay green (the SDK retries an unavailable server for ever). Watching the files and
stopping gracefully when one changes lets the supervisor (Kubernetes) start the process again, with
the new material: the in-flight work drains as for a SIGTERM. Every replica watches the same Secret,
so they restart within one kubelet sync of each other.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from activities.file_stamp import FileStamp, file_stamp
from worker.settings import Settings
from worker.temporal_client import tls_files

log = logging.getLogger(__name__)

# The exit code of a process stopped to load rotated TLS material: any supervisor restarts it.
ROTATED_EXIT_CODE = 4
POLL_SECONDS = 10.0

Stamps = Mapping[Path, FileStamp | None]


def read_once(settings: Settings) -> list[Path]:
    """The TLS files a process reads only at start: Temporal's (envconfig) and the BMaaS CA bundle.
    (The BMaaS token and the kubeconfig's token file are re-read by their clients.)"""
    ca = [settings.fulfillment_ca_file] if settings.fulfillment_ca_file is not None else []
    return [*tls_files(), *ca]


def stamps(paths: list[Path]) -> dict[Path, FileStamp | None]:
    """The files as they are now (None: cannot be looked at). Taken before the process reads them,
    so a rotation in between is seen too."""

    def stamp(path: Path) -> FileStamp | None:
        try:
            return file_stamp(path)  # follows the Secret volume's ..data symlinks
        except OSError:
            return None

    return {path: stamp(path) for path in paths}


async def wait_until_changed(seen: Stamps, poll_seconds: float = POLL_SECONDS) -> Path:
    """Return the first file whose stamp differs from `seen`."""
    while True:
        now = stamps(list(seen))
        for path, before in seen.items():
            if now[path] != before:
                return path
        await asyncio.sleep(poll_seconds)


async def stop_when_rotated(
    seen: Stamps, stop: asyncio.Event, poll_seconds: float = POLL_SECONDS
) -> Path | None:
    """Set `stop` when one of the files changes from `seen`; the changed file, or None when `stop`
    came first or there is nothing to watch."""
    if not seen:
        return None
    changed = asyncio.ensure_future(wait_until_changed(seen, poll_seconds))
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


async def run_until_rotated(seen: Stamps, stop: asyncio.Event, run: Callable[[], Awaitable[None]]) -> bool:
    """Run `run` (which returns once `stop` is set); True when it stopped for a rotated file."""
    rotated = asyncio.ensure_future(stop_when_rotated(seen, stop))
    try:
        await run()
    finally:
        stop.set()
        changed = await rotated
    return changed is not None
