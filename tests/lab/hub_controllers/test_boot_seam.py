"""The boot seam: a host runs its user data; only a discovery ignition of this hub registers it."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from lab.hub_controllers.agent_boot import AgentBootSeam, BootOutcome, agent_host_id
from lab.hub_controllers.faults import FaultBook
from lab.hub_controllers.ignition import DiscoveryAgentConfig, render_discovery_ignition
from lab.hub_controllers.resources import AGENTS, INFRA_ENVS
from lab.hub_controllers.testing import (
    PULL_SECRET,
    Lab,
    agent_macs,
    create_infra_env,
    fetch_ignition,
    infra_env_id_from,
    macs_for,
    wait_state,
    wait_until,
)
from lab.hub_controllers.timings import AgentTimings


def _outcome(lab: Lab, host_id: str, count: int = 1) -> list[BootOutcome]:
    records = wait_until(
        lambda: (r := lab.boot_seam.records_for(host_id)) and len(r) >= count and r,
        f"{count} boot record(s) of {host_id}",
    )
    return [r.outcome for r in records]


def test_a_host_booting_the_discovery_ignition_registers_with_its_macs(lab: Lab, ns: str) -> None:
    infra_env = create_infra_env(lab.client, ns)
    macs = macs_for(1, count=3)
    lab.boot("host-boot-1", macs, fetch_ignition(lab.client, infra_env))
    agent = wait_state(lab.client, ns, "host-boot-1", "known-unbound")
    assert agent_macs(agent) == set(macs)
    assert agent["metadata"]["labels"]["infraenvs.agent-install.openshift.io"] == "infraenv"
    assert _outcome(lab, "host-boot-1") == [BootOutcome.REGISTERED]


def test_garbage_or_foreign_user_data_registers_nothing(lab: Lab, ns: str) -> None:
    infra_env = create_infra_env(lab.client, ns)
    foreign = json.dumps({"ignition": {"version": "3.4.0"}, "systemd": {"units": [{"name": "sshd.service"}]}})
    cases = {
        "host-garbage": "\x00\x01 not an ignition",
        "host-cloudinit": "#cloud-config\n",
        "host-foreign": foreign,
    }
    for host_id, user_data in cases.items():
        lab.boot(host_id, macs_for(2), user_data)
    # A real discovery boot after them shows the seam works; the others left only their records.
    lab.boot("host-real", macs_for(3), fetch_ignition(lab.client, infra_env))
    wait_state(lab.client, ns, "host-real", "known-unbound")
    for host_id in cases:
        assert _outcome(lab, host_id) == [BootOutcome.NOT_DISCOVERY]
    assert [a["metadata"]["name"] for a in lab.client.list(AGENTS, ns)] == ["host-real"]


def test_an_ignition_whose_token_no_longer_matches_registers_nothing(lab: Lab, ns: str) -> None:
    infra_env = create_infra_env(lab.client, ns)
    stale = fetch_ignition(lab.client, infra_env)
    forged = render_discovery_ignition(
        service_url=lab.url,
        infra_env_id=infra_env_id_from(infra_env),
        agent_token="eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhZ2VudCJ9.forged",
        pull_secret=PULL_SECRET,
    )
    lab.boot("host-forged", macs_for(4), forged)
    assert _outcome(lab, "host-forged") == [BootOutcome.REJECTED]
    assert lab.boot_seam.records_for("host-forged")[0].status_code == 401

    # Re-creating the InfraEnv under the same name gives it a new id: the old ignition is dead.
    lab.client.delete(INFRA_ENVS, ns, "infraenv")
    wait_until(lambda: lab.client.get(INFRA_ENVS, ns, "infraenv") is None, "the InfraEnv to go")
    fresh = create_infra_env(lab.client, ns, with_secret=False)
    assert infra_env_id_from(fresh) != infra_env_id_from(infra_env)
    lab.boot("host-stale", macs_for(5), stale)
    assert _outcome(lab, "host-stale") == [BootOutcome.REJECTED]
    assert lab.boot_seam.records_for("host-stale")[0].status_code == 404
    assert lab.client.list(AGENTS, ns) == []


def test_a_pointer_ignition_that_merges_the_discovery_one_registers(lab: Lab, ns: str) -> None:
    """The common trick to stay under the user-data limit: a tiny ignition merging a remote one."""
    infra_env = create_infra_env(lab.client, ns)
    url = infra_env["status"]["bootArtifacts"]["discoveryIgnitionURL"]
    pointer = json.dumps({"ignition": {"version": "3.1.0", "config": {"merge": [{"source": url}]}}})
    lab.boot("host-pointer", macs_for(6), pointer)
    wait_state(lab.client, ns, "host-pointer", "known-unbound")

    inline = base64.b64encode(fetch_ignition(lab.client, infra_env).encode()).decode()
    data_pointer = json.dumps(
        {"ignition": {"version": "3.1.0", "config": {"replace": {"source": f"data:;base64,{inline}"}}}}
    )
    lab.boot("host-data-pointer", macs_for(7), data_pointer)
    wait_state(lab.client, ns, "host-data-pointer", "known-unbound")


def test_a_host_booting_again_re_registers_the_same_agent(lab: Lab, ns: str) -> None:
    infra_env = create_infra_env(lab.client, ns)
    ignition = fetch_ignition(lab.client, infra_env)
    macs = macs_for(8)
    lab.boot("host-again", macs, ignition)
    first = wait_state(lab.client, ns, "host-again", "known-unbound")
    lab.boot("host-again", macs, ignition)
    assert _outcome(lab, "host-again", count=2) == [BootOutcome.REGISTERED, BootOutcome.REGISTERED]
    agents = lab.client.list(AGENTS, ns)
    assert [a["metadata"]["name"] for a in agents] == ["host-again"]
    assert agents[0]["metadata"]["uid"] == first["metadata"]["uid"]


def test_host_ids_become_valid_agent_names() -> None:
    assert agent_host_id("host-001") == "host-001"
    odd = agent_host_id("Rack 7 / Slot 3")
    assert odd == agent_host_id("Rack 7 / Slot 3") and len(odd) == 36


def test_a_config_fetch_is_retried_like_ignition_until_the_server_answers() -> None:
    """A loaded lab answers late or with 503; Ignition (and so the twin's boot) keeps trying, and a
    definite answer (404) ends it at once."""
    hits: list[str] = []

    class Flaky(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            if self.path == "/missing":
                self.send_response(404)
            elif len([h for h in hits if h == self.path]) < 3:
                self.send_response(503)
            else:
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"merged config")
                return
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"

    async def fetch(path: str) -> str | None:
        return await AgentBootSeam._fetch(base + path, asyncio.get_running_loop().time() + 60)

    try:
        assert asyncio.run(fetch("/config")) == "merged config"
        assert hits.count("/config") == 3
        assert asyncio.run(fetch("/missing")) is None
        assert hits.count("/missing") == 1
    finally:
        server.shutdown()


def _registration_service(
    handler: type[BaseHTTPRequestHandler],
) -> tuple[ThreadingHTTPServer, DiscoveryAgentConfig]:
    """A stand-in registration service on a free port, and an agent config that points at it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    return server, DiscoveryAgentConfig(service_url=url, infra_env_id="ie", agent_token="t")


def test_a_registration_the_service_is_still_answering_is_waited_for_not_sent_again() -> None:
    """A slow answer must not make the agent register twice: a registration the service completes
    after the agent gave up on it re-registers the host, sending it back to discovery."""
    posts: list[float] = []
    first_answer_after_s = 1.0

    class Slow(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            posts.append(time.monotonic())
            if len(posts) == 1:
                time.sleep(first_answer_after_s)  # the service, busy, answers the first one late
            self.send_response(201)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server, config = _registration_service(Slow)

    def register(answer_wait_s: float) -> int | None:
        posts.clear()
        seam = AgentBootSeam(FaultBook(), AgentTimings.zero(), answer_wait_s=answer_wait_s)
        return asyncio.run(seam._register(config, agent_host_id("slow"), macs_for(4)))

    try:
        assert register(answer_wait_s=60.0) == 201
        assert len(posts) == 1
        # What the agent did before it waited long enough: gave up and registered again (the
        # second answer, prompt, has three seconds: a loaded machine must not make a third).
        first_answer_after_s = 8.0
        assert register(answer_wait_s=3.0) == 201
        assert len(posts) == 2
    finally:
        server.shutdown()


def test_a_registration_refused_as_an_installed_hosts_is_sent_again_until_taken() -> None:
    """409: the host id is an installed Agent's (the host was given to a new BMI before its old slot
    released that Agent). The agent keeps registering until the Agent is gone; another refusal (a
    bad token) ends it at once."""
    answers: list[int] = []
    posts: list[str] = []

    class Service(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            posts.append(self.path)
            self.send_response(answers.pop(0) if answers else 201)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server, config = _registration_service(Service)
    seam = AgentBootSeam(FaultBook(), AgentTimings.zero())
    try:
        answers[:] = [409, 409]
        assert asyncio.run(seam._register(config, agent_host_id("reused"), macs_for(9))) == 201
        assert len(posts) == 3
        posts.clear()
        answers[:] = [401]
        assert asyncio.run(seam._register(config, agent_host_id("forged"), macs_for(9))) == 401
        assert len(posts) == 1
    finally:
        server.shutdown()
