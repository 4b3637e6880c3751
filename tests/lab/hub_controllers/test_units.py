"""Pure pieces: the ignition format, tokens, fault draws, selectors, the Agent condition tables."""

from __future__ import annotations

import json

import pytest

from lab.hub_controllers.agent_status import HostView, render_status
from lab.hub_controllers.assisted_images import pull_secret_error
from lab.hub_controllers.constants import HostStage, HostState
from lab.hub_controllers.faults import (
    AgentFaults,
    FaultBook,
    FaultKind,
    FaultTarget,
    InstallError,
    normalise_mac,
)
from lab.hub_controllers.ignition import (
    DiscoveryAgentConfig,
    decode_data_url,
    extract_agent_config,
    load_ignition,
    render_discovery_ignition,
)
from lab.hub_controllers.selectors import selector_matches
from lab.hub_controllers.testing import PULL_SECRET, SSH_KEY
from lab.hub_controllers.tokens import TokenAudience, TokenSigner

IE_ID = "0b0c6a44-5a3f-5f2f-9d3c-4c3b2a1f0e9d"


def _ignition(token: str = "tok.en.sig") -> str:
    return render_discovery_ignition(
        service_url="http://hub.example:6443",
        infra_env_id=IE_ID,
        agent_token=token,
        pull_secret=PULL_SECRET,
        ssh_authorized_key=SSH_KEY,
    )


def test_discovery_ignition_is_a_realistic_ignition_v3_document() -> None:
    text = _ignition()
    document = json.loads(text)
    assert document["ignition"]["version"].startswith("3.")
    # About 15 KB like the real one, and far below the 48 KB warning / 64 KiB user_data limit.
    assert 10_000 < len(text.encode()) < 48_000
    units = {u["name"]: u for u in document["systemd"]["units"]}
    assert {"agent.service", "selinux.service", "multipathd.service"} <= units.keys()
    files = {f["path"]: f for f in document["storage"]["files"]}
    assert all(f["contents"]["source"].startswith("data:") for f in files.values())
    assert decode_data_url(files["/root/.docker/config.json"]["contents"]["source"]) == PULL_SECRET
    assert document["passwd"]["users"][0]["sshAuthorizedKeys"] == [SSH_KEY]


def test_agent_config_is_read_back_from_the_agent_unit() -> None:
    document = load_ignition(_ignition("my.agent.token"))
    assert document is not None
    config = extract_agent_config(document)
    assert config == DiscoveryAgentConfig("http://hub.example:6443", IE_ID, "my.agent.token", insecure=True)
    assert (
        config.registration_url == f"http://hub.example:6443/api/assisted-install/v2/infra-envs/{IE_ID}/hosts"
    )


@pytest.mark.parametrize(
    "user_data",
    [
        "",
        "#cloud-config\nruncmd: [reboot]\n",
        "{not json",
        json.dumps({"ignition": {"version": "2.2.0"}, "systemd": {"units": []}}),
        json.dumps({"ignition": {"version": "3.4.0"}}),
        json.dumps({"ignition": {"version": "3.1.0"}, "systemd": {"units": [{"name": "agent.service"}]}}),
    ],
)
def test_anything_but_a_discovery_ignition_carries_no_agent_config(user_data: str) -> None:
    document = load_ignition(user_data)
    assert document is None or extract_agent_config(document) is None


def test_tokens_name_one_infra_env_and_one_audience() -> None:
    signer = TokenSigner(b"k1")
    token = signer.issue(IE_ID, TokenAudience.AGENT)
    assert signer.verify(token, IE_ID, TokenAudience.AGENT)
    assert not signer.verify(token, IE_ID, TokenAudience.IMAGE)
    assert not signer.verify(token, "another-infra-env", TokenAudience.AGENT)
    assert not TokenSigner(b"k2").verify(token, IE_ID, TokenAudience.AGENT)
    assert not signer.verify(token[:-2] + "xx", IE_ID, TokenAudience.AGENT)
    assert not signer.verify(None, IE_ID, TokenAudience.AGENT)


def test_fault_draws_are_reproducible_and_target_macs_or_agents() -> None:
    config = AgentFaults(
        seed=42,
        never_register=FaultTarget(macs=["0A-00-00-00-00-01"]),
        install_error=InstallError(rate=0.5, stage=HostStage.INSTALLING),
        duplicate_mac=FaultTarget(agents=["host-9"]),
    )
    book = FaultBook(config)
    assert book.decide(FaultKind.NEVER_REGISTER, "host-1", ["0a:00:00:00:00:01"])
    assert not book.decide(FaultKind.NEVER_REGISTER, "host-1", ["0a:00:00:00:00:02"])
    assert book.decide(FaultKind.DUPLICATE_MAC, "host-9", [])
    assert not book.decide(FaultKind.SLOW_REGISTRATION, "host-9", [])
    first = [book.decide(FaultKind.INSTALL_ERROR, f"h{i}") for i in range(40)]
    book.replace(config)
    assert [book.decide(FaultKind.INSTALL_ERROR, f"h{i}") for i in range(40)] == first
    assert 0 < sum(first) < 40
    assert normalise_mac("0A00.0000.0001") == "0a:00:00:00:00:01"


def test_selectors_match_labels_and_expressions_and_never_everything() -> None:
    labels = {"osac.openshift.io/clusterorder": "o1", "osac.openshift.io/resource_class": "bm"}
    assert selector_matches({"matchLabels": {"osac.openshift.io/clusterorder": "o1"}}, labels)
    assert not selector_matches({"matchLabels": {"osac.openshift.io/clusterorder": "o2"}}, labels)
    expression = {"key": "osac.openshift.io/resource_class", "operator": "In", "values": ["bm", "gpu"]}
    assert selector_matches({"matchExpressions": [expression]}, labels)
    assert not selector_matches({"matchExpressions": [{**expression, "operator": "NotIn"}]}, labels)
    assert not selector_matches({}, labels)
    assert not selector_matches(None, labels)


def _conditions(view: HostView) -> dict[str, tuple[str, str]]:
    status = render_status({}, view)
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_condition_tables_follow_the_real_service() -> None:
    unbound = _conditions(HostView(HostState.KNOWN_UNBOUND, approved=True, bound=False))
    assert unbound["Bound"] == ("False", "Unbound")
    assert unbound["Validated"] == ("True", "ValidationsPassing")
    assert unbound["Connected"] == ("True", "AgentIsConnected")
    assert unbound["RequirementsMet"] == ("True", "AgentIsReady")
    assert unbound["Installed"] == ("False", "InstallationNotStarted")

    done = _conditions(HostView(HostState.ADDED_TO_EXISTING_CLUSTER, approved=True, bound=True))
    assert done["Installed"] == ("True", "InstallationCompleted")
    assert done["Bound"] == ("True", "Bound")

    released = _conditions(HostView(HostState.UNBINDING_PENDING_USER_ACTION, approved=True, bound=False))
    assert released["Bound"] == ("False", "UnbindingPendingUserAction")
    assert released["Validated"][0] == "False"  # never claimable again before a reboot

    failed = render_status({}, HostView(HostState.ERROR, True, True, stage=HostStage.WRITING_IMAGE_TO_DISK))
    assert failed["progress"]["currentStage"] == HostStage.WRITING_IMAGE_TO_DISK.value
    assert _conditions(HostView(HostState.ERROR, True, True))["Installed"] == ("False", "InstallationFailed")
    assert _conditions(HostView(HostState.DISCOVERING_UNBOUND, True, False))["Validated"][0] == "Unknown"


@pytest.mark.parametrize(
    ("auth", "refused"),
    [
        ("dXNlcjpwYXNz", False),
        ("dXNl\ncjpw\r\nYXNz", False),  # Go's decoder, which assisted-service uses, skips line breaks
        ("not base64!", True),
    ],
)
def test_the_pull_secret_check_reads_base64_as_assisted_service_does(auth: str, refused: bool) -> None:
    problem = pull_secret_error(json.dumps({"auths": {"quay.io": {"auth": auth}}}))
    assert (problem is not None) == refused, problem
