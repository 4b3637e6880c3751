"""InfraEnv activities: ensure (idempotent, owned, CRD-valid, drift patched), readiness, and the
discovery ignition with its size policy. No secret in any result, heartbeat or error."""

from __future__ import annotations

import asyncio
import base64
import json
from collections import Counter
from collections.abc import Iterator

import pytest
from fastapi import FastAPI, Response
from fastapi.responses import StreamingResponse
from temporalio.exceptions import ApplicationError

from activities.assisted import AssistedActivities, pull_secret_problem
from activities.kube import INFRA_ENVS, condition
from contracts.hub import ORDER_LABEL, WORKER_LABEL, HubErrorType, InfraEnvRef
from contracts.refs import OrderRef
from lab.http_server import ThreadedServer

TOKEN = "IGNITION-URL-TOKEN-7f3a9c"
IMAGE_SERVICE_HITS: Counter[str] = Counter()


def order_ref(api, name: str = "order-1") -> OrderRef:
    return OrderRef(namespace=api.ns, name=name)


async def test_ensure_infraenv_creates_owned_valid_objects_and_is_idempotent(lab_api, lab_assisted, kit):
    order = lab_api.order()
    run = kit.run()
    first = await run(lab_assisted.ensure_infraenv, order_ref(lab_api))
    assert first.created and first.secret_created
    assert first.infraenv == InfraEnvRef.for_order(order_ref(lab_api))

    infraenv = lab_api.get("InfraEnv", "order-1-infraenv")
    kit.validate("InfraEnv", infraenv)
    spec = infraenv["spec"]
    assert spec["pullSecretRef"] == {"name": "order-1-pull-secret"}
    assert spec["sshAuthorizedKey"] == kit.ssh_key
    assert spec["agentLabels"] == {"osac.openshift.io/clusterorder": "order-1"}
    assert "clusterRef" not in spec  # late binding
    owner = infraenv["metadata"]["ownerReferences"]
    assert [(o["kind"], o["name"], o["uid"], o["controller"]) for o in owner] == [
        ("ClusterOrder", "order-1", order["metadata"]["uid"], True)
    ]
    secret = lab_api.get("Secret", "order-1-pull-secret")
    assert secret["type"] == "kubernetes.io/dockerconfigjson"
    assert base64.b64decode(secret["data"][".dockerconfigjson"]).decode() == kit.pull_secret
    assert secret["metadata"]["ownerReferences"][0]["uid"] == order["metadata"]["uid"]

    resource_versions = (infraenv["metadata"]["resourceVersion"], secret["metadata"]["resourceVersion"])
    second = await run(lab_assisted.ensure_infraenv, order_ref(lab_api))
    assert not second.created and not second.secret_created and not second.updated
    again = lab_api.get("InfraEnv", "order-1-infraenv")
    assert again["spec"] == infraenv["spec"]
    assert lab_api.get("Secret", "order-1-pull-secret")["metadata"]["resourceVersion"] == resource_versions[1]

    for result in (first, second):
        assert kit.pull_secret_marker not in kit.dumps(result)


async def test_ensure_infraenv_adopts_and_patches_drift(api, api_assisted, kit):
    order = api.order()
    # Made by hand (no owner), bound to a cluster, other labels: adopted and put right.
    api.create(
        "InfraEnv",
        {
            "metadata": {"name": "order-1-infraenv", "labels": {"team": "ops"}},
            "spec": {
                "pullSecretRef": {"name": "other"},
                "clusterRef": {"name": "c", "namespace": api.ns},
                "agentLabels": {"osac.openshift.io/clusterorder": "someone-else"},
            },
        },
    )
    result = await kit.run()(api_assisted.ensure_infraenv, order_ref(api))
    assert not result.created and result.updated and result.secret_created
    infraenv = api.get("InfraEnv", "order-1-infraenv")
    kit.validate("InfraEnv", infraenv)
    assert "clusterRef" not in infraenv["spec"]
    assert infraenv["spec"]["pullSecretRef"] == {"name": "order-1-pull-secret"}
    assert infraenv["spec"]["agentLabels"] == {"osac.openshift.io/clusterorder": "order-1"}
    assert [o["uid"] for o in infraenv["metadata"]["ownerReferences"]] == [order["metadata"]["uid"]]
    assert infraenv["metadata"]["labels"] == {"team": "ops", "osac.openshift.io/clusterorder": "order-1"}

    # The order's pull secret changes: the Secret follows.
    rotated = kit.pull_secret.replace("quay.io", "registry.example.com")
    api.patch("ClusterOrder", "order-1", {"spec": {"pullSecret": rotated}})
    result = await kit.run()(api_assisted.ensure_infraenv, order_ref(api))
    assert result.updated and not result.created
    secret = api.get("Secret", "order-1-pull-secret")
    assert base64.b64decode(secret["data"][".dockerconfigjson"]).decode() == rotated


async def test_ensure_infraenv_needs_an_order_and_a_pull_secret(api, api_kube, http, api_assisted, kit):
    with pytest.raises(ApplicationError) as missing:
        await kit.run()(api_assisted.ensure_infraenv, order_ref(api, "absent"))
    assert missing.value.type == HubErrorType.ORDER_NOT_FOUND and missing.value.non_retryable

    api.create("ClusterOrder", {"metadata": {"name": "no-secret"}, "spec": {"templateID": "t"}})
    with pytest.raises(ApplicationError) as no_secret:
        await kit.run()(api_assisted.ensure_infraenv, order_ref(api, "no-secret"))
    assert no_secret.value.type == HubErrorType.PULL_SECRET_MISSING and no_secret.value.non_retryable
    assert no_secret.value.message == "spec.pullSecret is not set and no default pull secret is configured"

    # A default configured but not there: the tenant is told it cannot be read, not that none is set.
    unreadable = AssistedActivities(api_kube, http, default_pull_secret=(api.ns, "default-pull"))
    with pytest.raises(ApplicationError) as no_default:
        await kit.run()(unreadable.ensure_infraenv, order_ref(api, "no-secret"))
    assert no_default.value.type == HubErrorType.PULL_SECRET_MISSING
    assert no_default.value.message == (
        "spec.pullSecret is not set and the provider's default pull secret cannot be read"
    )

    # With a configured default the order's InfraEnv uses that pull secret.
    encoded = base64.b64encode(kit.pull_secret.encode()).decode()
    api.create(
        "Secret",
        {
            "metadata": {"name": "default-pull"},
            "type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": encoded},
        },
    )
    with_default = AssistedActivities(api_kube, http, default_pull_secret=(api.ns, "default-pull"))
    result = await kit.run()(with_default.ensure_infraenv, order_ref(api, "no-secret"))
    assert result.created
    assert api.get("Secret", "no-secret-pull-secret")["data"][".dockerconfigjson"] == encoded


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("ghp_not-json", "it is not JSON"),
        ('["quay.io"]', 'it has no "auths" object'),
        ('{"auths": []}', 'it has no "auths" object'),
        (
            '{"auths": {"quay.io": {"email": "a@b"}}}',
            'registry 1 of "auths" has neither "auth" nor "credsStore"',
        ),
        (
            '{"auths": {"a.io": {"auth": "YTpi"}, "b.io": {"auth": "s3cret!"}}}',
            'registry 2 of "auths" is not',
        ),
        ('{"auths": {"quay.io": {"auth": 7}}}', 'registry 1 of "auths" is not base64'),
        # Not refused here, as nothing here may be stricter than assisted-service (which refuses the
        # first two itself: the order then waits for an image).
        ("[" * 100_000, None),
        ('{"auths": {}}', None),
        ('{"Auths": {"quay.io": {"auth": "YTpi"}}}', None),
        ('{"auths": {"quay.io": {"credsStore": "desktop"}}}', None),
        (' {"auths": {"quay.io": {"auth": "YTpi\\nYw==", "email": "a@b"}}}\n', None),
    ],
)
def test_pull_secret_problem_names_what_is_wrong_never_the_value(text: str, problem: str | None) -> None:
    found = pull_secret_problem(text)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found
        assert "s3cret" not in found and "quay.io" not in found and "ghp_" not in found


async def test_a_pull_secret_that_is_none_is_never_written(api, api_assisted, kit):
    """Refused before anything is created; on a live order the Secret the hosts boot with is kept,
    and the result says why the order's is not applied."""
    api.order(pullSecret="not-a-docker-config")
    with pytest.raises(ApplicationError) as refused:
        await kit.run()(api_assisted.ensure_infraenv, order_ref(api))
    assert refused.value.type == HubErrorType.PULL_SECRET_INVALID and refused.value.non_retryable
    assert refused.value.message == "spec.pullSecret is not a pull secret: it is not JSON"
    assert api.get("Secret", "order-1-pull-secret") is None
    assert api.get("InfraEnv", "order-1-infraenv") is None

    api.patch("ClusterOrder", "order-1", {"spec": {"pullSecret": kit.pull_secret}})
    assert (await kit.run()(api_assisted.ensure_infraenv, order_ref(api))).pull_secret_refused is None
    kept = api.get("Secret", "order-1-pull-secret")
    assert kept is not None
    api.patch("ClusterOrder", "order-1", {"spec": {"pullSecret": '{"auths": {"quay.io": {"auth": "x!"}}}'}})
    api.delete("InfraEnv", "order-1-infraenv")
    result = await kit.run()(api_assisted.ensure_infraenv, order_ref(api))
    assert result.created and not result.secret_created and not result.updated
    assert result.pull_secret_refused == (
        'spec.pullSecret is not a pull secret: the "auth" of registry 1 of "auths" is not base64'
    )
    assert result.pull_secret_refused_reason == HubErrorType.PULL_SECRET_INVALID
    assert (
        api.get("Secret", "order-1-pull-secret")["metadata"]["resourceVersion"]
        == (kept["metadata"]["resourceVersion"])
    )

    # Removed from the order, with no default: kept as well (the SSH key still follows the order),
    # and refused for good only once there is no Secret to keep.
    new_key = "ssh-ed25519 AAAA n@x"
    api.patch("ClusterOrder", "order-1", {"spec": {"pullSecret": None, "sshPublicKey": new_key}})
    result = await kit.run()(api_assisted.ensure_infraenv, order_ref(api))
    assert result.updated and not result.secret_created
    assert result.pull_secret_refused == "spec.pullSecret is not set and no default pull secret is configured"
    assert result.pull_secret_refused_reason == HubErrorType.PULL_SECRET_MISSING
    assert api.get("InfraEnv", "order-1-infraenv")["spec"]["sshAuthorizedKey"] == new_key
    assert (
        api.get("Secret", "order-1-pull-secret")["metadata"]["resourceVersion"]
        == (kept["metadata"]["resourceVersion"])
    )
    api.delete("Secret", "order-1-pull-secret")
    with pytest.raises(ApplicationError) as missing:
        await kit.run()(api_assisted.ensure_infraenv, order_ref(api))
    assert missing.value.type == HubErrorType.PULL_SECRET_MISSING and missing.value.non_retryable
    assert missing.value.message == "spec.pullSecret is not set and no default pull secret is configured"


async def test_wait_infraenv_ready_shows_image_created_false_then_ready(lab_api, lab_assisted, lab_kube, kit):
    order = lab_api.order()
    # The InfraEnv first, its Secret later: assisted-service reports ImageCreated=False meanwhile.
    lab_api.create(
        "InfraEnv",
        {
            "metadata": {
                "name": "order-1-infraenv",
                "ownerReferences": [
                    {
                        "apiVersion": "osac.openshift.io/v1alpha1",
                        "kind": "ClusterOrder",
                        "name": "order-1",
                        "uid": order["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": {"pullSecretRef": {"name": "order-1-pull-secret"}},
        },
    )
    run = kit.run()
    ref = InfraEnvRef.for_order(order_ref(lab_api))
    task = asyncio.create_task(run(lab_assisted.wait_infraenv_ready, ref))

    async def heartbeat_after(count: int) -> dict:
        while len(run.heartbeats) <= count:
            assert not task.done(), "ready before its pull secret was valid"
            run.beat.clear()
            await asyncio.wait_for(run.beat.wait(), 30)
        return dict(run.heartbeats[count][0])

    while not any(h[0].get("image_created_status") == "False" for h in run.heartbeats):
        await heartbeat_after(len(run.heartbeats))

    # Then a pull secret assisted-service refuses: it quotes the whole secret in the condition's
    # message ("invalid pull secret data in secret <name> <data>: <why>"), tenant credentials and all.
    auths = {**json.loads(kit.pull_secret)["auths"], "registry.example.com": {"email": "t@example.com"}}
    refused = json.dumps({"auths": auths})
    lab_api.create(
        "Secret",
        {
            "metadata": {"name": "order-1-pull-secret"},
            "type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": base64.b64encode(refused.encode()).decode()},
        },
    )
    informer = lab_kube.informer(INFRA_ENVS)

    def quotes_the_secret() -> bool:
        cached = informer.get(ref.namespace, ref.name)
        message = str((condition(cached, "ImageCreated") or {}).get("message")) if cached else ""
        return kit.pull_secret_marker in message

    await asyncio.wait_for(informer.wait(lambda: quotes_the_secret() or None, tick_seconds=1), 30)
    # The wait's next heartbeat is built from that condition.
    refused_beat = await heartbeat_after(len(run.heartbeats))
    assert refused_beat["image_created_status"] == "False"
    assert refused_beat["image_created_reason"] == "ImageCreationError"
    assert refused_beat["image_created_message"].startswith("Failed to create image")

    await kit.run()(lab_assisted.ensure_infraenv, order_ref(lab_api))  # puts the order's secret back
    ready = await asyncio.wait_for(task, 30)
    assert ready.image_created and ready.infraenv == ref
    text = kit.dumps(run.heartbeats) + kit.dumps(ready)
    assert "api_key" not in text and "http" not in text and kit.pull_secret_marker not in text
    assert "registry.example.com" not in text


async def test_wait_infraenv_ready_heartbeats_no_condition_text(api, api_assisted, api_kube, kit):
    """Whatever the hub writes into ImageCreated, only its status and a reason-shaped reason are
    passed on; the message is replaced by a fixed text for a known reason."""
    api.order()
    ref = (await kit.run()(api_assisted.ensure_infraenv, order_ref(api))).infraenv
    leak = f"Failed to create image: invalid pull secret data in secret x {kit.pull_secret}: nope"
    conditions = [
        {"type": "ImageCreated", "status": "False", "reason": "ImageCreationError", "message": leak},
        {"type": "ImageCreated", "status": leak, "reason": leak, "message": leak},
    ]
    informer = api_kube.informer(INFRA_ENVS)
    fixed_text = "Failed to create image: see the InfraEnv's ImageCreated condition on the hub"
    for cond, expected in zip(conditions, [("False", "ImageCreationError"), (None, None)], strict=True):
        api.patch("InfraEnv", ref.name, {"status": {"conditions": [cond]}}, status=True)

        def cached(cond: dict = cond) -> bool | None:
            obj = informer.get(ref.namespace, ref.name)
            return (obj is not None and condition(obj, "ImageCreated") == cond) or None

        # The heartbeats describe the cached InfraEnv: start once it holds this condition.
        await asyncio.wait_for(informer.wait(cached, tick_seconds=1), 30)
        run = kit.run()
        task = asyncio.create_task(run(api_assisted.wait_infraenv_ready, ref))
        await run.first_heartbeat()
        task.cancel()
        beat = run.heartbeats[0][0]
        assert (beat["image_created_status"], beat["image_created_reason"]) == expected
        assert beat["image_created_message"] == (fixed_text if expected[1] else None)
        assert kit.pull_secret_marker not in kit.dumps(run.heartbeats)


async def test_discovery_ignition_from_assisted_service(lab_api, lab_assisted, lab_kube, kit):
    lab_api.order()
    ref = (await kit.run()(lab_assisted.ensure_infraenv, order_ref(lab_api))).infraenv

    # Not there (deleted behind our back): non-retryable, for the order's workflow to create it again.
    with pytest.raises(ApplicationError) as missing:
        await lab_assisted.discovery_ignition(lab_api.ns, "no-such-infraenv")
    assert missing.value.type == HubErrorType.INFRAENV_MISSING and missing.value.non_retryable
    assert "http" not in str(missing.value)

    await kit.run()(lab_assisted.wait_infraenv_ready, ref)
    text = await lab_assisted.discovery_ignition(ref.namespace, ref.name)
    document = json.loads(text)
    assert document["ignition"]["version"].startswith("3.")
    assert 1000 < len(text.encode()) < 48 * 1024
    events = lab_api.items("Event")
    assert not [e for e in events if e["reason"] == "DiscoveryIgnitionSizeWarning"]


# ---------------------------------------------------------------------------------------------
# Size policy, against a tiny local server standing in for the image service


def _ignition_of_size(size: int) -> bytes:
    head = b'{"ignition": {"version": "3.1.0"}, "padding": "'
    tail = b'"}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


@pytest.fixture(scope="module")
def image_service() -> Iterator[str]:
    app = FastAPI()

    @app.get("/ign/{size}")
    async def sized(size: int, api_key: str) -> Response:
        assert api_key == TOKEN
        return Response(_ignition_of_size(size), media_type="application/json")

    @app.get("/stream/{size}")
    async def streamed(size: int) -> StreamingResponse:  # chunked: no Content-Length
        body = _ignition_of_size(size)
        chunks = [body[i : i + 4096] for i in range(0, len(body), 4096)]

        async def gen():
            for chunk in chunks:
                yield chunk

        return StreamingResponse(gen(), media_type="application/json")

    @app.get("/counted/{size}")
    async def counted(size: int) -> Response:
        IMAGE_SERVICE_HITS["counted"] += 1
        return Response(_ignition_of_size(size), media_type="application/json")

    @app.get("/broken")
    async def broken() -> Response:
        return Response("boom", status_code=503)

    @app.get("/not-ignition")
    async def not_ignition() -> Response:
        return Response("<html>login</html>", media_type="text/html")

    with ThreadedServer(app) as server:
        yield server.url


async def _infraenv_serving(api, assisted, kit, url: str) -> InfraEnvRef:
    if api.get("ClusterOrder", "order-1") is None:
        api.order()
        await kit.run()(assisted.ensure_infraenv, order_ref(api))
    api.patch(
        "InfraEnv",
        "order-1-infraenv",
        {"status": {"bootArtifacts": {"discoveryIgnitionURL": url}}},
        status=True,
    )
    return InfraEnvRef.for_order(order_ref(api))


async def test_workers_creating_at_once_share_one_ignition_fetch(api, api_assisted, image_service, kit):
    ref = await _infraenv_serving(api, api_assisted, kit, f"{image_service}/counted/{20 * 1024}")
    before = IMAGE_SERVICE_HITS["counted"]
    texts = await asyncio.gather(
        *(api_assisted.discovery_ignition(ref.namespace, ref.name) for _ in range(5))
    )
    assert len(set(texts)) == 1 and len(texts[0].encode()) == 20 * 1024
    assert IMAGE_SERVICE_HITS["counted"] - before == 1
    # Nothing is kept: a later creation fetches the current ignition.
    await api_assisted.discovery_ignition(ref.namespace, ref.name)
    assert IMAGE_SERVICE_HITS["counted"] - before == 2


def _size_events(api) -> list[dict]:
    return [e for e in api.items("Event") if e["reason"] == "DiscoveryIgnitionSizeWarning"]


async def test_ignition_above_warning_size_emits_one_warning_event(api, api_assisted, image_service, kit):
    ref = await _infraenv_serving(api, api_assisted, kit, f"{image_service}/ign/{50 * 1024}?api_key={TOKEN}")
    for _ in range(2):  # a retried BMI creation fetches again: still one Event
        text = await api_assisted.discovery_ignition(ref.namespace, ref.name)
        assert len(text.encode()) == 50 * 1024
    events = _size_events(api)
    assert len(events) == 1
    order = api.get("ClusterOrder", "order-1")
    event = events[0]
    assert event["type"] == "Warning"
    assert event["involvedObject"]["kind"] == "ClusterOrder"
    assert event["involvedObject"]["uid"] == order["metadata"]["uid"]
    assert str(50 * 1024) in event["message"] and TOKEN not in event["message"]

    # Below the threshold: no further Event.
    await _infraenv_serving(api, api_assisted, kit, f"{image_service}/ign/{20 * 1024}?api_key={TOKEN}")
    await api_assisted.discovery_ignition(ref.namespace, ref.name)
    assert len(_size_events(api)) == 1


@pytest.mark.parametrize("path", ["ign", "stream"])
async def test_ignition_above_64k_is_refused(api, api_assisted, image_service, kit, path):
    size = 64 * 1024 + 1
    ref = await _infraenv_serving(api, api_assisted, kit, f"{image_service}/{path}/{size}?api_key={TOKEN}")
    with pytest.raises(ApplicationError) as refused:
        await api_assisted.discovery_ignition(ref.namespace, ref.name)
    error = refused.value
    assert error.type == HubErrorType.IGNITION_TOO_LARGE == "DiscoveryIgnitionTooLarge"
    assert error.non_retryable
    assert error.details[0]["limit_bytes"] == 64 * 1024 and error.details[0]["size_bytes"] > 64 * 1024
    assert TOKEN not in str(error) + repr(error.details) and image_service not in str(error) + repr(
        error.details
    )
    assert len(_size_events(api)) == 1

    # Exactly at the limit is accepted.
    await _infraenv_serving(api, api_assisted, kit, f"{image_service}/{path}/{64 * 1024}?api_key={TOKEN}")
    assert len((await api_assisted.discovery_ignition(ref.namespace, ref.name)).encode()) == 64 * 1024


async def test_ignition_fetch_failures_are_typed_and_carry_no_url(api, api_assisted, image_service, kit):
    ref = await _infraenv_serving(api, api_assisted, kit, f"{image_service}/broken?api_key={TOKEN}")
    with pytest.raises(ApplicationError) as broken:
        await api_assisted.discovery_ignition(ref.namespace, ref.name)
    assert broken.value.type == HubErrorType.IGNITION_FETCH_FAILED and not broken.value.non_retryable
    assert broken.value.details[0]["code"] == 503

    await _infraenv_serving(api, api_assisted, kit, f"{image_service}/not-ignition?api_key={TOKEN}")
    with pytest.raises(ApplicationError) as invalid:
        await api_assisted.discovery_ignition(ref.namespace, ref.name)
    assert invalid.value.type == HubErrorType.IGNITION_INVALID

    await _infraenv_serving(api, api_assisted, kit, f"http://127.0.0.1:9/nothing?api_key={TOKEN}")
    with pytest.raises(ApplicationError) as refused:
        await api_assisted.discovery_ignition(ref.namespace, ref.name)
    assert refused.value.type == HubErrorType.IGNITION_FETCH_FAILED and not refused.value.non_retryable
    for error in (broken.value, invalid.value, refused.value):
        text = str(error) + repr(error.details) + repr(error.__cause__) + repr(error.__context__)
        assert TOKEN not in text and "127.0.0.1" not in text


async def test_delete_infraenv_removes_both_and_tolerates_absence(api, api_assisted, kit):
    api.order()
    ref = (await kit.run()(api_assisted.ensure_infraenv, order_ref(api))).infraenv
    first = await kit.run()(api_assisted.delete_infraenv, ref)
    assert not first.infraenv_already_gone and not first.secret_already_gone
    assert api.get("InfraEnv", ref.name) is None and api.get("Secret", ref.pull_secret_name) is None
    second = await kit.run()(api_assisted.delete_infraenv, ref)
    assert second.infraenv_already_gone and second.secret_already_gone


async def test_delete_infraenv_deletes_its_unclaimed_agents_first(api, api_assisted, kit):
    """At the end of a decommission every host is wiped: a registration no worker looked for (it
    came after its worker's release) goes with the InfraEnv. One claimed by a cluster, or approved,
    is left and named; another InfraEnv's Agents are not touched."""
    api.order()
    ref = (await kit.run()(api_assisted.ensure_infraenv, order_ref(api))).infraenv
    api.agent("late", kit.random_macs(2), infraenv=ref.name)
    api.agent("approved", kit.random_macs(2), infraenv=ref.name, approved=True)
    api.agent("bound", kit.random_macs(2), infraenv=ref.name)
    api.patch("Agent", "bound", {"spec": {"clusterDeploymentName": {"name": "c", "namespace": api.ns}}})
    api.agent("handed", kit.random_macs(2), infraenv=ref.name, labels={WORKER_LABEL: "order-1-worker-0"})
    api.agent_registered("no-inventory-yet", infraenv=ref.name)
    api.agent("other-order", kit.random_macs(2), infraenv=ref.name, labels={ORDER_LABEL: "order-2"})
    api.agent("elsewhere", kit.random_macs(2), infraenv="another-infraenv")
    deleted = await kit.run()(api_assisted.delete_infraenv, ref)
    assert deleted.agents_swept
    assert deleted.agents_deleted == ["late", "no-inventory-yet"]
    assert deleted.agents_kept == ["approved", "bound", "handed"]
    assert api.get("Agent", "late") is None and api.get("Agent", "no-inventory-yet") is None
    for name in ("approved", "bound", "handed", "other-order", "elsewhere"):
        assert api.get("Agent", name) is not None, name
    assert api.get("InfraEnv", ref.name) is None


async def test_delete_infraenv_refused_its_agents_still_deletes_the_infraenv(api, api_assisted, kit):
    """The sweep is best effort: a hub that refuses the Agents' list for good (a role a rollout
    forgot) still has the InfraEnv and its Secret deleted, as before the sweep existed."""
    api.order()
    ref = (await kit.run()(api_assisted.ensure_infraenv, order_ref(api))).infraenv
    api.agent("late", kit.random_macs(2), infraenv=ref.name)
    api.set_faults({"errors": [{"code": 403, "verbs": ["list"], "resources": ["agents"]}]})
    try:
        deleted = await kit.run()(api_assisted.delete_infraenv, ref)
    finally:
        api.clear_faults()
    assert not deleted.agents_swept and deleted.agents_deleted == []
    assert api.get("InfraEnv", ref.name) is None and api.get("Secret", ref.pull_secret_name) is None
    assert api.get("Agent", "late") is not None
