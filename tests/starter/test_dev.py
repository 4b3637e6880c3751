"""The embedded default as real processes: `dev up` -> an order on the hub -> Ready -> `dev down`."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import kubernetes

from starter.dev import Component, ProcessRecord

CLI = str(Path(sys.executable).parent / "osac-workers")
PORTS = ["--temporal-port", "0", "--ui-port", "0", "--fulfillment-port", "0", "--hub-port", "0"]


def run(
    *args: str, env: dict[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=timeout, env=env)


def records(state: Path) -> list[ProcessRecord]:
    found = []
    for component in Component:
        data = json.loads((state / f"{component.value}.pid").read_text())
        found.append(ProcessRecord(component, int(data["pid"]), str(data["marker"])))
    return found


def test_dev_up_an_order_becomes_ready_dev_down(tmp_path: Path) -> None:
    state = tmp_path / "dev"
    up = run("dev", "up", "--state-dir", str(state), "--timing", "zero", *PORTS)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        endpoints = json.loads((state / "endpoints.json").read_text())
        assert set(endpoints) == {
            "temporal_address",
            "temporal_ui_url",
            "fulfillment_url",
            "hub_url",
            "worker_metrics_url",
        }
        assert httpx.get(endpoints["worker_metrics_url"], timeout=10).status_code == 200
        assert stat.S_IMODE((state / "kubeconfig").stat().st_mode) == 0o600
        assert (state / "temporal.db").exists()
        for component in Component:
            assert (state / f"{component.value}.log").exists()
        status = run("dev", "status", "--state-dir", str(state))
        assert status.returncode == 0, status.stdout
        assert status.stdout.count("healthy") == 4
        again = run("dev", "up", "--state-dir", str(state), *PORTS)
        assert again.returncode == 0 and "already up" in again.stdout

        # A tenant's order arrives on the hub; the stack's controller and worker make it Ready.
        namespace, name = f"t-{uuid.uuid4().hex[:6]}", "o1"
        api = kubernetes.config.new_client_from_config(config_file=str(state / "kubeconfig"))
        try:
            namespace_body = kubernetes.client.V1Namespace(
                metadata=kubernetes.client.V1ObjectMeta(name=namespace)
            )
            kubernetes.client.CoreV1Api(api).create_namespace(namespace_body)
            kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object(
                "osac.openshift.io",
                "v1alpha1",
                namespace,
                "clusterorders",
                {
                    "apiVersion": "osac.openshift.io/v1alpha1",
                    "kind": "ClusterOrder",
                    "metadata": {"name": name},
                    "spec": {
                        "templateID": "ocp_4_18_small",
                        "releaseImage": "quay.io/openshift-release-dev/ocp-release:4.18.0-x86_64",
                        "pullSecret": '{"auths": {}}',
                        "nodeRequests": [
                            {"numberOfNodes": 1, "bareMetal": {"instanceType": "bm-standard"}},
                            {"numberOfNodes": 1, "bareMetal": {"instanceType": "bm-gpu"}},
                        ],
                    },
                },
            )
        finally:
            api.close()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "OSAC_"))}
        env.update(TEMPORAL_ADDRESS=endpoints["temporal_address"], TEMPORAL_CONFIG_FILE="/nonexistent")
        watched = run("watch", f"{namespace}/{name}", "--timeout", "180", env=env)
        assert watched.returncode == 0, watched.stdout + watched.stderr
        assert "ready 2/2" in watched.stdout
        processes = records(state)
        assert all(p.alive() for p in processes)
    finally:
        down = run("dev", "down", "--state-dir", str(state), "--grace", "30")
    assert down.returncode == 0, down.stderr
    assert not any(p.alive() for p in processes)
    assert not (state / "endpoints.json").exists()
    assert not list(state.glob("*.pid"))
    stopped = run("dev", "status", "--state-dir", str(state))
    assert stopped.returncode == 1
    assert "stopped" in stopped.stdout
