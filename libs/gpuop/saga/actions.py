"""What the decision core asks for: node-agent commands and Kubernetes actions, in a Decision.

`gpuop.saga.upgrade.core.decide` returns a `Decision`; the orchestrator's runtime writes its saga
with compare-and-set first, then publishes its commands (with their ids, so a re-publish is
dropped) and executes its Kubernetes actions through `gpuop.kube`. The outcome of every
action comes back as a `gpuop.events.kube` event carrying the action's `id` as `action_id`
(`NodeCordoned`, `NodeUncordoned`, `NodeUntainted`, `PodsDeleted` / `PodDeletionFailed`,
`DrainCompleted` / `DrainFailed`, `ValidationPodSucceeded` / `ValidationPodFailed`); labels,
the taint and Kubernetes Events have no outcome the core waits for.

Every action carries a deterministic id (`ids.step(saga_id, step, attempt)`), so executing
one twice (a crash between acting and recording) can be recognised and is harmless.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuop.events.driver import Component
from gpuop.events.upgrade import UpgradeState
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import machine
from gpuop.saga.machine import IssuedCommand
from gpuop.saga.upgrade.records import NodeSaga

STATE_LABEL = "gpuop.io/driver-upgrade-state"
"""The node label that mirrors the saga's state (upstream's label values)."""
EVENT_REASON = "DriverUpgrade"
"""Reason of the Kubernetes Events the saga records on the node."""


@dataclass(frozen=True)
class Cordon:
    """Mark the node unschedulable."""

    id: str
    label: UpgradeState | None = None
    """Also set `STATE_LABEL` to this value, in the same write. The core leaves it unset; the
    outbox folds the decision's `SetStateLabel` in here, sparing the API server a request."""


@dataclass(frozen=True)
class Uncordon:
    """Mark the node schedulable; never issued for a node that was cordoned before."""

    id: str
    label: UpgradeState | None = None
    """As for `Cordon.label`."""


@dataclass(frozen=True)
class Taint:
    """Put the taint `DRIVER_NOT_READY_TAINT:NoSchedule` on a node brought up
    (`NodeSaga.bring_up`), so nothing is scheduled there before its driver works; no outcome
    the core waits for."""

    id: str


@dataclass(frozen=True)
class Untaint:
    """Remove `DRIVER_NOT_READY_TAINT` from a node brought up, once its driver validated."""

    id: str


@dataclass(frozen=True)
class DeletePods:
    """Delete (evict) the node's pods, Running or Pending, that hold a device whose driver
    the saga reloads, as `gpuop.kube.pods.holds` selects them per component: for `gpu`,
    those requesting `nvidia.com/gpu*` or `nvidia.com/mig-*` resources or holding a DRA
    ResourceClaim allocated by NVIDIA's GPU DRA drivers; for `ofed`, those requesting RDMA
    (`rdma/*`) or SR-IOV resources. A pod of another component's devices stays."""

    id: str
    components: tuple[Component, ...]
    """The components the saga upgrades (`NodeSaga.components`)."""
    force: bool
    """Also delete pods no controller manages."""
    timeout_seconds: int
    """How long to wait for them to be gone before reporting `PodDeletionFailed`."""
    delete_empty_dir: bool
    """Also delete pods with emptyDir volumes."""


@dataclass(frozen=True)
class Drain:
    """Drain the node as `kubectl drain` does (Eviction API, PDBs honoured, DaemonSet pods
    and drain-skip pods left)."""

    id: str
    force: bool
    """Also evict pods no controller manages."""
    pod_selector: str
    """Only pods matching this label selector; empty: every pod."""
    timeout_seconds: int
    """How long the drain may take before reporting `DrainFailed`."""
    delete_empty_dir: bool
    """Also evict pods with emptyDir volumes."""


@dataclass(frozen=True)
class RunValidationPod:
    """Run the validation ladder's pod on the cordoned node: one container requesting one
    `nvidia.com/gpu`, bound by `nodeName`, tolerating the cordon's and gpuop's taints; wait
    for it to end, delete it, and report `ValidationPodSucceeded` or `ValidationPodFailed`.
    With `device_class`, the pod holds a ResourceClaim for one device of that DeviceClass
    instead, and is pinned to the node by affinity (the scheduler allocates the claim);
    without, the executor asks the same of a node whose device plugin last said it serves
    its GPUs through DRA (the upgrade's and the remediation's pod rung there)."""

    id: str
    image: str
    command: tuple[str, ...]
    namespace: str
    """Empty: the orchestrator's own."""
    runtime_class_name: str
    """Empty: none."""
    timeout_seconds: int
    """How long the pod may take to succeed before reporting `ValidationPodFailed`."""
    device_class: str = ""
    """Empty: one `nvidia.com/gpu`, or on a node serving DRA one `gpu.nvidia.com` device;
    else the DeviceClass its ResourceClaim asks one device of (`gpu.nvidia.com`: the
    device-API switch's validation of a node it switched to DRA)."""
    gpu_uuids: tuple[str, ...] = ()
    """With `device_class`: the GPUs the claim must be given, tolerating the quarantine's
    device taint (a device quarantine's pod rung validates the GPUs it reset, not another);
    empty: any one device."""
    all_gpus: bool = False
    """The `preflight` rung's diagnostic: the pod holds every GPU of the node (as many
    `nvidia.com/gpu` as its capacity counts, or a claim for all the devices of its slices),
    not one; a failing diagnostic's last log lines are the failure's message."""


def preflight_pod(
    action: str, spec: GPUClusterPolicySpec, timeout_seconds: int
) -> RunValidationPod:
    """The preflight rung's pod (`upgradePolicy.validation.preflight`), for any kind's
    ladder: the admin's diagnostic holding every GPU of the node."""
    preflight = spec.upgrade_policy.validation.preflight
    if preflight is None:  # the policy's validation refuses the rung without it
        raise ValueError("the preflight rung without upgradePolicy.validation.preflight")
    return RunValidationPod(
        id=action, image=preflight.image, command=preflight.command,
        namespace=preflight.namespace, runtime_class_name=preflight.runtime_class_name,
        timeout_seconds=timeout_seconds, all_gpus=True,
    )  # fmt: skip


@dataclass(frozen=True)
class SetStateLabel:
    """Set `STATE_LABEL` on the node to the saga's state."""

    id: str
    value: UpgradeState


@dataclass(frozen=True)
class RecordEvent:
    """Record a Kubernetes Event on the node (reason `EVENT_REASON` unless given)."""

    id: str
    reason: str
    message: str
    warning: bool
    """Type `Warning` instead of `Normal`."""


KubeAction = (
    Cordon
    | Uncordon
    | Taint
    | Untaint
    | DeletePods
    | Drain
    | RunValidationPod
    | SetStateLabel
    | RecordEvent
)
"""Every Kubernetes action the core can order."""


Decision = machine.Decision[NodeSaga, UpgradeState]
"""What one event did to one upgrade saga: the saga after it (persist it with compare-and-set
before acting, when it differs), the commands to publish, the Kubernetes actions to execute,
the moves made (each published as a `NodeUpgradeStateChanged`)."""

__all__ = [
    "EVENT_REASON",
    "STATE_LABEL",
    "Cordon",
    "Decision",
    "DeletePods",
    "Drain",
    "IssuedCommand",
    "KubeAction",
    "RecordEvent",
    "RunValidationPod",
    "SetStateLabel",
    "Taint",
    "Uncordon",
    "Untaint",
]
