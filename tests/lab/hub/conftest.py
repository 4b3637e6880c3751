"""Fixtures for the hub twin's conformance tests: one https hub for the session (the kubernetes
client and kubectl both talk to it), a fresh namespace per test. Helpers and sample objects live in
lab.hub.testing (importable; this folder is not a package)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import kubernetes
import pytest

from lab.hub.testing import RunningHub, running_hub, shared_crd_dir


@pytest.fixture(scope="session")
def real_crds() -> Path:
    path = shared_crd_dir()
    if path is None:
        pytest.skip("the real CRDs (shared/crds) are not on this machine")
    return path


@pytest.fixture(scope="session")
def hub(tmp_path_factory: pytest.TempPathFactory, real_crds: Path) -> Iterator[RunningHub]:
    """Our CRDs plus the real ones (same kinds must satisfy both), served over https."""
    with running_hub(tmp_path_factory.mktemp("hub"), crd_dirs=[real_crds], tls=True) as running:
        yield running


@pytest.fixture(scope="session")
def api_client(hub: RunningHub) -> Iterator[Any]:
    client = hub.api_client()
    yield client
    client.close()


@pytest.fixture(scope="session")
def core(api_client: Any) -> Any:
    return kubernetes.client.CoreV1Api(api_client)


@pytest.fixture(scope="session")
def custom(api_client: Any) -> Any:
    return kubernetes.client.CustomObjectsApi(api_client)


@pytest.fixture
def ns(core: Any) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    try:
        core.delete_namespace(name)
    except kubernetes.client.ApiException as exc:
        if exc.status != 404:
            raise


@pytest.fixture(scope="session")
def http(hub: RunningHub) -> Iterator[httpx.Client]:
    """A raw client (admin token) for what the official client hides: headers, media types, Status bodies."""
    with httpx.Client(base_url=hub.url, verify=hub.verify, headers=hub.headers(), timeout=30) as client:
        yield client
