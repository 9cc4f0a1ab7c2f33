"""The Kubernetes actions the MIG reconfiguration orders, beside its node-agent commands.

The runtime executes them as it does the upgrade's (`gpuop.saga.actions`), each with its
deterministic id. Only the eviction has an outcome the saga waits for, reported as the
upgrade's pod deletion is: `kube.PodsDeleted` or `kube.PodDeletionFailed` with the action's
id as `action_id`. The eviction of named pods is the remediation's `EvictPods` (the holders
of some GPUs, evicted alike), so one executor path serves both kinds.

The node is never cordoned: a re-carve takes some of its GPUs, not the node, and the pause
(`PauseOperands`: the device plugin advertises the node's GPUs Unhealthy) is what keeps new
pods off the GPUs while they change, as upstream's MIG manager stops the device plugin
instead of cordoning.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuop.saga.actions import RecordEvent
from gpuop.saga.mig.states import CONFIG_STATE_LABEL, ConfigState
from gpuop.saga.remediation.actions import EvictPods

EVENT_REASON = "MigReconfiguration"
"""Reason of the Kubernetes Events the saga records on the node."""


@dataclass(frozen=True)
class SetConfigState:
    """Set the node label `nvidia.com/mig.config.state` to `value`."""

    id: str
    value: ConfigState
    key: str = CONFIG_STATE_LABEL


MigKubeAction = SetConfigState | EvictPods | RecordEvent
"""Every Kubernetes action the MIG saga orders."""

__all__ = ["EVENT_REASON", "EvictPods", "MigKubeAction", "RecordEvent", "SetConfigState"]
