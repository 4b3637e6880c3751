"""`KubeApi.mutate` from an informer's copy: the write is a compare-and-swap on the copy's
resourceVersion, a stale copy falls back to reading the object, and a deleted one is reported gone."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable

from lab.hub.testing import ADMIN_USER
from lab.hub_controllers.kube import KubeApi, Obj
from lab.hub_controllers.resources import SECRETS
from lab.hub_controllers.testing import Lab, hub_requests_by


def _secret_gets(lab: Lab) -> int:
    return hub_requests_by(lab.client.http, ADMIN_USER, "get", "secrets")


def _labelled(key: str, value: str) -> Callable[[Obj], Obj | None]:
    def mutator(fresh: Obj) -> Obj | None:
        labels = fresh["metadata"].setdefault("labels", {})
        if labels.get(key) == value:
            return None
        labels[key] = value
        return fresh

    return mutator


def _mutate(lab: Lab, ns: str, mutator: Callable[[Obj], Obj | None], cached: Obj) -> Obj | None:
    async def run() -> Obj | None:
        api = KubeApi(lab.url, lab.hub.token)
        try:
            return await api.mutate(SECRETS, ns, "s", mutator, cached=cached)
        finally:
            await api.aclose()

    return asyncio.run(run())


def test_a_current_copy_is_written_without_reading_the_object(lab: Lab, ns: str) -> None:
    cached = lab.client.create(SECRETS, {"metadata": {"name": "s", "namespace": ns}})
    snapshot = copy.deepcopy(cached)
    gets = _secret_gets(lab)

    stored = _mutate(lab, ns, _labelled("a", "1"), cached)

    assert stored is not None and stored["metadata"]["labels"] == {"a": "1"}
    assert _secret_gets(lab) == gets
    assert cached == snapshot, "the informer's copy must never be modified"


def test_a_stale_copy_reads_the_object_and_keeps_what_changed_meanwhile(lab: Lab, ns: str) -> None:
    stale = lab.client.create(SECRETS, {"metadata": {"name": "s", "namespace": ns}})
    lab.client.patch(SECRETS, ns, "s", {"metadata": {"labels": {"meanwhile": "yes"}}})
    gets = _secret_gets(lab)

    stored = _mutate(lab, ns, _labelled("a", "1"), stale)

    assert stored is not None and stored["metadata"]["labels"] == {"meanwhile": "yes", "a": "1"}
    assert _secret_gets(lab) == gets + 1
    assert lab.client.get(SECRETS, ns, "s")["metadata"]["labels"] == {"meanwhile": "yes", "a": "1"}  # type: ignore[index]


def test_a_copy_of_a_deleted_object_is_reported_gone(lab: Lab, ns: str) -> None:
    cached = lab.client.create(SECRETS, {"metadata": {"name": "s", "namespace": ns}})
    lab.client.delete(SECRETS, ns, "s")

    assert _mutate(lab, ns, _labelled("a", "1"), cached) is None
    assert lab.client.get(SECRETS, ns, "s") is None
