"""assisted-service on the hub: InfraEnv boot artifacts, the ignition download, agent registration."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import httpx

from lab.hub_controllers.constants import AGENT_AUTH_HEADER, ASSISTED_API_PREFIX
from lab.hub_controllers.ignition import decode_data_url, extract_agent_config, load_ignition
from lab.hub_controllers.inventory import host_inventory
from lab.hub_controllers.resources import AGENTS, INFRA_ENVS, SECRETS
from lab.hub_controllers.testing import (
    PULL_SECRET,
    AgentHistory,
    Lab,
    agent_macs,
    condition,
    create_infra_env,
    create_pull_secret,
    fetch_ignition,
    infra_env_id_from,
    is_subsequence,
    macs_for,
    ready_infra_env,
    wait_state,
    wait_until,
)
from lab.hub_controllers.tokens import TokenAudience, TokenSigner


def _register(
    lab: Lab, infra_env_id: str, token: str | None, host_id: str, macs: tuple[str, ...]
) -> httpx.Response:
    headers = {AGENT_AUTH_HEADER: token} if token else {}
    return httpx.post(
        f"{lab.url}{ASSISTED_API_PREFIX}/infra-envs/{infra_env_id}/hosts",
        json={
            "host_id": host_id,
            "discovery_agent_version": "test",
            "inventory": host_inventory(host_id, macs),
        },
        headers=headers,
        timeout=30.0,
    )


def _agent_token(lab: Lab, infra_env: dict[str, Any]) -> tuple[str, str]:
    document = load_ignition(fetch_ignition(lab.client, infra_env))
    assert document is not None
    config = extract_agent_config(document)
    assert config is not None
    return config.infra_env_id, config.agent_token


def test_infra_env_gets_boot_artifacts_and_a_stable_id(lab: Lab, ns: str) -> None:
    infra_env = create_infra_env(lab.client, ns)
    status = infra_env["status"]
    ie_id = infra_env_id_from(infra_env)
    assert str(uuid.UUID(ie_id)) == ie_id
    assert status["bootArtifacts"]["discoveryIgnitionURL"].startswith(
        f"{lab.url}{ASSISTED_API_PREFIX}/infra-envs/{ie_id}/downloads/files?file_name=discovery.ign&api_key="
    )
    assert f"/images/{ie_id}?" in status["isoDownloadURL"]
    assert status["agentLabelSelector"] == {
        "matchLabels": {"infraenvs.agent-install.openshift.io": "infraenv"}
    }
    cond = condition(infra_env, "ImageCreated")
    assert cond is not None and cond["reason"] == "ImageCreated"
    # The id survives another reconcile (a spec edit) unchanged.
    lab.client.patch(INFRA_ENVS, ns, "infraenv", {"metadata": {"labels": {"touched": "yes"}}})
    again = wait_until(
        lambda: (o := lab.client.get(INFRA_ENVS, ns, "infraenv")) and o["metadata"].get("labels") and o,
        "the label edit",
    )
    assert infra_env_id_from(again) == ie_id


def test_missing_pull_secret_fails_the_image_until_it_appears(lab: Lab, ns: str) -> None:
    create_infra_env(lab.client, ns, with_secret=False, wait=False)

    def failed() -> dict[str, str] | None:
        cond = condition(lab.client.get(INFRA_ENVS, ns, "infraenv"), "ImageCreated")
        return cond if cond and cond["status"] == "False" else None

    cond = wait_until(failed, "ImageCreated=False")
    assert cond["reason"] == "ImageCreationError"
    assert "pull-secret" in cond["message"]
    assert "bootArtifacts" not in (lab.client.get(INFRA_ENVS, ns, "infraenv") or {}).get("status", {})

    create_pull_secret(lab.client, ns)
    ready = wait_until(
        lambda: ready_infra_env(lab.client, ns, "infraenv"), "recovery after the Secret appears"
    )
    assert ready["status"]["bootArtifacts"]["discoveryIgnitionURL"]


def test_a_refused_pull_secret_is_quoted_in_the_image_condition(lab: Lab, ns: str) -> None:
    """As assisted-service: GetValidPullSecret wraps the validation error with the secret's data, and
    the InfraEnv controller writes "Failed to create image: <error>" into ImageCreated."""
    refused = json.dumps({"auths": {"quay.io": {"email": "robot@example.com", "password": "hunter2-secret"}}})
    lab.client.create(
        SECRETS,
        {
            "metadata": {"name": "pull-secret", "namespace": ns},
            "type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": base64.b64encode(refused.encode()).decode()},
        },
    )
    create_infra_env(lab.client, ns, with_secret=False, wait=False)

    def refused_condition() -> dict[str, str] | None:
        cond = condition(lab.client.get(INFRA_ENVS, ns, "infraenv"), "ImageCreated")
        return cond if cond and cond["status"] == "False" and "hunter2" in cond["message"] else None

    cond = wait_until(refused_condition, "ImageCreated=False quoting the pull secret")
    assert cond["reason"] == "ImageCreationError"
    assert cond["message"] == (
        f"Failed to create image: invalid pull secret data in secret pull-secret {refused}: "
        """invalid pull secret: "quay.io" JSON-object requires either 'auth' or 'credsStore' field"""
    )
    assert "bootArtifacts" not in (lab.client.get(INFRA_ENVS, ns, "infraenv") or {}).get("status", {})

    # A usable secret in its place: the image is built.
    valid = base64.b64encode(PULL_SECRET.encode()).decode()
    lab.client.patch(SECRETS, ns, "pull-secret", {"data": {".dockerconfigjson": valid}})
    ready = wait_until(lambda: ready_infra_env(lab.client, ns, "infraenv"), "recovery with a valid secret")
    assert ready["status"]["bootArtifacts"]["discoveryIgnitionURL"]


def test_ignition_is_served_with_the_agent_config_and_pull_secret(lab: Lab, ns: str) -> None:
    infra_env = create_infra_env(lab.client, ns)
    text = fetch_ignition(lab.client, infra_env)
    document = load_ignition(text)
    assert document is not None
    config = extract_agent_config(document)
    assert config is not None
    assert config.service_url == lab.url
    assert config.infra_env_id == infra_env_id_from(infra_env)
    assert TokenSigner(b"test-signing-key").verify(
        config.agent_token, config.infra_env_id, TokenAudience.AGENT
    )
    files = {f["path"]: f["contents"]["source"] for f in document["storage"]["files"]}
    assert decode_data_url(files["/root/.docker/config.json"]) == PULL_SECRET


def test_ignition_download_needs_the_signed_url(lab: Lab, ns: str) -> None:
    infra_env = create_infra_env(lab.client, ns)
    ie_id = infra_env_id_from(infra_env)
    base = f"{lab.url}{ASSISTED_API_PREFIX}/infra-envs"
    no_key = httpx.get(f"{base}/{ie_id}/downloads/files", params={"file_name": "discovery.ign"}, timeout=30)
    assert no_key.status_code == 401
    forged = TokenSigner(b"someone-else").issue(ie_id, TokenAudience.IMAGE)
    wrong = httpx.get(
        f"{base}/{ie_id}/downloads/files",
        params={"file_name": "discovery.ign", "api_key": forged},
        timeout=30,
    )
    assert wrong.status_code == 401
    unknown = httpx.get(
        f"{base}/{uuid.uuid4()}/downloads/files", params={"file_name": "discovery.ign"}, timeout=30
    )
    assert unknown.status_code == 404
    assert unknown.json()["kind"] == "Error"


def test_registration_creates_the_agent_and_discovers_it(lab: Lab, ns: str) -> None:
    infra_env = create_infra_env(lab.client, ns, agent_labels={"osac.openshift.io/clusterorder": "o1"})
    ie_id, token = _agent_token(lab, infra_env)
    history = AgentHistory(lab, ns).start()
    try:
        macs = macs_for(1)
        response = _register(lab, ie_id, token, "host-a", macs)
        assert response.status_code == 201, response.text
        assert response.json()["status"] == "discovering-unbound"
        agent = wait_state(lab.client, ns, "host-a", "known-unbound")
        wait_until(lambda: "known-unbound" in history.states("host-a"), "the watch to see known-unbound")
        assert is_subsequence(["discovering-unbound", "known-unbound"], history.states("host-a"))
    finally:
        history.stop()
    labels = agent["metadata"]["labels"]
    assert labels["infraenvs.agent-install.openshift.io"] == "infraenv"
    assert labels["osac.openshift.io/clusterorder"] == "o1"
    assert agent["spec"] == {"approved": False, "role": ""}
    assert agent_macs(agent) == set(macs)
    assert condition(agent, "Bound")["reason"] == "Unbound"  # type: ignore[index]
    assert condition(agent, "Validated")["status"] == "True"  # type: ignore[index]
    assert condition(agent, "RequirementsMet")["reason"] == "AgentIsNotApproved"  # type: ignore[index]
    assert agent["status"]["role"] == "auto-assign"


def test_auto_approve_approves_new_agents(lab: Lab, ns: str) -> None:
    infra_env = create_infra_env(lab.client, ns, auto_approve=True)
    ie_id, token = _agent_token(lab, infra_env)
    assert _register(lab, ie_id, token, "host-b", macs_for(2)).status_code == 201
    agent = wait_state(lab.client, ns, "host-b", "known-unbound")
    assert agent["spec"]["approved"] is True
    assert condition(agent, "RequirementsMet")["reason"] == "AgentIsReady"  # type: ignore[index]


def test_registration_with_a_bad_token_or_unknown_infra_env_registers_nothing(lab: Lab, ns: str) -> None:
    infra_env = create_infra_env(lab.client, ns)
    other = create_infra_env(lab.client, ns, "other", with_secret=False)
    ie_id, token = _agent_token(lab, infra_env)
    _, other_token = _agent_token(lab, other)
    image_token = TokenSigner(b"test-signing-key").issue(ie_id, TokenAudience.IMAGE)

    assert _register(lab, ie_id, None, "host-x1", macs_for(3)).status_code == 401
    assert _register(lab, ie_id, "garbage", "host-x2", macs_for(4)).status_code == 401
    assert _register(lab, ie_id, other_token, "host-x3", macs_for(5)).status_code == 401
    assert _register(lab, ie_id, image_token, "host-x4", macs_for(6)).status_code == 401
    missing = str(uuid.uuid4())
    valid_for_missing = TokenSigner(b"test-signing-key").issue(missing, TokenAudience.AGENT)
    assert _register(lab, missing, valid_for_missing, "host-x5", macs_for(7)).status_code == 404
    assert _register(lab, ie_id, token, "Not_A_Name", macs_for(8)).status_code == 400
    # A good registration afterwards proves the endpoint works: only it created an Agent.
    assert _register(lab, ie_id, token, "host-ok", macs_for(9)).status_code == 201
    names = {a["metadata"]["name"] for a in lab.client.list(AGENTS, ns)}
    assert names == {"host-ok"}
