"""Rotated TLS material the process reads only at start: the process stops gracefully to be started
again with it. The files are swapped as the kubelet swaps a Secret volume's (a `..data` symlink)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from worker.rotation import stamps, stop_when_rotated
from worker.temporal_client import tls_files


def _secret_volume(root: Path, version: str, files: dict[str, str]) -> None:
    """The kubelet's layout: `..<version>/` holds the files, `..data` points at it, and each file is
    a symlink through `..data`; an update writes a new version and swaps `..data` atomically."""
    target = root / f"..{version}"
    target.mkdir()
    for name, text in files.items():
        (target / name).write_text(text)
    link = root / "..data_tmp"
    link.symlink_to(target.name)
    os.replace(link, root / "..data")
    for name in files:
        if not (root / name).is_symlink():
            (root / name).symlink_to(f"..data/{name}")


async def test_a_swapped_secret_volume_stops_the_process(tmp_path: Path) -> None:
    _secret_volume(tmp_path, "v1", {"tls.crt": "cert-1", "tls.key": "key-1"})
    # Taken before the process read them: a rotation right after the read is seen too.
    before = stamps([tmp_path / "tls.crt"])
    _secret_volume(tmp_path, "v1b", {"tls.crt": "cert-1b", "tls.key": "key-1b"})
    assert await asyncio.wait_for(stop_when_rotated(before, asyncio.Event(), poll_seconds=0.05), 30) == (
        tmp_path / "tls.crt"
    )
    stop = asyncio.Event()
    watcher = asyncio.create_task(
        stop_when_rotated(stamps([tmp_path / "tls.crt", tmp_path / "tls.key"]), stop, poll_seconds=0.05)
    )
    # Polled a few times with nothing changed: nothing stops.
    await asyncio.sleep(0.3)
    assert not watcher.done() and not stop.is_set()
    _secret_volume(tmp_path, "v2", {"tls.crt": "cert-2", "tls.key": "key-2"})
    changed = await asyncio.wait_for(watcher, 30)
    assert changed in (tmp_path / "tls.crt", tmp_path / "tls.key")
    assert stop.is_set()


async def test_a_stop_that_comes_first_ends_the_watch_without_a_rotation(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("ca")
    stop = asyncio.Event()
    watcher = asyncio.create_task(stop_when_rotated(stamps([tmp_path / "ca.pem"]), stop, poll_seconds=0.05))
    stop.set()
    assert await asyncio.wait_for(watcher, 30) is None
    # Nothing to watch: nothing to wait for.
    assert await stop_when_rotated({}, asyncio.Event()) is None


def test_the_temporal_tls_files_are_the_ones_envconfig_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (
        "TEMPORAL_TLS_CLIENT_CERT_PATH",
        "TEMPORAL_TLS_CLIENT_KEY_PATH",
        "TEMPORAL_TLS_SERVER_CA_CERT_PATH",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(tmp_path / "absent.toml"))
    assert tls_files() == []
    monkeypatch.setenv("TEMPORAL_TLS_CLIENT_CERT_PATH", str(tmp_path / "tls.crt"))
    monkeypatch.setenv("TEMPORAL_TLS_CLIENT_KEY_PATH", str(tmp_path / "tls.key"))
    monkeypatch.setenv("TEMPORAL_TLS_SERVER_CA_CERT_PATH", str(tmp_path / "ca.crt"))
    assert sorted(tls_files()) == sorted(tmp_path / n for n in ("tls.crt", "tls.key", "ca.crt"))
