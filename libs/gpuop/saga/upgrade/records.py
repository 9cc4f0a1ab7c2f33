"""The durable record of one node's upgrade saga, as stored in the KV bucket `gpuop_sagas`.

The upgrade orchestrator keeps one `NodeSaga` per node and rollout; the decision core
(`gpuop.saga.upgrade.core`) reads one and returns the next, and the orchestrator's runtime writes
that with compare-and-set before it acts (outbox). Everything the core needs to carry on
after a crash is here, and nothing else: the state and the pending step with its deadline,
what was done to the node's drivers in this upgrade, and what to undo.

The record is frozen and serialises to JSON (`to_json` / `from_json`). `new_saga` builds the
first record of a rollout for one node from the policy and what the node runs now.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from pydantic import AwareDatetime, ConfigDict, Field
from pydantic.dataclasses import dataclass

from gpuop.events.device import OperandService
from gpuop.events.driver import (
    MAX_PUBLIC_KEYS,
    CaBundle,
    Component,
    Flavour,
    MinisignPublicKey,
    ModuleParameters,
)
from gpuop.events.fields import (
    Attempt,
    BootId,
    CorrelationId,
    Count,
    KernelRelease,
    Message,
    NodeName,
    PoolName,
    Record,
    Sha256,
    Token,
    Version,
)
from gpuop.events.upgrade import SagaReason, UpgradeState
from gpuop.policy import GPUClusterPolicySpec, parameters
from gpuop.policy.drivers import ComponentSpec, GpuComponentSpec
from gpuop.saga.machine import StepResult, StoredRecord
from gpuop.saga.upgrade.steps import Step, StepKind
from gpuop.saga.upgrade.table import Transition

COMPONENT_ORDER: tuple[Component, ...] = (Component.GPU, Component.OFED)
"""Every ordered list of components in a saga follows this order."""
HISTORY_LIMIT = 64
"""Step outcomes kept in the record; older ones are dropped (the event log keeps them all)."""


class Target(Record):
    """The driver one component is upgraded to."""

    version: Version
    """Version to install and load."""
    source: str | None = Field(default=None, max_length=2048)
    """Where driver-manager fetches it; None: the package must already be on the host."""
    sha256: Sha256 | None = None
    """The package's expected digest, when the policy names one."""
    public_keys: tuple[MinisignPublicKey, ...] = Field(default=(), max_length=MAX_PUBLIC_KEYS)
    """Keys trusted to sign the source's index, as the policy lists them."""
    allow_unsigned: bool = False
    """The policy accepts the source's index unsigned."""
    ca_bundle: CaBundle | None = None
    """The CA certificates the https source's certificate must chain to."""
    flavour: Flavour | None = None
    """The GPU driver's kernel modules, the policy's `kernelModuleType` resolved for the node
    when the saga started (`gpuop.policy.flavours`); None: OFED, or not resolved (any)."""
    parameters: ModuleParameters = Field(default_factory=dict)
    """The parameters the GPU driver's modules are loaded with, the policy's
    `kernelModuleParameters` as modprobe takes them; empty: none (OFED's always)."""

    @classmethod
    def of(cls, spec: ComponentSpec, flavour: Flavour | None = None) -> Target:
        """The target a component's policy spec names: its version, source and how to trust
        the source, kept together so the install uses the keys of the source it fetches."""
        return cls(
            version=spec.version,
            source=spec.source,
            sha256=spec.sha256,
            public_keys=spec.public_keys or (),
            allow_unsigned=bool(spec.allow_unsigned),
            ca_bundle=spec.ca_bundle,
            flavour=flavour,
            parameters=(
                parameters.options(spec.kernel_module_parameters)
                if isinstance(spec, GpuComponentSpec)
                else {}
            ),
        )


@dataclass(
    frozen=True, slots=True, config=ConfigDict(extra="ignore", use_attribute_docstrings=True)
)
class Outcome:
    """One ended step, for operators and for the record's own audit trail.

    A slotted dataclass rather than a `Record`, with the same JSON: the orchestrator keeps
    every node's saga decoded (`SagaStore`), and a model instance costs six times the memory
    (its `__dict__` and set of fields), which the history multiplies by up to
    `HISTORY_LIMIT` per node."""

    at: AwareDatetime
    """When the core learned how it ended."""
    attempt: Attempt
    """The saga's attempt."""
    state: UpgradeState
    """The state the step belonged to."""
    step: Token
    """The step's token (`unload-gpu`, `drain`)."""
    result: StepResult
    """How it ended."""
    detail: Message = ""
    """What happened, in words."""


class Failure(Record):
    """Why the current attempt failed; set while compensation runs and in upgrade-failed."""

    state: UpgradeState
    """The state whose step failed."""
    step: Token
    """The step that failed."""
    reason: Message
    """Why, in words; it ends up in the node's event and the state-changed event."""
    at: AwareDatetime
    """When the core learned of it."""


class NodeSaga(StoredRecord):
    """Where one node's driver upgrade stands, durable across any crash."""

    saga_id: CorrelationId
    """The saga's id: the correlation id of its messages and the seed of its command ids."""
    node: NodeName
    """The node being upgraded."""
    rollout_id: CorrelationId
    """The rollout this saga belongs to."""
    pool: PoolName | None = None
    """The driver pool the node was in when the saga started (`driver.pools[].name`), whose
    drivers, parallelism and canary it follows; None: the default drivers."""
    reason: SagaReason = SagaReason.VERSION_CHANGE
    """Why the saga started (`start_reason`)."""
    bring_up: bool = False
    """A new node, with no driver and no GPU pods: admitted without an upgrade slot, kept
    behind the taint `DRIVER_NOT_READY_TAINT` instead of cordoned and drained."""
    kernel_release: KernelRelease | None = None
    """The kernel the node ran while the saga worked on it (the latest inventory before the
    saga ended): once done, the kernel its driver was installed for."""
    inventory_hash: Sha256 | None = None
    """The latest inventory the saga saw before it ended (`HardwareDiscovered.inventory_hash`):
    only a later one can start a reinstall, never one taken while the driver was reloaded."""
    state: UpgradeState = UpgradeState.UPGRADE_REQUIRED
    """Current state: the action still pending."""
    attempt: Attempt = 1
    """Which try of the upgrade this is; a retry after upgrade-failed counts up."""
    step: Step = Step(kind=StepKind.ADMISSION)
    """The pending step inside the state (a sub-step of the reload, such as `unload-gpu`)."""
    step_started: AwareDatetime
    """When the pending step started."""
    deadline: AwareDatetime | None = None
    """When the pending step fails (or, in wait-for-jobs, moves on); None: no time limit."""
    components: tuple[Component, ...] = Field(min_length=1, max_length=2)
    """Driver stacks this saga upgrades, in one cordon and drain, in `COMPONENT_ORDER`."""
    targets: dict[Component, Target] = Field(min_length=1, max_length=2)
    """Driver each component in `components` is upgraded to."""
    previous_versions: dict[Component, Version] = Field(default_factory=dict, max_length=2)
    """Version each component ran before the upgrade: the rollback target."""
    previous_flavour: Flavour | None = None
    """The kernel modules the GPU driver ran before the upgrade; None: none ran, or unknown."""
    previous_parameters: ModuleParameters | None = None
    """The parameters the GPU driver's modules ran with before (the node's last saga's),
    which a rollback loads them with again; None: unknown, or the GPU driver not upgraded."""
    expected_devices: dict[Component, Count] = Field(default_factory=dict, max_length=2)
    """Devices validation must find per component; absent: any number passes."""
    operands: tuple[OperandService, ...] = tuple(OperandService)
    """Operand services on the node that must confirm a pause before the unload."""
    paused: tuple[OperandService, ...] = ()
    """Operands that confirmed the pending pause."""
    operands_paused: bool = False
    """A pause was sent and no resume since: compensation must resume the operands."""
    cordoned: bool = False
    """gpuop cordoned the node and has not seen it uncordoned since."""
    initially_unschedulable: bool = False
    """The node was cordoned before the upgrade began; gpuop never uncordons it."""
    canary: bool = False
    """Admitted as one of the rollout's canary nodes."""
    touched: tuple[Component, ...] = ()
    """Components whose running driver gpuop changed (unloaded, or rebooted away) and that
    have not validated since: a failure now needs a rollback, not just an uncordon. Kept
    across attempts, so a retry never uncordons a node whose driver is broken."""
    reload_round: int = Field(default=1, ge=1, le=100)
    """Which pass of the reload this is; a confirmed reboot starts the next one."""
    reboots: int = Field(default=0, ge=0, le=100)
    """Reboots in this attempt (at most one: a second in-use failure fails the attempt)."""
    rolled_back: tuple[Component, ...] = ()
    """Components the rollback restored in this attempt."""
    boot_id: BootId | None = None
    """The node's boot id as last observed."""
    boot_id_at_reboot: BootId | None = None
    """The boot id in which the reboot was decided; a different one confirms it."""
    failure: Failure | None = None
    """Why this attempt failed, while compensating and in upgrade-failed."""
    last_error: Message = ""
    """The most recent failure's reason, kept across retries."""
    retry_at: AwareDatetime | None = None
    """When an upgrade-failed saga is tried again; None: not retried."""
    sequence: int = Field(default=0, ge=0)
    """Transitions made so far; seeds the ids of labels and Kubernetes events."""
    last_transitions: tuple[Transition, ...] = Field(default=(), max_length=32)
    """The transitions of the latest decision that made any (the last of them is number
    `sequence`): published again, under the same ids, by a leader that takes the saga over,
    since its predecessor may have stored the decision and died before publishing them."""
    history: tuple[Outcome, ...] = Field(default=(), max_length=HISTORY_LIMIT)
    """The latest step outcomes, oldest first."""

    def ended(self, at: datetime, result: str, detail: str) -> NodeSaga:
        """This record with the pending step's outcome (`result`, a `StepResult`) appended."""
        outcome = Outcome(
            at=at,
            attempt=self.attempt,
            state=self.state,
            step=self.step.token,
            result=StepResult(result),
            detail=detail,
        )
        return self.with_outcome(outcome)

    def with_outcome(self, outcome: Outcome) -> NodeSaga:
        """This record with `outcome` appended to its bounded history."""
        return self.model_copy(update={"history": (*self.history, outcome)[-HISTORY_LIMIT:]})


def ordered(components: Iterable[Component]) -> tuple[Component, ...]:
    """`components` without duplicates, in `COMPONENT_ORDER`."""
    wanted = set(components)
    return tuple(c for c in COMPONENT_ORDER if c in wanted)


def desired_targets(
    policy: GPUClusterPolicySpec, pool: str | None = None, flavour: Flavour | None = None
) -> dict[Component, Target]:
    """The driver the policy wants on the nodes of `pool` (None: the nodes no pool
    selects), per component it manages, the GPU driver's modules of `flavour` (the node's
    resolved `kernelModuleType`); `KeyError` for a pool the policy lacks."""
    gpu, ofed = policy.driver.components_of(pool)
    targets = {Component.GPU: Target.of(gpu, flavour)}
    if ofed is not None:
        targets[Component.OFED] = Target.of(ofed)
    return targets


def components_to_upgrade(
    policy: GPUClusterPolicySpec,
    running: Mapping[Component, str | None],
    pool: str | None = None,
    *,
    flavour: Flavour | None = None,
    running_flavour: Flavour | None = None,
    running_parameters: Mapping[str, Mapping[str, str]] | None = None,
) -> tuple[Component, ...]:
    """Components whose desired version differs from what the node runs (unknown counts),
    and the GPU driver when it runs other kernel modules than `flavour` (`flavour_differs`)
    or its modules with other parameters than the policy's (`running_parameters`, when
    known: a change of them alone reloads the modules, the version staying)."""
    targets = desired_targets(policy, pool, flavour)
    return ordered(
        c
        for c, target in targets.items()
        if running.get(c) != target.version
        or (c is Component.GPU and flavour_differs(target.flavour, running_flavour))
        or (
            c is Component.GPU
            and running_parameters is not None
            and running_parameters != target.parameters
        )
    )


def flavour_differs(wanted: Flavour | None, running: Flavour | None) -> bool:
    """Whether the GPU driver runs other kernel modules than `wanted`: only when both are
    known, so an inventory from a discovery that does not report the flavour (an older one)
    reloads no node."""
    return wanted is not None and running is not None and wanted is not running


def start_reason(
    policy: GPUClusterPolicySpec,
    running: Mapping[Component, str | None],
    kernel_release: str | None,
    last: NodeSaga | None = None,
    pool: str | None = None,
    *,
    flavour: Flavour | None = None,
    running_flavour: Flavour | None = None,
    running_parameters: Mapping[str, Mapping[str, str]] | None = None,
) -> SagaReason | None:
    """Why the node needs a saga, from what it runs now and its `last` saga: None when it
    runs the policy's drivers. A node that runs no GPU driver needs one whatever the
    policy: after `last` was done on another kernel than the running one, it is a kernel
    drift (the modules were built for the old kernel, and the new one has none); else
    `no-driver`. A loaded driver was built for the running kernel (no other loads), so a
    node whose driver came up on a new kernel (packages pre-staged for it) needs nothing.
    A GPU driver of the policy's version but other kernel modules than `flavour` is
    reloaded as for a version change, and so is one whose modules run with other parameters
    (`running_parameters`, when known)."""
    if running.get(Component.GPU) is None:
        drifted = (
            last is not None
            and last.state is UpgradeState.UPGRADE_DONE
            and last.kernel_release is not None
            and kernel_release is not None
            and last.kernel_release != kernel_release
        )
        return SagaReason.KERNEL_DRIFT if drifted else SagaReason.NO_DRIVER
    if components_to_upgrade(
        policy, running, pool,
        flavour=flavour, running_flavour=running_flavour, running_parameters=running_parameters,
    ):  # fmt: skip
        return SagaReason.VERSION_CHANGE
    return None


def parameters_loaded_by(last: NodeSaga | None) -> dict[str, dict[str, str]] | None:
    """The parameters the node's GPU driver modules run with, as far as the log tells: those
    its `last` saga loaded them with, when it ended done; None when unknown (no saga, one not
    done, or one that left the GPU driver alone), which reloads nothing for parameters."""
    if last is None or last.state is not UpgradeState.UPGRADE_DONE:
        return None
    target = last.targets.get(Component.GPU)
    return None if target is None else {m: dict(p) for m, p in target.parameters.items()}


def saga_id_for(rollout_id: str, node: str) -> str:
    """The saga id of `node` in `rollout_id`: stable, so a restarted runtime finds it again."""
    return f"{rollout_id}/{node}"


def reinstall_saga_id(rollout_id: str, node: str, reason: SagaReason, now: datetime) -> str:
    """The id of a second saga of `node` in `rollout_id` (a reinstall after the first was
    done): its own, so that none of its command ids repeats the first's, which the server
    and the node's agent would take for duplicates. Recorded in its `SagaStarted`."""
    return f"{saga_id_for(rollout_id, node)}/{reason}-{int(now.timestamp())}"


def new_saga(
    *,
    node: str,
    rollout_id: str,
    policy: GPUClusterPolicySpec,
    running: Mapping[Component, str | None],
    now: datetime,
    boot_id: str | None = None,
    unschedulable: bool = False,
    operands: Iterable[OperandService] = tuple(OperandService),
    expected_devices: Mapping[Component, int] | None = None,
    pool: str | None = None,
    reason: SagaReason = SagaReason.VERSION_CHANGE,
    bring_up: bool = False,
    kernel_release: str | None = None,
    saga_id: str | None = None,
    flavour: Flavour | None = None,
    running_flavour: Flavour | None = None,
    running_parameters: Mapping[str, Mapping[str, str]] | None = None,
) -> NodeSaga:
    """The first record of `node`'s saga in `rollout_id`, in upgrade-required.

    `running` is the version each component runs now (from the node's inventory), the
    rollback target; `unschedulable` says whether the node is cordoned already, so gpuop
    will leave it cordoned. `saga_id` defaults to `saga_id_for` (a reinstall's is
    `reinstall_saga_id`). `flavour` is the GPU driver's kernel modules as resolved for the
    node (recorded in the GPU target), `running_flavour` the ones it runs,
    `running_parameters` the parameters its modules run with (when known). Raises
    `ValueError` when the node already runs every target.
    """
    components = components_to_upgrade(
        policy, running, pool,
        flavour=flavour, running_flavour=running_flavour, running_parameters=running_parameters,
    )  # fmt: skip
    if not components:
        raise ValueError(f"{node} already runs the desired drivers: nothing to upgrade")
    targets = desired_targets(policy, pool, flavour)
    return NodeSaga(
        pool=pool,
        saga_id=saga_id or saga_id_for(rollout_id, node),
        node=node,
        rollout_id=rollout_id,
        step_started=now,
        components=components,
        targets={c: targets[c] for c in components},
        previous_versions={c: v for c, v in running.items() if c in components and v},
        previous_flavour=running_flavour if Component.GPU in components else None,
        previous_parameters=(
            {m: dict(p) for m, p in running_parameters.items()}
            if running_parameters is not None and Component.GPU in components
            else None
        ),
        expected_devices=dict(expected_devices or {}),
        operands=tuple(dict.fromkeys(operands)),
        initially_unschedulable=unschedulable,
        boot_id=boot_id,
        reason=reason,
        bring_up=bring_up,
        kernel_release=kernel_release,
    )
