"""docker-compose.temporal.yml: the services, images, ports, health checks and start order of a
PostgreSQL-backed Temporal with the Web UI, and our search attributes registered at start."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from temporalio.common import SearchAttributeIndexedValueType

from workflows.search_attributes import ALL_SEARCH_ATTRIBUTES

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.temporal.yml"
TYPE_NAMES = {SearchAttributeIndexedValueType.KEYWORD: "Keyword", SearchAttributeIndexedValueType.INT: "Int"}


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    document = yaml.safe_load(COMPOSE.read_text())
    result: dict[str, Any] = document["services"]
    assert set(document["volumes"]) == {"temporal-postgres"}
    return result


def _image(service: dict[str, Any]) -> str:
    return re.sub(r"\$\{[A-Z_]+:-([^}]+)\}", r"\1", service["image"])


def _depends(service: dict[str, Any]) -> dict[str, str]:
    return {name: spec["condition"] for name, spec in service.get("depends_on", {}).items()}


def test_services_images_and_ports(services: dict[str, Any]) -> None:
    assert set(services) == {"postgresql", "temporal-schema", "temporal", "temporal-setup", "temporal-ui"}
    images = {name: _image(service).rsplit(":", 1)[0] for name, service in services.items()}
    assert images == {
        "postgresql": "postgres",
        "temporal-schema": "temporalio/admin-tools",
        "temporal": "temporalio/server",
        "temporal-setup": "temporalio/admin-tools",
        "temporal-ui": "temporalio/ui",
    }
    for service in services.values():
        assert re.search(r":\d", _image(service)), "every image is pinned to a version"
    published = {name: service.get("ports", []) for name, service in services.items()}
    assert published == {
        "postgresql": [],
        "temporal-schema": [],
        "temporal": ["7233:7233"],
        "temporal-setup": [],
        "temporal-ui": ["8080:8080"],
    }
    assert services["temporal"]["environment"]["DB"] == "postgres12"
    assert services["temporal"]["environment"]["POSTGRES_SEEDS"] == "postgresql"
    assert services["postgresql"]["volumes"] == ["temporal-postgres:/var/lib/postgresql/data"]


def test_health_checks_and_start_order(services: dict[str, Any]) -> None:
    for name in ("postgresql", "temporal", "temporal-ui"):
        check = services[name]["healthcheck"]
        assert check["test"][0] in ("CMD", "CMD-SHELL") and check["retries"] >= 3, name
    assert "pg_isready" in " ".join(services["postgresql"]["healthcheck"]["test"])
    assert "7233" in services["temporal"]["healthcheck"]["test"]
    assert _depends(services["temporal-schema"]) == {"postgresql": "service_healthy"}
    assert _depends(services["temporal"]) == {"temporal-schema": "service_completed_successfully"}
    assert _depends(services["temporal-setup"]) == {"temporal": "service_healthy"}
    assert _depends(services["temporal-ui"]) == {"temporal": "service_healthy"}
    assert services["temporal-ui"]["environment"]["TEMPORAL_ADDRESS"] == "temporal:7233"
    assert services["temporal-setup"]["environment"]["TEMPORAL_ADDRESS"] == "temporal:7233"


def test_our_search_attributes_are_registered_at_start(services: dict[str, Any]) -> None:
    setup = services["temporal-setup"]
    declared = dict(item.split(":") for item in setup["environment"]["OSAC_SEARCH_ATTRIBUTES"].split())
    assert declared == {key.name: TYPE_NAMES[key.indexed_value_type] for key in ALL_SEARCH_ATTRIBUTES}
    script = setup["command"][0]
    assert "temporal operator search-attribute create" in script
    assert "temporal operator namespace create" in script


@pytest.mark.parametrize("name", ["temporal-schema", "temporal-setup"])
def test_one_shot_scripts_are_valid_shell(services: dict[str, Any], name: str) -> None:
    service = services[name]
    assert service["entrypoint"] == ["/bin/sh", "-c"]
    # Compose turns $$ into $ before the container's shell sees the script.
    script = service["command"][0].replace("$$", "$")
    assert script.startswith("set -eu")
    sh = shutil.which("sh")
    assert sh is not None
    subprocess.run([sh, "-n", "-c", script], check=True, timeout=30)
