"""What the upgrade orchestrator observed and did in Kubernetes, recorded as events.

The orchestrator's decision core is a pure function of (saga, event, policy, now); to keep it
one, the orchestrator's Kubernetes side publishes what it saw (a node's readiness and cordon,
the pods still on it, validator pods) and the outcome of every Kubernetes action the core
ordered (cordon, pod deletion, drain, uncordon, untaint) as events in domain `kube`, and the
core reads them from the log like any other event. Replaying the log therefore reproduces
each decision.

Published and consumed by the upgrade orchestrator's cluster role only; the subject's node
token is the node observed. An outcome carries `action_id`, the deterministic id the core gave
the action (from `command_id`), or nothing when the change happened without gpuop acting, for
example an administrator cordoning a node by hand.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from gpuop.events.envelope import Event
from gpuop.events.fields import (
    BootId,
    Count,
    DocumentedEnum,
    LabelKey,
    LabelValue,
    Message,
    MessageId,
    NamespacedName,
)

DOMAIN = "kube"


class KubeEvent(Event):
    """Base of the orchestrator's Kubernetes observations."""

    DOMAIN: ClassVar[str] = DOMAIN


class KubeActionResult(KubeEvent):
    """Base of the outcomes of Kubernetes actions the decision core ordered."""

    action_id: MessageId | None = None
    """Id of the action this reports; absent when the change was made outside gpuop."""


class EvictionFailureReason(DocumentedEnum):
    """Why pods could not be removed from a node."""

    PDB_BLOCKED = "pdb-blocked"
    """A PodDisruptionBudget refused the eviction until the timeout."""
    TIMEOUT = "timeout"
    """Evicted pods did not terminate within the timeout."""
    UNMANAGED_PODS = "unmanaged-pods"
    """Pods without a controller would be lost and `force` is off."""
    LOCAL_STORAGE = "local-storage"
    """Pods use emptyDir volumes and `deleteEmptyDir` is off."""
    API_ERROR = "api-error"
    """The Kubernetes API kept failing."""


class NodeObserved(KubeEvent):
    """The orchestrator saw the node object (on a watch event or a periodic resync)."""

    NAME: ClassVar[str] = "node-observed"

    ready: bool
    """The node's `Ready` condition is `True`."""
    unschedulable: bool
    """`spec.unschedulable`: the node is cordoned, by gpuop or by someone else."""
    boot_id: BootId | None = None
    """`status.nodeInfo.bootID` as the kubelet reports it."""
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=64)
    """The labels gpuop acts on (`gpuop.io/*` and upstream's `nvidia.com/*-driver-upgrade*`)."""


class NodeRemoved(KubeEvent):
    """The node object was deleted; its saga ends."""

    NAME: ClassVar[str] = "node-removed"


class NodeCordoned(KubeActionResult):
    """The node is unschedulable."""

    NAME: ClassVar[str] = "cordoned"

    was_unschedulable: bool = False
    """The node was already cordoned before the upgrade, so gpuop must not uncordon it."""


class NodeUncordoned(KubeActionResult):
    """The node is schedulable again."""

    NAME: ClassVar[str] = "uncordoned"


class NodeUntainted(KubeActionResult):
    """The node no longer carries the taint its action removed.

    The one a new node is brought up behind (`gpuop.io/driver-not-ready`), or a GPU
    remediation's quarantine (`gpuop.io/gpu-unhealthy`, its `GPUHealthy` set True first)."""

    NAME: ClassVar[str] = "untainted"


class PodsObserved(KubeEvent):
    """The workload pods still on the node, counted the ways the saga's waits need."""

    NAME: ClassVar[str] = "pods-observed"

    gpu_pods: Count
    """Running or Pending pods that request `nvidia.com/gpu*`, `nvidia.com/mig-*` or RDMA."""
    job_pods: Count
    """Running or Pending pods matching the policy's wait-for-completion selector."""
    drainable_pods: Count
    """Pods a drain would evict (not DaemonSet pods, not labelled drain-skip)."""
    sample: tuple[NamespacedName, ...] = Field(default=(), max_length=32)
    """Some of the pods counted, for operators."""


class PodsDeleted(KubeActionResult):
    """Every GPU pod selected for deletion is gone from the node."""

    NAME: ClassVar[str] = "pods-deleted"

    deleted: Count
    """Pods deleted or evicted."""


class PodDeletionFailed(KubeActionResult):
    """Some GPU pods could not be deleted."""

    NAME: ClassVar[str] = "pod-deletion-failed"

    reason: EvictionFailureReason
    """Why."""
    pods: tuple[NamespacedName, ...] = Field(default=(), max_length=64)
    """Pods still on the node (the first 64)."""
    message: Message = ""
    """Detail for operators."""


class DrainCompleted(KubeActionResult):
    """The drain finished: every pod it had to evict is gone. What it skips stays: DaemonSet
    pods, static pods' mirrors, pods with a drain skip label, and pods the policy's pod
    selector leaves out."""

    NAME: ClassVar[str] = "drain-completed"

    evicted: Count
    """Pods evicted."""


class DrainFailed(KubeActionResult):
    """The drain gave up."""

    NAME: ClassVar[str] = "drain-failed"

    reason: EvictionFailureReason
    """Why."""
    blocking_pdb: NamespacedName | None = None
    """The PodDisruptionBudget that refused evictions, when one did."""
    pods: tuple[NamespacedName, ...] = Field(default=(), max_length=64)
    """Pods still on the node (the first 64)."""
    message: Message = ""
    """Detail for operators."""


class ValidationPodFailureReason(DocumentedEnum):
    """Why the validation pod did not succeed."""

    FAILED = "failed"
    """It ran and a container exited non-zero (phase Failed)."""
    TIMEOUT = "timeout"
    """It was not Succeeded within the timeout (not scheduled, not started, still running)."""
    REFUSED = "refused"
    """The API server refused to create it."""


class ValidationPodSucceeded(KubeActionResult):
    """The validation pod ran on the cordoned node and exited 0 (phase Succeeded); it is
    deleted after."""

    NAME: ClassVar[str] = "validation-pod-succeeded"

    pod: NamespacedName
    """The pod that ran."""


class ValidationPodFailed(KubeActionResult):
    """The validation pod did not succeed; it is deleted after."""

    NAME: ClassVar[str] = "validation-pod-failed"

    pod: NamespacedName
    """The pod that was run."""
    reason: ValidationPodFailureReason
    """Why."""
    message: Message = ""
    """Detail for operators: the phase, the containers' exit codes or the API's refusal."""


class ValidationObserved(KubeEvent):
    """The validator pods on the node, if the policy names any."""

    NAME: ClassVar[str] = "validation-observed"

    validator_pods: Count
    """Pods on the node matching the policy's validator selector."""
    ready_pods: Count
    """Of those, Running with every container Ready."""
    not_ready: tuple[NamespacedName, ...] = Field(default=(), max_length=32)
    """Validator pods not Ready yet (the first 32)."""
