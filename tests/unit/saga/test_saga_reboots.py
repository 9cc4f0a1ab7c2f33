"""A reboot as every kind orders and confirms it (`gpuop.saga.reboots`): only a new boot id
confirms it, and it is ordered under the boot id it was decided in."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gpuop.events import driver as dm
from gpuop.events.kube import NodeCordoned, NodeObserved
from gpuop.saga import reboots
from tests.support.sagas import BOOT_A, BOOT_B, inventory


@dataclass(frozen=True)
class Waiting:
    boot_id_at_reboot: str | None = BOOT_A


def observed(boot_id: str | None) -> NodeObserved:
    return NodeObserved(ready=True, unschedulable=True, boot_id=boot_id)


def test_a_new_boot_id_from_an_observation_or_an_inventory_confirms_the_reboot():
    assert reboots.new_boot(Waiting(), observed(BOOT_B)) == BOOT_B
    assert reboots.new_boot(Waiting(), inventory(BOOT_B)) == BOOT_B


def test_the_boot_the_reboot_was_decided_in_or_none_at_all_confirms_nothing():
    assert reboots.new_boot(Waiting(), observed(BOOT_A)) is None
    assert reboots.new_boot(Waiting(), inventory(BOOT_A)) is None
    assert reboots.new_boot(Waiting(), observed(None)) is None, "no boot id is no boot"
    assert reboots.new_boot(Waiting(), NodeCordoned(action_id="x")) is None


def test_the_order_carries_the_boot_id_it_was_decided_in():
    assert reboots.reboot_node(Waiting(), "why") == dm.RebootNode(boot_id=BOOT_A, reason="why")
    with pytest.raises(ValueError, match="boot id it was decided in"):
        reboots.reboot_node(Waiting(None), "why")
