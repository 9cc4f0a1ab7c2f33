"""The Kubernetes actions of the remediation saga, besides the upgrade's it reuses
(`RecordEvent`, `RunValidationPod`, `DeletePods` when the holders are unknown).

The orchestrator's executor carries them out through `gpuop.kube.conditions` (the Node
condition `GPUHealthy` and the taint `gpuop.io/gpu-unhealthy:NoSchedule`), `gpuop.kube.dra`
(on a DRA node, a `DeviceTaintRule` per quarantined device instead of the node's taint) and
the drain machinery (the eviction of named pods, through the Eviction API: PDBs respected,
unlike the device taint eviction controller's plain deletions).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuop.events.fields import NamespacedName

EVENT_REASON = "GPURemediation"
"""Reason of the Kubernetes Events the remediation records on the node."""


@dataclass(frozen=True)
class MirrorHealth:
    """Set the node's `GPUHealthy` condition from `unhealthy` (empty: True), with `detail`
    after the message, and put on (`taint` True) or take off (False) the taint
    `gpuop.io/gpu-unhealthy:NoSchedule`, or leave it (None). With `devices` (a node serving
    its GPUs through DRA), the taint is put on or taken off those devices of the node's pool
    instead, a `DeviceTaintRule` each (`NoSchedule`: no new claim is allocated them), and the
    node's taint is left alone. The release (`taint` False) is reported as `NodeUntainted`
    once everything is written; the other marks have no outcome."""

    id: str
    unhealthy: tuple[tuple[str, tuple[int, ...]], ...]
    """GPU uuid and its XIDs, per unhealthy GPU."""
    taint: bool | None
    detail: str = ""
    devices: tuple[str, ...] | None = None
    """DRA devices of the node's pool (gpuop's driver) to taint instead of the node; None:
    the node's taint."""


@dataclass(frozen=True)
class EvictPods:
    """Evict exactly these pods of the node (Eviction API, PDBs honoured) and wait until
    they are gone; reported as `PodsDeleted` or `PodDeletionFailed`."""

    id: str
    pods: tuple[NamespacedName, ...]
    force: bool
    timeout_seconds: int
    delete_empty_dir: bool


REPLACEMENT_LABEL = "gpuop.io/hardware-replacement"
"""The node label a repair flow watches: `required` while gpuop holds the node for new
hardware; the flow (or `gpuop remediation release`) sets it to `done` once it replaced it."""
REPLACEMENT_REQUIRED = "required"
REPLACEMENT_DONE = "done"


@dataclass(frozen=True)
class MarkReplacement:
    """Set the node label `gpuop.io/hardware-replacement` to `value`, or remove it (None);
    no outcome."""

    id: str
    value: str | None


RemediationAction = MirrorHealth | EvictPods | MarkReplacement
