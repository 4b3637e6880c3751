"""Kubeconfig files for clients of the hub twin (the kubernetes Python client and kubectl)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml


def kubeconfig(
    server_url: str,
    token: str,
    *,
    namespace: str = "default",
    name: str = "osac-hub",
    ca_file: Path | None = None,
) -> dict[str, Any]:
    cluster: dict[str, Any] = {"server": server_url}
    if ca_file is not None:
        cluster["certificate-authority-data"] = base64.b64encode(Path(ca_file).read_bytes()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": f"{name}-user", "user": {"token": token}}],
        "contexts": [
            {"name": name, "context": {"cluster": name, "user": f"{name}-user", "namespace": namespace}}
        ],
        "current-context": name,
        "preferences": {},
    }


def write_kubeconfig(
    path: Path | str,
    server_url: str,
    token: str,
    *,
    namespace: str = "default",
    name: str = "osac-hub",
    ca_file: Path | None = None,
) -> Path:
    """Write a kubeconfig (mode 0600: it holds a token) whose current context talks to `server_url`.

    kubectl only sends the token over https: pass the server's CA (`ca_file`) for an https URL.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600, exist_ok=True)
    content = kubeconfig(server_url, token, namespace=namespace, name=name, ca_file=ca_file)
    path.write_text(yaml.safe_dump(content, sort_keys=False))
    return path
