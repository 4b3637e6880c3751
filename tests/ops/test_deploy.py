"""deploy/: rendered with `kubectl kustomize`, then checked: least-privilege RBAC per process,
Deployments with probes, requests, a grace period above the worker's graceful shutdown, Secrets
mounted where the settings point, and only environment variables the processes understand."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from worker.settings import CodecSettings, Settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"

WORKER_RULES = {
    ("agent-install.openshift.io", "infraenvs"): {"create", "get", "list", "watch", "patch", "delete"},
    ("agent-install.openshift.io", "agents"): {"get", "list", "watch", "patch", "delete"},
    ("hypershift.openshift.io", "nodepools"): {"get", "list", "watch", "patch"},
    ("cluster.x-k8s.io", "machines"): {"get", "list", "watch", "patch"},
    ("capi-provider.agent-install.openshift.io", "agentmachines"): {"list"},
    ("osac.openshift.io", "clusterorders"): {"get", "list", "watch", "patch"},
    ("osac.openshift.io", "clusterorders/status"): {"get", "patch", "update"},
    # blockOwnerDeletion on the InfraEnv's and Secret's owner reference (OpenShift admission).
    ("osac.openshift.io", "clusterorders/finalizers"): {"update"},
    ("", "secrets"): {"create", "get", "patch", "delete"},
    ("", "events"): {"create", "patch"},
}
CONTROLLER_RULES = {
    ("osac.openshift.io", "clusterorders"): {"get", "list", "watch", "patch"},
    ("osac.openshift.io", "clusterorders/status"): {"get", "patch", "update"},
    ("", "events"): {"create", "patch"},
}
# What temporalio.envconfig reads from the environment.
TEMPORAL_ENV = {
    "TEMPORAL_ADDRESS",
    "TEMPORAL_NAMESPACE",
    "TEMPORAL_API_KEY",
    "TEMPORAL_TLS",
    "TEMPORAL_TLS_CLIENT_CERT_PATH",
    "TEMPORAL_TLS_CLIENT_KEY_PATH",
    "TEMPORAL_TLS_SERVER_CA_CERT_PATH",
    "TEMPORAL_TLS_SERVER_NAME",
    "TEMPORAL_TLS_DISABLE_HOST_VERIFICATION",
    "TEMPORAL_PROFILE",
    "TEMPORAL_CONFIG_FILE",
}


def _render(directory: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl (with kustomize) is needed to render deploy/")
    out = subprocess.run(
        [kubectl, "kustomize", str(directory)], check=True, capture_output=True, text=True, timeout=120
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    return _render(DEPLOY)


def _find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def _rules(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert not rule.get("resourceNames") and not rule.get("nonResourceURLs")
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    return granted


@pytest.mark.parametrize(
    ("process", "expected"), [("worker", WORKER_RULES), ("controller", CONTROLLER_RULES)]
)
def test_rbac_is_exactly_what_each_process_needs(
    rendered: list[dict[str, Any]], process: str, expected: dict[tuple[str, str], set[str]]
) -> None:
    name = f"osac-workers-{process}"
    granted = _rules(_find(rendered, "ClusterRole", name))
    assert granted == expected
    for verbs in granted.values():
        assert "*" not in verbs
    binding = _find(rendered, "ClusterRoleBinding", name)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": name,
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": "osac-workers"}]
    account = _find(rendered, "ServiceAccount", name)
    assert account["metadata"]["namespace"] == "osac-workers"
    deployment = _find(rendered, "Deployment", name)
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == name
    # Nothing else in deploy/ grants anything.
    roles = [d for d in rendered if d["kind"] in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")]
    assert len(roles) == 4


def _environment(docs: list[dict[str, Any]], deployment: dict[str, Any]) -> dict[str, str]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        config = _find(docs, "ConfigMap", source["configMapRef"]["name"])
        env.update(config["data"])
    for item in container.get("env", []):
        env[item["name"]] = item.get("value", "<from secret>")
    return env


def _assert_secrets_readable_by_the_pod_user(pod: dict[str, Any]) -> None:
    """runAsNonRoot with a UID the platform picks (OpenShift's restricted SCC assigns one, and an
    fsGroup, from the namespace's range and refuses a fixed one): a Secret's files belong to root,
    so 0400 would lock the process out of its own token, TLS key and codec keys. They are readable
    by any user of the pod's one container instead; no fixed fsGroup is asked for."""
    context = pod["securityContext"]
    assert context["runAsNonRoot"] is True
    assert "fsGroup" not in context
    secrets = [v for v in pod["volumes"] if "secret" in v]
    assert secrets
    for volume in secrets:
        assert volume["secret"]["defaultMode"] == 0o444, volume["name"]


def _known_variable(name: str) -> bool:
    settings = {f"OSAC_{field.upper()}" for field in Settings.model_fields} | {"KUBECONFIG"}
    codec = {f"OSAC_CODEC_{field.upper()}" for field in CodecSettings.model_fields}
    return name in settings | codec | TEMPORAL_ENV or name.startswith("OTEL_")


@pytest.mark.parametrize("process", ["worker", "controller"])
def test_deployments_are_operable(rendered: list[dict[str, Any]], process: str) -> None:
    deployment = _find(rendered, "Deployment", f"osac-workers-{process}")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"].startswith("quay.io/osac/osac-workers:")
    assert container["command"] == ["osac-workers"] and container["args"] == [process]
    env = _environment(rendered, deployment)
    unknown = sorted(name for name in env if not _known_variable(name))
    assert unknown == []

    # Probes on the health port the process serves (OSAC_HEALTH_BIND).
    health_port = int(env["OSAC_HEALTH_BIND"].rsplit(":", 1)[1])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["health"] == health_port
    assert ports["metrics"] == int(env["OSAC_METRICS_BIND"].rsplit(":", 1)[1])
    for probe, path in (
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ):
        assert container[probe]["httpGet"] == {"path": path, "port": "health"}, probe

    requests = container["resources"]["requests"]
    assert requests["cpu"] and requests["memory"] and container["resources"]["limits"]["memory"]
    assert pod["terminationGracePeriodSeconds"] > float(env["OSAC_GRACEFUL_SHUTDOWN_SECONDS"])
    _assert_secrets_readable_by_the_pod_user(pod)
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"] is True

    # Temporal mTLS material comes from a Secret mounted where envconfig is told to look.
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["temporal-tls"]["secret"]["secretName"] == "osac-temporal-tls"
    for variable in (
        "TEMPORAL_TLS_CLIENT_CERT_PATH",
        "TEMPORAL_TLS_CLIENT_KEY_PATH",
        "TEMPORAL_TLS_SERVER_CA_CERT_PATH",
    ):
        assert os.path.dirname(env[variable]) == mounts["temporal-tls"]
    assert env["TEMPORAL_TLS"] == "true"


@pytest.mark.parametrize("process", ["worker", "controller"])
def test_bmaas_token_and_ca_are_mounted_where_the_settings_point(
    rendered: list[dict[str, Any]], process: str
) -> None:
    """Both processes call BMaaS: the worker's activities, and the controller, which reads the
    instance-type catalog before it starts or changes an order and lists a deleting order's BMIs
    before it removes the finalizer. Without the token it could do neither."""
    deployment = _find(rendered, "Deployment", f"osac-workers-{process}")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = _environment(rendered, deployment)
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    token = Path(env["OSAC_FULFILLMENT_TOKEN_FILE"])
    assert str(token.parent) == mounts["fulfillment-token"]["mountPath"]
    assert mounts["fulfillment-token"]["readOnly"] is True
    secret = volumes["fulfillment-token"]["secret"]
    assert secret["secretName"] == "osac-fulfillment-token"
    # A mounted file, not an env var: rotation reaches the running process.
    assert not any("TOKEN" in item["name"] and "valueFrom" in item for item in container.get("env", []))
    # The private CA, once config.env's line is uncommented, is where that line points.
    config = (DEPLOY / "config.env").read_text().splitlines()
    (ca_line,) = [line for line in config if "OSAC_FULFILLMENT_CA_FILE=" in line]
    ca_file = Path(ca_line.split("=", 1)[1].strip())
    assert str(ca_file.parent) == mounts["fulfillment-ca"]["mountPath"]
    assert volumes["fulfillment-ca"]["configMap"] == {"name": "osac-fulfillment-ca", "optional": True}


def test_codec_component_mounts_the_key_ring_in_both_processes(tmp_path: Path) -> None:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    base = os.path.relpath(DEPLOY, overlay)
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {base}\ncomponents:\n  - {base}/components/codec\n"
    )
    docs = _render(overlay)
    for process in ("worker", "controller"):
        deployment = _find(docs, "Deployment", f"osac-workers-{process}")
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        keys_file = Path(_environment(docs, deployment)["OSAC_CODEC_KEYS_FILE"])
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert str(keys_file.parent) == mounts["codec-keys"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["codec-keys"]["secret"]["secretName"] == "osac-codec-keys"
        _assert_secrets_readable_by_the_pod_user(pod)
