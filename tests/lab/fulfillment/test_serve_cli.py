"""`osac-workers lab serve` as a real process: its files, its flags, the documented curl walkthrough,
and a clean stop on SIGTERM."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import lab.serve
from lab.fulfillment.testing import bmi_body, lab_serving

BMI = "/api/private/v1/baremetal_instances"
SECRET = "SECRET-USER-DATA-" + "q" * 24


def curl_walkthrough() -> str:
    doc = lab.serve.__doc__ or ""
    return doc[doc.index("# --- curl walkthrough ---") : doc.index("# --- end ---")]


Served = tuple[Path, "subprocess.Popen[str]"]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    state = tmp_path / "state"
    with lab_serving(
        state,
        "--state-dir",
        str(state),
        "--fulfillment-port",
        "0",
        "--hub-port",
        "0",
        "--hosts",
        "3",
        "--timing",
        "demo",
        "--allocation-seconds",
        "0",
        "--image-write-seconds",
        "0.01",
        "--boot-seconds",
        "0.02",
        "--wipe-seconds",
        "0.03",
        "--deprovision-seconds",
        "0",
    ) as proc:
        yield state, proc


def test_serve_writes_its_files_and_stops_cleanly(served: Served) -> None:
    state, proc = served
    endpoints = json.loads((state / "endpoints.json").read_text())
    assert set(endpoints) == {"fulfillment_url", "hub_url"}
    url = endpoints["fulfillment_url"]
    assert url.startswith("http://127.0.0.1:")
    for name in ("admin-token", "tenant-token"):
        assert stat.S_IMODE((state / name).stat().st_mode) == 0o600
    admin = {"Authorization": f"Bearer {(state / 'admin-token').read_text()}"}
    tenant = {"Authorization": f"Bearer {(state / 'tenant-token').read_text()}"}
    with httpx.Client(base_url=url, timeout=20) as client:
        timings = client.get("/lab/v1/timings", headers=admin).json()
        assert timings == {
            "allocation_s": 0.0,
            "image_write_s": 0.01,
            "boot_s": 0.02,
            "wipe_s": 0.03,
            "deprovision_s": 0.0,
        }
        assert len(client.get("/lab/v1/hosts", headers=admin).json()["items"]) == 3
        created = client.post(BMI, headers=admin, json=bmi_body("secretive", user_data=SECRET))
        assert created.status_code == 200, created.text
        public = client.get("/api/fulfillment/v1/baremetal_instances", headers=tenant)
        assert public.json() == {"size": 0, "total": 0, "items": []}  # tenant-a never sees system BMIs
        assert client.get(BMI, headers=tenant).status_code == 403

    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert url in out
    assert not (state / "endpoints.json").exists()
    assert SECRET not in out + err


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_documented_curl_walkthrough_drives_a_whole_bmi_life(served: Served) -> None:
    state, _ = served
    result = subprocess.run(
        ["bash", "-eu", "-c", curl_walkthrough()],
        env={**os.environ, "STATE": str(state)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    audit = json.loads(result.stdout.strip().splitlines()[-1])
    kinds = [r["kind"] for r in audit["records"]]
    assert kinds == ["HOST_ALLOCATED", "HOST_BOOTED", "WIPE_STARTED", "WIPE_FINISHED", "HOST_RELEASED"]

    events = [
        json.loads(line)["result"]["event"]
        for line in (state / "watch.ndjson").read_text().splitlines()
        if line
    ]
    assert events[0]["type"] == "EVENT_TYPE_OBJECT_CREATED"
    assert events[-1]["type"] == "EVENT_TYPE_OBJECT_DELETED"
    assert {e["bare_metal_instance"]["metadata"]["name"] for e in events} == {"curl-worker-0"}
    states = [e["bare_metal_instance"]["status"]["state"] for e in events]
    assert "BARE_METAL_INSTANCE_STATE_RUNNING" in states and "BARE_METAL_INSTANCE_STATE_DELETING" in states
    labels = [e["bare_metal_instance"]["metadata"]["labels"] for e in events]
    assert labels[-1] == {"osac.openshift.io/cluster-order": "curl", "stage": "ready"}
