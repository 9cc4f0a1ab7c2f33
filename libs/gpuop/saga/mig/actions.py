"""The Kubernetes actions the MIG reconfiguration orders, beside its node-agent commands.

The runtime executes them as it does the upgrade's (`gpuop.saga.actions`), each with its
deterministic id. Only the eviction has an outcome the saga waits for, reported as the
upgrade's pod deletion is: `kube.PodsDeleted` or `kube.PodDeletionFailed` with the action's
id as `action_id`. The node is never cordoned: a re-carve takes some of its GPUs, not the
node, and the pause (`PauseOperands`: the device plugin advertises the node's GPUs
Unhealthy) is what keeps new pods off the GPUs while they change, as upstream's MIG manager
stops the device plugin instead of cordoning.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuop.events.fields import NamespacedName
from gpuop.saga.actions import RecordEvent
from gpuop.saga.mig.states import CONFIG_STATE_LABEL, ConfigState

EVENT_REASON = "MigReconfiguration"
"""Reason of the Kubernetes Events the saga records on the node."""


@dataclass(frozen=True)
class SetConfigState:
    """Set the node label `nvidia.com/mig.config.state` to `value`."""

    id: str
    value: ConfigState
    key: str = CONFIG_STATE_LABEL


@dataclass(frozen=True)
class EvictPods:
    """Evict the named pods of the node through the Eviction API (PodDisruptionBudgets
    honoured) and wait until they are gone; report `PodsDeleted` or `PodDeletionFailed`.
    Only these pods: the ones holding a GPU being re-carved."""

    id: str
    pods: tuple[NamespacedName, ...]
    force: bool
    """Also evict those no controller manages."""
    delete_empty_dir: bool
    """Also evict those with emptyDir volumes."""
    timeout_seconds: int
    """How long to wait for them to be gone before reporting `PodDeletionFailed`."""


MigKubeAction = SetConfigState | EvictPods | RecordEvent
"""Every Kubernetes action the MIG saga orders."""

__all__ = ["EVENT_REASON", "EvictPods", "MigKubeAction", "RecordEvent", "SetConfigState"]
