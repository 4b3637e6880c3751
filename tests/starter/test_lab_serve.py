"""`osac-workers lab serve` runs both twins: the hub (https, admin kubeconfig, extra CRDs, the
assisted-service / HyperShift behaviour) beside the fulfillment twin, and stops cleanly."""

from __future__ import annotations

import json
import shutil
import signal
import ssl
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import kubernetes
import pytest
import yaml

from lab.fulfillment.testing import lab_serving

CLI = str(Path(sys.executable).parent / "osac-workers")
WIDGET_CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  names: {kind: Widget, listKind: WidgetList, plural: widgets, singular: widget}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec: {type: object, properties: {size: {type: integer, minimum: 1}}}
"""

Served = tuple[Path, "subprocess.Popen[str]"]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    state = tmp_path / "lab"
    crds = tmp_path / "crds"
    crds.mkdir()
    (crds / "widgets.yaml").write_text(WIDGET_CRD)
    with lab_serving(
        state,
        "--state-dir",
        str(state),
        "--fulfillment-port",
        "0",
        "--hub-port",
        "0",
        "--hosts",
        "2",
        "--timing",
        "zero",
        "--crd-dir",
        str(crds),
    ) as proc:
        yield state, proc


def test_serve_runs_the_hub_twin_with_a_kubeconfig_and_stops_cleanly(served: Served) -> None:
    state, proc = served
    endpoints = json.loads((state / "endpoints.json").read_text())
    assert set(endpoints) == {"fulfillment_url", "hub_url"}
    hub_url = endpoints["hub_url"]
    assert hub_url.startswith("https://127.0.0.1:")
    kubeconfig = state / "kubeconfig"
    assert stat.S_IMODE(kubeconfig.stat().st_mode) == 0o600

    # The official client with nothing but the kubeconfig (token + the hub's CA).
    api = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
    try:
        names = [
            n.metadata.name for n in kubernetes.client.CoreV1Api(api).list_namespace().items if n.metadata
        ]
        assert "default" in names
        custom = kubernetes.client.CustomObjectsApi(api)
        orders: Any = custom.list_cluster_custom_object("osac.openshift.io", "v1alpha1", "clusterorders")
        assert orders["items"] == []
        # The extra CRD is served and enforced.
        body = {
            "apiVersion": "example.com/v1",
            "kind": "Widget",
            "metadata": {"name": "w"},
            "spec": {"size": 0},
        }
        with pytest.raises(kubernetes.client.ApiException) as invalid:
            custom.create_namespaced_custom_object("example.com", "v1", "default", "widgets", body)
        assert invalid.value.status == 422
        body["spec"] = {"size": 2}
        custom.create_namespaced_custom_object("example.com", "v1", "default", "widgets", body)
    finally:
        api.close()

    # The assisted-service / agent behaviour is mounted (its fault knobs answer).
    with httpx.Client(
        verify=ssl.create_default_context(cafile=str(state / "hub-tls.crt")), timeout=20
    ) as http:
        token = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
        faults = http.get(f"{hub_url}/lab/v1/faults/agents", headers={"Authorization": f"Bearer {token}"})
        assert faults.status_code == 200, faults.text

    if shutil.which("kubectl"):
        result = subprocess.run(
            ["kubectl", "--kubeconfig", str(kubeconfig), "get", "widgets", "-o", "name"],
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin", "HOME": str(state)},
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "widget.example.com/w"

    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert hub_url in out
    assert not (state / "endpoints.json").exists()
