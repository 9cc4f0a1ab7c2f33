"""The upgrade saga's public face: node states and rollout progress.

The upgrade orchestrator publishes these, and only it. `NodeUpgradeStateChanged` goes out on
every state change of a node's saga, on the subject `gpuop.evt.upgrade.<node>.<state>`
named after the NEW state, so external tools can subscribe to exactly the states they care
about (`gpuop.evt.upgrade.*.upgrade-failed`) with any NATS client. The rollout events describe
the whole rollout; they are published with the node token `subjects.CLUSTER` (`_cluster`),
which is the publisher's job (`new_event(..., node=subjects.CLUSTER)`).

The state names are upstream's node-label values (NVIDIA/k8s-operator-libs), so operators who
know the GPU and Network Operators recognise them; `operands-pause-required`,
`driver-reload-required`, `reboot-required` and `rollback-required` are ours. These events are
a versioned public contract: change a field only by adding a new version of the model.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import Field, StringConstraints

from gpuop.events.device import OperandService
from gpuop.events.driver import Component, Flavour, ModuleParameters, hash_with_parameters
from gpuop.events.envelope import Event, StateChangedEvent
from gpuop.events.fields import (
    Attempt,
    BootId,
    CorrelationId,
    Count,
    DocumentedEnum,
    KernelRelease,
    Message,
    NodeName,
    PoolName,
    Seconds,
    Version,
)

DOMAIN = "upgrade"


class UpgradeState(DocumentedEnum):
    """Where a node is in its driver upgrade; each state names the action still pending."""

    UPGRADE_REQUIRED = "upgrade-required"
    """Targeted by a rollout or retried after a failure; admission moves it to cordon-required."""
    CORDON_REQUIRED = "cordon-required"
    """Admitted to a slot; once the node is unschedulable, goes to wait-for-jobs-required."""
    WAIT_FOR_JOBS_REQUIRED = "wait-for-jobs-required"
    """Cordoned; when no selected job runs or the wait's deadline passes, pod-deletion-required."""
    POD_DELETION_REQUIRED = "pod-deletion-required"
    """Jobs done; GPU pods are deleted, then drain-required (upgrade-failed if some stay)."""
    DRAIN_REQUIRED = "drain-required"
    """GPU pods gone; drains if enabled, then operands-pause-required (upgrade-failed if stuck)."""
    OPERANDS_PAUSE_REQUIRED = "operands-pause-required"
    """Node empty; once every operand confirmed its pause, goes to driver-reload-required."""
    DRIVER_RELOAD_REQUIRED = "driver-reload-required"
    """Operands paused; unload, install, load, then validation-required (or reboot-required)."""
    REBOOT_REQUIRED = "reboot-required"
    """Unload failed and policy allows a reboot; a new boot id moves it back to a reload."""
    ROLLBACK_REQUIRED = "rollback-required"
    """A step after the unload failed; restores the previous driver, then validation-required."""
    VALIDATION_REQUIRED = "validation-required"
    """Driver loaded; uncordon-required once it validates, else rollback-required or failed."""
    UNCORDON_REQUIRED = "uncordon-required"
    """Validated; resumes operands, uncordons unless cordoned before, then upgrade-done."""
    UPGRADE_DONE = "upgrade-done"
    """Runs the target driver, validated, schedulable; a new rollout makes it upgrade-required."""
    UPGRADE_FAILED = "upgrade-failed"
    """A step failed for good and compensation ran; a backoff or an operator retries it."""

    @property
    def remediation_folds_in(self) -> bool:
        """Whether a GPU remediation that starts while the node's upgrade is here folds into
        the upgrade instead of running on its own: admitted, with the driver reload (or the
        reboot it falls back to) still ahead and the validation ladder after it, so the
        upgrade's own reload resets the faulty GPUs and its validation checks them. Not once
        the reload is behind (validation-required, uncordon-required: nothing would reset a
        GPU that failed after it), nor in rollback-required (it restores only the components
        it touched, so it may reload no GPU driver at all), nor before admission or after
        the end (then the remediation waits for its own admission: one saga at a time)."""
        return self in _REMEDIATION_FOLDS_IN


TERMINAL_STATES = frozenset({UpgradeState.UPGRADE_DONE, UpgradeState.UPGRADE_FAILED})
_REMEDIATION_FOLDS_IN = frozenset(
    {
        UpgradeState.CORDON_REQUIRED,
        UpgradeState.WAIT_FOR_JOBS_REQUIRED,
        UpgradeState.POD_DELETION_REQUIRED,
        UpgradeState.DRAIN_REQUIRED,
        UpgradeState.OPERANDS_PAUSE_REQUIRED,
        UpgradeState.DRIVER_RELOAD_REQUIRED,
        UpgradeState.REBOOT_REQUIRED,
    }
)
"""States in which a node's saga takes no further action by itself."""

DRIVER_NOT_READY_TAINT = "gpuop.io/driver-not-ready"
"""The taint (effect `NoSchedule`) a new node is brought up behind (`SagaStarted.bring_up`):
put on when its saga starts, removed once its driver validated, left on when it failed."""


class SagaReason(DocumentedEnum):
    """Why the orchestrator started a node's saga."""

    VERSION_CHANGE = "version-change"
    """The node runs other driver versions than the policy asks for (a rollout)."""
    KERNEL_DRIFT = "kernel-drift"
    """No GPU driver since the node booted another kernel than its last saga's: reinstalled."""
    NO_DRIVER = "no-driver"
    """The node runs no GPU driver at all (a new node, or a driver gone): it is installed."""


class NodeUpgradeStateChanged(StateChangedEvent):
    """A node's upgrade saga moved to a new state; published on the subject of that state."""

    DOMAIN: ClassVar[str] = DOMAIN
    NAME: ClassVar[str] = "state-changed"

    rollout_id: CorrelationId
    """The rollout this saga belongs to (also the envelope's `correlationid`)."""
    from_state: UpgradeState | None = None
    """State before the change; absent when the saga was just created."""
    to_state: UpgradeState
    """State after the change: the last token of the subject."""
    reason: Message = ""
    """Why the saga moved, in words: the event or deadline that caused it."""
    attempt: Attempt = 1
    """Which try of the upgrade this is for the node (retries after upgrade-failed count up)."""
    components: tuple[Component, ...] = Field(min_length=1, max_length=2)
    """Driver stacks upgraded together in this maintenance window."""
    target_versions: dict[Component, Version] = Field(max_length=2)
    """Version each component is upgraded to."""
    previous_versions: dict[Component, Version] = Field(default_factory=dict, max_length=2)
    """Version each component ran before the upgrade, the rollback target."""


class NodeAdmitted(Event):
    """The admission pass gave an upgrade-required node a slot; recorded so a replay of the
    log admits the same nodes at the same points (admission itself reads no event)."""

    DOMAIN: ClassVar[str] = DOMAIN
    NAME: ClassVar[str] = "admitted"

    rollout_id: CorrelationId
    """The rollout the node's saga belongs to."""
    saga_id: CorrelationId
    """The saga admitted."""
    attempt: Attempt = 1
    """The saga's attempt when admitted."""
    canary: bool = False
    """Admitted as one of the rollout's canary nodes."""
    components: tuple[Component, ...] = Field(default=(), max_length=2)
    """The components this maintenance window upgrades, when admission left some of the
    saga's out (a node skip label, `nvidia.com/<component>-driver-upgrade.skip=true`);
    empty: all of the saga's. Recorded so that a replay narrows the saga alike."""


class SagaStarted(Event):
    """The orchestrator created a node's saga in a rollout (upgrade-required), from these
    inputs and the policy in force; recorded so a replay of the log (`gpuop replay`) builds
    the same saga with `gpuop.saga.new_saga`, at the time of this event."""

    __hash__ = hash_with_parameters
    DOMAIN: ClassVar[str] = DOMAIN
    NAME: ClassVar[str] = "saga-started"

    rollout_id: CorrelationId
    """The rollout the saga belongs to."""
    saga_id: CorrelationId
    """The saga created."""
    running_versions: dict[Component, Version | None] = Field(max_length=2)
    """Version each component ran when the saga was created (null: none or unknown)."""
    boot_id: BootId | None = None
    """The node's boot id from its inventory."""
    unschedulable: bool = False
    """The node was cordoned already, so gpuop leaves it cordoned."""
    operands: tuple[OperandService, ...] = Field(default=(), max_length=len(OperandService))
    """Operand services that must confirm a pause before the unload."""
    expected_devices: dict[Component, Count] = Field(default_factory=dict, max_length=2)
    """Devices validation must find per component; absent: any number passes."""
    pool: PoolName | None = None
    """The driver pool whose drivers the saga installs; absent: the default drivers."""
    reason: SagaReason = SagaReason.VERSION_CHANGE
    """Why the saga started."""
    bring_up: bool = False
    """A new node (no driver, no GPU pods) brought up without an upgrade slot, behind the
    taint `DRIVER_NOT_READY_TAINT` instead of a cordon and a drain."""
    kernel_release: KernelRelease | None = None
    """The kernel the node ran, from its inventory: a later inventory with another kernel
    and no driver is a kernel drift."""
    flavour: Flavour | None = None
    """The GPU driver's kernel modules the saga installs: the policy's `kernelModuleType` as
    resolved for the node from its inventory then (`auto`: its GPUs and the driver branch),
    so a replay installs the same without the inventory; absent: not resolved (any)."""
    running_flavour: Flavour | None = None
    """The kernel modules the node's GPU driver ran (from its inventory); absent: none ran,
    or discovery did not say."""
    running_parameters: ModuleParameters | None = None
    """The parameters the node's GPU driver modules ran with (those its last saga loaded
    them with), loaded again by a rollback; absent: unknown."""


class PolicyApplied(Event):
    """The orchestrator decides with this GPUClusterPolicy spec from now on (published on
    `_cluster` when the spec in force changes, before the first decision made with it), so a
    replay of the log decides with the same policy."""

    DOMAIN: ClassVar[str] = DOMAIN
    NAME: ClassVar[str] = "policy-applied"

    spec: dict[str, Any]
    """The spec as written to the API server (camelCase, unset optionals left out)."""


class RolloutTrigger(DocumentedEnum):
    """What started a rollout."""

    POLICY = "policy"
    """The desired versions in the GPUClusterPolicy changed."""
    CLI = "cli"
    """An operator ran `gpuop upgrade start`."""


class RolloutFailureReason(DocumentedEnum):
    """Why a rollout ended without upgrading every node."""

    NODES_FAILED = "nodes-failed"
    """Some nodes ended in upgrade-failed and no retries are left."""
    SUPERSEDED = "superseded"
    """A newer rollout with other target versions replaced it."""
    ABORTED = "aborted"
    """An operator stopped it."""
    DEADLINE = "deadline"
    """The rollout as a whole ran past its deadline."""


class RolloutEvent(Event):
    """Base of the rollout-wide events; published with the node token `_cluster`."""

    DOMAIN: ClassVar[str] = DOMAIN
    CLUSTER_WIDE: ClassVar[bool] = True
    """Always published about `subjects.CLUSTER`, never about one node."""

    rollout_id: CorrelationId
    """The rollout (also the envelope's `correlationid`)."""


MaxUnavailable = (
    Annotated[int, Field(ge=0, le=1_000_000, strict=True)]
    | Annotated[str, StringConstraints(pattern=r"^(100|[1-9]?[0-9])%$")]
)
"""A node count, or a percentage of the managed nodes such as `25%` (like IntOrString)."""


class RolloutStarted(RolloutEvent):
    """A rollout of new driver versions began."""

    NAME: ClassVar[str] = "rollout-started"

    trigger: RolloutTrigger
    """What started it."""
    target_versions: dict[Component, Version] = Field(min_length=1, max_length=2)
    """Version each component is rolled out to."""
    total: Count
    """Nodes the rollout covers."""
    max_parallel_upgrades: Count
    """Nodes upgraded at once at most (0 means no limit)."""
    max_unavailable: MaxUnavailable
    """Nodes allowed to be unavailable at once, counting NotReady and cordoned ones."""


class RolloutCounts(RolloutEvent):
    """Base of the events that report how far a rollout got."""

    done: Count
    """Nodes in upgrade-done."""
    failed: Count
    """Nodes in upgrade-failed."""
    total: Count
    """Nodes the rollout covers."""


class RolloutProgress(RolloutCounts):
    """How many nodes are in each state; published when the counts change."""

    NAME: ClassVar[str] = "rollout-progress"

    counts: dict[UpgradeState, Count] = Field(max_length=len(UpgradeState))
    """Nodes per state; states without nodes are left out."""
    skipped: Count = 0
    """Of the nodes in upgrade-required, those admission leaves out: a node skip label
    covers every driver they need, or they are cordoned and `cordonedNodes` is `skip`."""


class RolloutCompleted(RolloutCounts):
    """Every node of the rollout reached upgrade-done."""

    NAME: ClassVar[str] = "rollout-completed"

    duration_seconds: Seconds
    """Time from RolloutStarted to now."""


class RolloutFailed(RolloutCounts):
    """The rollout ended without upgrading every node."""

    NAME: ClassVar[str] = "rollout-failed"

    reason: RolloutFailureReason
    """Why it ended."""
    message: Message = ""
    """Detail for operators."""
    failed_nodes: tuple[NodeName, ...] = Field(default=(), max_length=256)
    """Nodes in upgrade-failed (the first 256; `failed` has the full count)."""
