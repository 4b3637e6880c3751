"""List answers from cached renderings and CEL activations equal the uncached ones, across mutations."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from lab.fulfillment import FulfillmentConfig, FulfillmentLab
from lab.fulfillment.celfilter import activation, compile_filter
from lab.fulfillment.errors import ApiError, GrpcCode
from lab.fulfillment.models import BmiState
from lab.fulfillment.objects import ADMIN, Caller, list_answer
from lab.fulfillment.testing import bmi_body
from lab.fulfillment.timings import TimingProfile, Timings

ORDER_LABEL = "osac.openshift.io/cluster-order"
CAAS = f'this.metadata.tenant == "system" && "{ORDER_LABEL}" in this.metadata.labels'
TENANT = Caller("tenant-a")
LIST_ARGS: list[dict[str, Any]] = [
    {},
    {"order": "metadata.name desc", "offset": 1, "limit": 2},
    {"order": "status.state, metadata.name", "limit": 0},
    {"offset": 50},
]


def of_order(order: str) -> str:
    return f'{CAAS} && this.metadata.labels["{ORDER_LABEL}"] == "{order}"'


def filters(lab: FulfillmentLab) -> list[str | None]:
    names = [r.obj.metadata.name for r in lab.table.all()]
    name_list = ", ".join(f'"{n}"' for n in names[:3]) or '"c-0"'
    return [
        None,
        "  ",
        CAAS,
        of_order("o1"),
        of_order("o2"),
        f'{of_order("o1")} && this.metadata.name == "c-1"',
        # (A macro over the NICs, `nics.exists(...)`, is no List filter: the real one cannot translate it.)
        f"{CAAS} && has(this.status.hardware) && this.metadata.name in [{name_list}]",
        f'this.metadata.labels["{ORDER_LABEL}"] == "o1"',  # an evaluation error on unlabelled BMIs
        'this.status.hub == "hub-1"',  # private-API field: the public view must not match
        'this.status.state == "BARE_METAL_INSTANCE_STATE_RUNNING"',
        "this.metadata.version",  # not a boolean: no match
    ]


def reference(
    lab: FulfillmentLab,
    caller: Caller,
    filter_expr: str | None,
    order: str | None = None,
    offset: int | None = None,
    limit: int | None = None,
) -> dict[str, Any]:
    """The uncached path: render every visible BMI now and evaluate the filter on the plain dicts."""
    visible = [r for r in lab.table.all() if caller.can_see(r.obj.metadata.tenant)]
    items = [lab.instances.render(r, caller) for r in visible]
    return list_answer(items, filter_expr=filter_expr, order=order, offset=offset, limit=limit)


def assert_same_answers(lab: FulfillmentLab) -> None:
    for caller in (ADMIN, TENANT):
        for filter_expr in filters(lab):
            for args in LIST_ARGS:
                got = lab.instances.list_objects(caller, filter_expr=filter_expr, **args)
                want = reference(lab, caller, filter_expr, **args)
                assert got == want, (caller, filter_expr, args)


async def settle(lab: FulfillmentLab, done: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "the twin did not settle"
        await asyncio.sleep(0.01)


def no_provisioning(lab: FulfillmentLab) -> Callable[[], bool]:
    return lambda: all(r.state != BmiState.PROVISIONING for r in lab.table.all())


def names(answer: dict[str, Any]) -> list[str]:
    return [o["metadata"]["name"] for o in answer["items"]]


async def test_cached_list_answers_follow_every_mutation() -> None:
    config = FulfillmentConfig(
        hosts=8, timings=Timings.for_profile(TimingProfile.ZERO), tenant_tokens={"t" * 32: "tenant-a"}
    )
    lab = FulfillmentLab(config)
    try:
        assert_same_answers(lab)
        # 6 standard hosts for 7 standard BMIs: one of them fails allocation.
        for i in range(6):
            labels = {ORDER_LABEL: f"o{2 - i % 2}"} if i else {}
            lab.instances.create(bmi_body(f"c-{i}", labels=labels), ADMIN)
        lab.instances.create(bmi_body("t-0", catalog_item="bm-general"), TENANT)
        assert_same_answers(lab)  # cached while PROVISIONING...
        await settle(lab, no_provisioning(lab))
        assert_same_answers(lab)  # ...and not stale once the lifecycle moved them on
        states = {r.name: r.state for r in lab.table.all()}
        assert list(states.values()).count(BmiState.FAILED) == 1

        c1 = next(r for r in lab.table.all() if r.name == "c-1")
        # (In id order, as the real List: the names' order is the random ids'.)
        assert sorted(names(lab.instances.list_objects(ADMIN, filter_expr=of_order("o1")))) == [
            "c-1",
            "c-3",
            "c-5",
        ]
        lab.instances.update(c1.id, {"metadata": {"labels": {ORDER_LABEL: "o2"}}}, ADMIN)
        assert sorted(names(lab.instances.list_objects(ADMIN, filter_expr=of_order("o1")))) == ["c-3", "c-5"]
        assert_same_answers(lab)

        # A server-side write (the private-only `status.hub`).
        c1.obj.status.hub = "hub-1"
        lab.table.changed(c1)
        assert names(lab.instances.list_objects(ADMIN, filter_expr='this.status.hub == "hub-1"')) == ["c-1"]
        assert_same_answers(lab)

        # A caller that edits an answer must not change the next one.
        answer = lab.instances.list_objects(ADMIN, filter_expr=CAAS)
        answer["items"][0]["metadata"]["labels"][ORDER_LABEL] = "edited"
        answer["items"][0]["status"]["conditions"].clear()
        assert_same_answers(lab)

        lab.instances.delete(c1.id, ADMIN)
        assert c1.state == BmiState.DELETING
        assert_same_answers(lab)
        await settle(lab, lambda: lab.table.get(c1.id) is None)
        assert "c-1" not in names(lab.instances.list_objects(ADMIN, limit=0))
        assert_same_answers(lab)
    finally:
        await lab.aclose()


async def test_views_are_reused_until_the_record_changes() -> None:
    lab = FulfillmentLab(FulfillmentConfig(hosts=4, timings=Timings.for_profile(TimingProfile.ZERO)))
    try:
        lab.instances.create(bmi_body("v-0"), ADMIN)
        await settle(lab, no_provisioning(lab))
        rec = lab.table.all()[0]
        view = rec.view(public=False)
        assert rec.view(public=False) is view
        assert view.activation() is view.activation()
        assert rec.view(public=True) is not view
        lab.instances.update(rec.id, {"metadata": {"labels": {"k": "v"}}}, ADMIN)
        fresh = rec.view(public=False)
        assert fresh is not view
        assert fresh.data["metadata"]["labels"] == {"k": "v"}
        assert fresh.data["metadata"]["version"] == view.data["metadata"]["version"] + 1
    finally:
        await lab.aclose()


@pytest.mark.parametrize(
    "expression",
    [
        'this.metadata.tenant == "system"',
        '"k" in this.metadata.labels && this.metadata.labels["k"] == "v"',
        'this.metadata.labels["missing"] == "v"',
        "this.status.nics.exists(n, n.mac in ['a', 'b'])",
        "this.metadata.version > 2",
        "this.metadata.name",
        "n.mac == 'b'",  # a comprehension variable never leaks into a shared activation
    ],
)
def test_activation_matches_like_the_plain_object(expression: str) -> None:
    objects: list[dict[str, Any]] = [
        {"metadata": {"tenant": "system", "labels": {"k": "v"}, "name": "a", "version": 3}},
        {
            "metadata": {"tenant": "t", "labels": {}, "name": "b", "version": 1},
            "status": {"nics": [{"mac": "b"}]},
        },
        {"status": {"nics": []}},
    ]
    predicate = compile_filter(expression, "this")
    contexts = [activation("this", obj) for obj in objects]
    for _ in range(2):  # activations are reused across evaluations and expressions
        for obj, context in zip(objects, contexts, strict=True):
            assert predicate.matches_activation(context) == predicate(obj)
            compile_filter("this.status.nics.exists(n, true)", "this").matches_activation(context)


def test_bad_cel_is_invalid_argument_every_time() -> None:
    for _ in range(2):  # compiled programs are cached; failures must not be
        with pytest.raises(ApiError) as raised:
            compile_filter("this.metadata.name ==", "this")
        assert raised.value.code == GrpcCode.INVALID_ARGUMENT
        assert raised.value.message.startswith("filter: invalid CEL expression")
