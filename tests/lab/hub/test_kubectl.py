"""kubectl 1.32 against the hub twin: get/apply/patch/describe/delete, get -w and get events, per kind."""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from lab.hub.testing import (
    RunningHub,
    sample_agent,
    sample_agent_machine,
    sample_cluster_order,
    sample_infraenv,
    sample_machine,
    sample_nodepool,
)

KUBECTL = shutil.which("kubectl")
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def kubectl_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("kubectl-home")
    return {
        "PATH": os.environ.get("PATH", "/usr/bin"),
        "HOME": str(home),
        "KUBECACHEDIR": str(home / "cache"),
    }


@pytest.fixture(scope="module")
def kubectl_args(hub: RunningHub, kubectl_env: dict[str, str]) -> list[str]:
    assert KUBECTL is not None
    return [KUBECTL, "--kubeconfig", str(hub.kubeconfig), "--cache-dir", kubectl_env["KUBECACHEDIR"]]


@pytest.fixture(scope="module")
def kubectl(kubectl_args: list[str], kubectl_env: dict[str, str]) -> Kubectl:
    def run(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [*kubectl_args, *args], input=stdin, capture_output=True, text=True, timeout=120, env=kubectl_env
        )
        if check:
            assert result.returncode == 0, f"kubectl {' '.join(args)} failed: {result.stderr}"
        return result

    return run


MANIFESTS: dict[str, tuple[Callable[[str], dict[str, Any]], str, dict[str, Any]]] = {
    "clusterorders": (sample_cluster_order, "cord", {"spec": {"templateParameters": "{}"}}),
    "agents": (sample_agent, "agent", {"spec": {"hostname": "worker-1"}}),
    "infraenvs": (sample_infraenv, "infraenv", {"spec": {"sshAuthorizedKey": "ssh-ed25519 AAAA"}}),
    "nodepools": (sample_nodepool, "np", {"spec": {"replicas": 2}}),
    "machines": (sample_machine, "machine", {"spec": {"providerID": "agent://x"}}),
    "agentmachines": (sample_agent_machine, "agentmachine", {"spec": {"providerID": "agent://x"}}),
}


@pytest.mark.parametrize("plural", list(MANIFESTS))
def test_apply_get_describe_patch_delete(kubectl: Kubectl, ns: str, plural: str) -> None:
    make, short, merge = MANIFESTS[plural]
    manifest = make("thing")
    out = kubectl("apply", "-n", ns, "-f", "-", stdin=yaml.safe_dump(manifest)).stdout
    assert "created" in out
    assert "unchanged" in kubectl("apply", "-n", ns, "-f", "-", stdin=yaml.safe_dump(manifest)).stdout
    manifest["metadata"]["labels"] = {"applied": "twice"}
    assert "configured" in kubectl("apply", "-n", ns, "-f", "-", stdin=yaml.safe_dump(manifest)).stdout

    table = kubectl("get", plural, "-n", ns).stdout.splitlines()
    assert table[0].startswith("NAME") and table[1].startswith("thing")
    everywhere = kubectl("get", short, "-A", "-l", "applied=twice").stdout
    assert ns in everywhere and "thing" in everywhere
    got = json.loads(kubectl("get", plural, "thing", "-n", ns, "-o", "json").stdout)
    assert got["metadata"]["labels"] == {"applied": "twice"}
    assert "kubectl.kubernetes.io/last-applied-configuration" in got["metadata"]["annotations"]
    described = kubectl("describe", plural, "thing", "-n", ns).stdout
    assert "Name:" in described and "thing" in described

    assert (
        "patched"
        in kubectl("patch", plural, "thing", "-n", ns, "--type=merge", "-p", json.dumps(merge)).stdout
    )
    ops = [{"op": "add", "path": "/metadata/annotations/patched", "value": "json"}]
    assert (
        "patched" in kubectl("patch", plural, "thing", "-n", ns, "--type=json", "-p", json.dumps(ops)).stdout
    )
    status_patch = {
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Done",
                    "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ]
        }
    }
    kubectl(
        "patch",
        plural,
        "thing",
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(status_patch),
    )
    got = json.loads(kubectl("get", plural, "thing", "-n", ns, "-o", "json").stdout)
    assert got["metadata"]["annotations"]["patched"] == "json"
    assert got["status"]["conditions"][0]["type"] == "Ready"
    for key, value in merge["spec"].items():
        assert got["spec"][key] == value

    if plural == "nodepools":
        assert "scaled" in kubectl("scale", plural, "thing", "-n", ns, "--replicas=4").stdout
        assert kubectl("get", plural, "thing", "-n", ns, "-o", "jsonpath={.spec.replicas}").stdout == "4"

    # Custom resources take no strategic merge patch (kubectl's default --type).
    refused = kubectl("patch", plural, "thing", "-n", ns, "-p", json.dumps(merge), check=False)
    assert (
        refused.returncode != 0
        and "application/strategic-merge-patch+json is not supported" in refused.stderr
    )

    assert "deleted" in kubectl("delete", plural, "thing", "-n", ns).stdout
    missing = kubectl("get", plural, "thing", "-n", ns, check=False)
    assert missing.returncode != 0 and "NotFound" in missing.stderr


def test_core_kinds(kubectl: Kubectl, ns: str) -> None:
    secret: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "pull"},
        "stringData": {"k": "v1"},
    }
    assert "created" in kubectl("apply", "-n", ns, "-f", "-", stdin=yaml.safe_dump(secret)).stdout
    secret["stringData"]["k"] = "v2"
    assert "configured" in kubectl("apply", "-n", ns, "-f", "-", stdin=yaml.safe_dump(secret)).stdout
    assert kubectl("get", "secret", "pull", "-n", ns, "-o", "jsonpath={.data.k}").stdout == "djI="
    assert "Opaque" in kubectl("get", "secrets", "-n", ns).stdout
    assert (
        "patched"
        in kubectl("patch", "secret", "pull", "-n", ns, "-p", '{"metadata":{"labels":{"a":"b"}}}').stdout
    )
    assert "Type:  Opaque" in kubectl("describe", "secret", "pull", "-n", ns).stdout
    assert "deleted" in kubectl("delete", "secret", "pull", "-n", ns).stdout

    # Typed commands send protobuf bodies.
    assert "created" in kubectl("create", "secret", "generic", "typed", "-n", ns, "--from-literal=a=b").stdout
    assert (
        kubectl("get", "secret", "typed", "-n", ns, "-o", "jsonpath={.type} {.data.a}").stdout
        == "Opaque Yg=="
    )
    assert "created" in kubectl("create", "namespace", f"{ns}-y").stdout
    assert kubectl("get", "ns", f"{ns}-y", "-o", "jsonpath={.status.phase}").stdout == "Active"
    kubectl("delete", "namespace", f"{ns}-y")

    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"{ns}-x"}}
    assert "created" in kubectl("apply", "-f", "-", stdin=yaml.safe_dump(namespace)).stdout
    assert "Active" in kubectl("get", "ns", f"{ns}-x").stdout
    assert "Status:" in kubectl("describe", "namespace", f"{ns}-x").stdout
    assert "deleted" in kubectl("delete", "namespace", f"{ns}-x", "--wait=true", "--timeout=60s").stdout
    assert kubectl("get", "ns", f"{ns}-x", check=False).returncode != 0


def test_get_events_and_describe_shows_them(kubectl: Kubectl, custom, core, ns: str) -> None:
    created = custom.create_namespaced_custom_object(
        "osac.openshift.io", "v1alpha1", ns, "clusterorders", sample_cluster_order("o")
    )
    core.create_namespaced_event(
        ns,
        {
            "metadata": {"name": "o.1"},
            "involvedObject": {
                "apiVersion": "osac.openshift.io/v1alpha1",
                "kind": "ClusterOrder",
                "name": "o",
                "namespace": ns,
                "uid": created["metadata"]["uid"],
            },
            "reason": "WorkerCreated",
            "message": "worker o-worker-0 created",
            "type": "Normal",
            "source": {"component": "osac-workers"},
            "count": 1,
            # Now: the twin expires Events an hour after their lastTimestamp, in a sweep that could
            # fall between this create and the describe (a fixed date made the test flaky).
            "lastTimestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
    )
    events = kubectl("get", "events", "-n", ns).stdout.splitlines()
    assert events[0].split() == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert events[1].split()[1:5] == ["Normal", "WorkerCreated", "clusterorder/o", "worker"]
    assert "WorkerCreated" in kubectl("get", "ev", "-A").stdout
    assert "WorkerCreated" in kubectl("events", "-n", ns).stdout
    described = kubectl("describe", "clusterorder", "o", "-n", ns).stdout
    assert "Events:" in described and "worker o-worker-0 created" in described


def test_server_side_validation_errors_reach_the_user(kubectl: Kubectl, ns: str) -> None:
    bad = sample_cluster_order("bad")
    bad["spec"]["nodeRequests"][0]["numberOfNodes"] = "two"
    result = kubectl("apply", "-n", ns, "-f", "-", stdin=yaml.safe_dump(bad), check=False)
    assert result.returncode != 0 and "spec.nodeRequests[0].numberOfNodes" in result.stderr
    unknown = sample_cluster_order("unknown")
    unknown["spec"]["bogusField"] = 1
    result = kubectl("apply", "-n", ns, "-f", "-", stdin=yaml.safe_dump(unknown), check=False)
    assert result.returncode != 0 and 'unknown field "spec.bogusField"' in result.stderr


def test_get_watch(
    kubectl_args: list[str], kubectl_env: dict[str, str], kubectl: Kubectl, custom, ns: str
) -> None:
    group, version, plural = "osac.openshift.io", "v1alpha1", "clusterorders"
    custom.create_namespaced_custom_object(group, version, ns, plural, sample_cluster_order("w"))
    process = subprocess.Popen(
        [*kubectl_args, "get", plural, "-n", ns, "-w", "--output-watch-events", "--request-timeout=90s"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=kubectl_env,
    )
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in process.stdout or []:
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    seen: list[str] = []

    def wait_line(word: str) -> None:
        deadline = time.monotonic() + 60
        while not any(word in line for line in seen):
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"kubectl get -w never printed {word!r}: {seen}"
            try:
                seen.append(lines.get(timeout=remaining))
            except queue.Empty:
                pass

    try:
        wait_line("ADDED")
        custom.patch_namespaced_custom_object_status(
            group, version, ns, plural, "w", {"status": {"phase": "Ready"}}
        )
        wait_line("Ready")
        custom.delete_namespaced_custom_object(group, version, ns, plural, "w")
        wait_line("DELETED")
    finally:
        process.terminate()
        process.wait(30)
    events = [line.split()[0] for line in seen if line.split() and line.split()[0] != "EVENT"]
    assert events == ["ADDED", "MODIFIED", "DELETED"]

    # --request-timeout bounds a watch: kubectl returns by itself.
    done = kubectl("get", "agents", "-n", ns, "-w", "--request-timeout=2s")
    assert done.returncode == 0


def test_explain_reads_the_openapi_schemas(kubectl: Kubectl) -> None:
    explained = kubectl("explain", "clusterorders.spec.nodeRequests").stdout
    assert "numberOfNodes" in explained and "bareMetal" in explained
