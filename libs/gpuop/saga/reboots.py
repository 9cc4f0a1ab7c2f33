"""A node's reboot as every kind orders and confirms it (the upgrade's and the remediation's
reboot-required phases): ordered under the boot id it was decided in, so a redelivered order
after the reboot is dropped, and confirmed only by a new boot id, never by time alone. Pure.
"""

from __future__ import annotations

from typing import Protocol

from gpuop.events import driver as dm
from gpuop.events import hardware as hw
from gpuop.events import kube
from gpuop.saga.machine import Trigger


class Rebooting(Protocol):
    """A record that waits for a reboot."""

    @property
    def boot_id_at_reboot(self) -> str | None:
        """The boot id the reboot was decided in."""


def new_boot(saga: Rebooting, trigger: Trigger) -> str | None:
    """The boot id `trigger` (a node observation or an inventory) reports when it is not the
    one the reboot was decided in: the reboot happened; None otherwise."""
    if not isinstance(trigger, kube.NodeObserved | hw.HardwareDiscovered) or not trigger.boot_id:
        return None
    if trigger.boot_id == saga.boot_id_at_reboot:
        return None  # the boot the reboot was decided in: not rebooted yet, whatever the time
    return trigger.boot_id


def reboot_node(saga: Rebooting, reason: str) -> dm.RebootNode:
    """The order to reboot, valid only while the node still runs the boot it was decided in."""
    if saga.boot_id_at_reboot is None:
        raise ValueError("a reboot needs the boot id it was decided in")
    return dm.RebootNode(boot_id=saga.boot_id_at_reboot, reason=reason)
