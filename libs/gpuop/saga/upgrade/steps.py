"""The steps inside the saga's states, their names and their order.

A state names the pending action (`driver-reload-required`); a step names the one wait inside
it that has an executor and a deadline (`unload-gpu`). The decision core (`gpuop.saga.upgrade.core`)
keeps the pending step in the saga record and asks this module what comes next. A step's
token names its deadline (`DeadlineExpired.step`) and, with the saga's attempt, seeds the id
of the command or action it issues (`ids.step(saga_id, token, attempt)`), so deciding the
same step again after a crash issues the same ids.

Before the cordon, while the node is still schedulable, cordon-required stages the
new packages (`stage_plan`):

    stage-gpu, stage-ofed          fetch, verify and check against the node's kernel, so a
                                   package that cannot be installed fails the node before it
                                   is cordoned or drained (nothing to undo)

Once the node is cordoned and drained, the saga reloads all its components at once, in order:

    install-gpu, install-ofed      install the staged packages while the old drivers still
                                   run, so a failed install needs no rollback (only an uncordon)
    unload-gpu, unload-ofed        the GPU stack first: nvidia_peermem sits on the RDMA core
    load-ofed, load-gpu            the network stack first, for the same reason
    runtime-configure-gpu          with `upgradePolicy.configureRuntime`: the container
                                   runtime's `nvidia` handler with CDI, restarted while the
                                   node is drained (a no-op when it is configured already)
    validate-gpu, validate-ofed    in validation-required, the ladder's rungs (the policy's
    validate-cuda-gpu              `upgradePolicy.validation`): NVML per component, then a
    validate-peermem-gpu           CUDA context on every GPU, nvidia_peermem on the RDMA
    validate-pod                   core (OFED upgraded too), a GPU pod on the cordoned node,
    validate-preflight             the admin's diagnostic holding every GPU of the node

After a confirmed reboot the next round repeats the unloads and loads (the installs are on
disk already) with the round in the token: `unload-gpu-2`. A rollback restores the touched
components in unload order (`rollback-gpu`) and validates them (`rollback-validate-gpu`).
"""

from __future__ import annotations

from pydantic import Field

from gpuop.events.driver import Component
from gpuop.events.fields import DocumentedEnum, Record
from gpuop.policy import UpgradePolicy, Validation

INSTALL_ORDER: tuple[Component, ...] = (Component.GPU, Component.OFED)
UNLOAD_ORDER: tuple[Component, ...] = (Component.GPU, Component.OFED)
LOAD_ORDER: tuple[Component, ...] = (Component.OFED, Component.GPU)
MAX_AGENT_TIMEOUT = 7 * 86400
"""The longest `timeout_seconds` a command accepts."""


class StepKind(DocumentedEnum):
    """What a step waits for."""

    ADMISSION = "admission"
    """upgrade-required: a parallel slot (no deadline)."""
    STAGE = "stage"
    """A component's new package to be fetched, verified and checked, before the cordon."""
    CORDON = "cordon"
    """The node to be unschedulable."""
    WAIT_FOR_JOBS = "wait-for-jobs"
    """Selected jobs to finish; the deadline moves on instead of failing."""
    POD_DELETION = "pod-deletion"
    """The node's GPU pods to be gone."""
    DRAIN = "drain"
    """The drain to finish."""
    OPERANDS_PAUSE = "operands-pause"
    """Every operand to confirm its pause."""
    INSTALL = "install"
    """A component's new package to be installed."""
    UNLOAD = "unload"
    """A component's running modules to be unloaded."""
    LOAD = "load"
    """A component's new modules to be loaded."""
    REBOOT = "reboot"
    """The node to report a new boot id."""
    RUNTIME_CONFIGURE = "runtime-configure"
    """The container runtime to have the `nvidia` handler with CDI, restarted and answering."""
    VALIDATE = "validate"
    """A component's new driver to validate: the ladder's NVML rung."""
    VALIDATE_CUDA = "validate-cuda"
    """The ladder's CUDA rung: a context on every GPU, from the driver-manager."""
    VALIDATE_PEERMEM = "validate-peermem"
    """The ladder's peermem rung: nvidia_peermem registered with the RDMA core."""
    VALIDATE_RESUME = "validate-resume"
    """Before the pod rung: every paused operand to confirm its resume, so the device plugin
    advertises the GPUs the pod requests (a rollback pauses them again first)."""
    VALIDATE_POD = "validate-pod"
    """The ladder's pod rung: a pod requesting one GPU to succeed on the cordoned node."""
    VALIDATE_PREFLIGHT = "validate-preflight"
    """The ladder's preflight rung: the policy's diagnostic, in a pod holding every GPU of
    the cordoned node, to exit 0 within `validation.preflight.deadlineSeconds`."""
    ROLLBACK = "rollback"
    """A component's previous driver to be restored."""
    ROLLBACK_VALIDATE = "rollback-validate"
    """A restored component to validate."""
    UNCORDON = "uncordon"
    """The node to be schedulable again (operands resumed)."""
    BACKOFF = "backoff"
    """upgrade-failed: the retry backoff to pass."""
    DONE = "done"
    """upgrade-done: nothing."""
    FAILED = "failed"
    """upgrade-failed with no retry left: nothing."""


DRIVER_KINDS = frozenset(
    {
        StepKind.STAGE,
        StepKind.INSTALL,
        StepKind.UNLOAD,
        StepKind.LOAD,
        StepKind.RUNTIME_CONFIGURE,
        StepKind.VALIDATE,
        StepKind.VALIDATE_CUDA,
        StepKind.VALIDATE_PEERMEM,
        StepKind.ROLLBACK,
        StepKind.ROLLBACK_VALIDATE,
    }
)
"""Steps that command one component's driver-manager."""


class Step(Record):
    """One step: its kind, the component it is about, and the reload round."""

    kind: StepKind
    """What the step waits for."""
    component: Component | None = None
    """The driver component, for driver steps."""
    round: int = Field(default=1, ge=1, le=100)
    """The reload round (a confirmed reboot starts round 2)."""

    @property
    def token(self) -> str:
        """The step's name in deadlines and command ids: `unload-gpu`, `unload-gpu-2`."""
        parts = [self.kind.value]
        if self.component is not None:
            parts.append(self.component.value)
        if self.round > 1:
            parts.append(str(self.round))
        return "-".join(parts)


def stage_plan(
    components: tuple[Component, ...], installable: frozenset[Component]
) -> tuple[Step, ...]:
    """The stage steps of cordon-required, before the cordon: one per component the saga
    installs from a source, in install order."""
    return tuple(
        Step(kind=StepKind.STAGE, component=c)
        for c in INSTALL_ORDER
        if c in components and c in installable
    )


def reload_plan(
    components: tuple[Component, ...],
    installable: frozenset[Component],
    round_: int,
    configure_runtime: bool = False,
) -> tuple[Step, ...]:
    """The steps of driver-reload-required; installs only in round 1 and with a source; with
    `configure_runtime`, the runtime's handler last, once the GPU driver is loaded."""
    installs = tuple(
        Step(kind=StepKind.INSTALL, component=c)
        for c in INSTALL_ORDER
        if c in components and c in installable and round_ == 1
    )
    unloads = tuple(
        Step(kind=StepKind.UNLOAD, component=c, round=round_)
        for c in UNLOAD_ORDER
        if c in components
    )
    loads = tuple(
        Step(kind=StepKind.LOAD, component=c, round=round_) for c in LOAD_ORDER if c in components
    )
    runtime = (
        (Step(kind=StepKind.RUNTIME_CONFIGURE, component=Component.GPU, round=round_),)
        if configure_runtime and Component.GPU in components
        else ()
    )
    return installs + unloads + loads + runtime


def validation_plan(
    components: tuple[Component, ...], rollback: bool, validation: Validation, operands: bool
) -> tuple[Step, ...]:
    """The steps of validation-required: the new drivers' ladder, or the restored drivers'
    NVML check (a rollback's own failure leaves the node cordoned whatever the rungs say).
    With `operands` (the saga paused some), the pod rung starts by resuming them."""
    if rollback:
        return tuple(
            Step(kind=StepKind.ROLLBACK_VALIDATE, component=c)
            for c in UNLOAD_ORDER
            if c in components
        )
    steps = [Step(kind=StepKind.VALIDATE, component=c) for c in UNLOAD_ORDER if c in components]
    for rung in validation.ladder():
        if rung == "cuda" and Component.GPU in components:
            steps.append(Step(kind=StepKind.VALIDATE_CUDA, component=Component.GPU))
        elif rung == "peermem" and Component.OFED in components:
            steps.append(Step(kind=StepKind.VALIDATE_PEERMEM, component=Component.GPU))
        elif rung in ("pod", "preflight"):
            # the pods ask for GPUs the device plugin advertises only once resumed
            if operands and Step(kind=StepKind.VALIDATE_RESUME) not in steps:
                steps.append(Step(kind=StepKind.VALIDATE_RESUME))
            kind = StepKind.VALIDATE_POD if rung == "pod" else StepKind.VALIDATE_PREFLIGHT
            steps.append(Step(kind=kind))
    return tuple(steps)


def rollback_plan(components: tuple[Component, ...]) -> tuple[Step, ...]:
    """The steps of rollback-required, in unload order."""
    return tuple(Step(kind=StepKind.ROLLBACK, component=c) for c in UNLOAD_ORDER if c in components)


def after(plan: tuple[Step, ...], step: Step) -> Step | None:
    """The step following `step` in `plan`; None after the last (or if it is not in it)."""
    if step not in plan:
        return None
    index = plan.index(step)
    return plan[index + 1] if index + 1 < len(plan) else None


def limit_seconds(step: Step, policy: UpgradePolicy, attempt: int) -> float | None:
    """How long `step` may take under `policy`; None for steps without a deadline."""
    deadlines = policy.deadlines
    preflight = policy.validation.preflight
    limits: dict[StepKind, float] = {
        StepKind.CORDON: deadlines.cordon,
        StepKind.WAIT_FOR_JOBS: policy.wait_for_jobs_limit,
        StepKind.POD_DELETION: policy.pod_deletion_limit,
        StepKind.DRAIN: policy.drain_limit,
        StepKind.OPERANDS_PAUSE: deadlines.operands_pause,
        StepKind.STAGE: deadlines.driver_stage,
        StepKind.INSTALL: deadlines.driver_install,
        StepKind.UNLOAD: deadlines.driver_unload,
        StepKind.LOAD: deadlines.driver_load,
        StepKind.REBOOT: deadlines.reboot,
        StepKind.RUNTIME_CONFIGURE: deadlines.runtime_configure,
        StepKind.VALIDATE: deadlines.validation,
        StepKind.VALIDATE_CUDA: deadlines.validation_cuda,
        StepKind.VALIDATE_PEERMEM: deadlines.validation_peermem,
        StepKind.VALIDATE_RESUME: deadlines.operands_pause,
        StepKind.VALIDATE_POD: deadlines.validation_pod,
        StepKind.VALIDATE_PREFLIGHT: (
            preflight.deadline_seconds if preflight else deadlines.validation_pod
        ),
        StepKind.ROLLBACK: deadlines.rollback,
        StepKind.ROLLBACK_VALIDATE: deadlines.validation,
        StepKind.UNCORDON: deadlines.uncordon,
        StepKind.BACKOFF: policy.backoff(attempt),
    }
    return limits.get(step.kind)


def executor_timeout(limit: float) -> int:
    """The timeout given to whoever executes a step: 90% of its deadline, so the executor's
    own failure, with its reason, normally arrives before the saga's deadline does."""
    return max(1, min(MAX_AGENT_TIMEOUT, int(limit * 0.9)))
