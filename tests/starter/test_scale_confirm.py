"""`scale --confirm` when no controller takes the change in time (none runs in this module)."""

from __future__ import annotations

import pytest

from activities.bmaas.client import BmaasClient
from activities.kube import HubKube
from contracts.workflows import CONFIRM_SCALE_DOWN_ANNOTATION
from starter.operations import NotTakenInTime, OrderOperations
from starter.orders import HubOrders
from starter.validation import InstanceTypeCatalog
from tests.starter.harness import bare_metal, create_order, get_order
from tests.workflows.stack import Stack


async def test_a_confirmed_scale_down_not_taken_in_time_keeps_its_confirmation(stack: Stack) -> None:
    """The count was written and the confirmation removed when the wait gave up: the controller,
    applying the change later, refused it as an unconfirmed mass scale-down, though the operator had
    confirmed it. The confirmation now stays until the controller applies the change (and removes
    it), and the error says so."""
    kube = HubKube.from_kubeconfig(str(stack.lab.hub.kubeconfig))
    bmaas = BmaasClient(stack.settings.fulfillment_url, stack.settings.fulfillment_token_file)
    try:
        ops = OrderOperations(stack.api, HubOrders(kube), InstanceTypeCatalog(bmaas))
        order = await create_order(stack, bare_metal(bm_standard=3))
        with pytest.raises(NotTakenInTime, match=f"keeps {CONFIRM_SCALE_DOWN_ANNOTATION}=true"):
            await ops.scale(order, "bm-standard", 0, confirm_scale_down=True, timeout=1.0)
        obj = await get_order(stack, order)
        assert obj is not None
        assert obj["metadata"]["annotations"][CONFIRM_SCALE_DOWN_ANNOTATION] == "true"
        assert obj["spec"]["nodeRequests"][0]["numberOfNodes"] == 0
    finally:
        await bmaas.aclose()
        await kube.close()
