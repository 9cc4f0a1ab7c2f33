"""What the upgrade's steps issue, the parts several phases share: ids and driver commands.

Each phase (`gpuop.saga.upgrade.phases`) says what its steps issue (`effects`); the machinery calls
it when a saga enters a step, and the runtime again after a crash (`upgrade.pending`), for
what the stored saga's current step needs. Both derive everything from the saga record and
the policy, with ids from `ids.step(saga_id, token, attempt)`, so a step issued twice carries
the same ids and the second copy is dropped (by the bus's duplicate window, the agents, the
runtime).

Executors get 90% of the step's deadline as their own timeout (`steps.executor_timeout`),
so they report a failure with its reason before the saga's deadline fails the step.
"""

from __future__ import annotations

from gpuop.events import Command, ids
from gpuop.events import driver as dm
from gpuop.policy import GPUClusterPolicySpec, UpgradePolicy
from gpuop.saga import machine
from gpuop.saga.machine import Effects
from gpuop.saga.upgrade.records import NodeSaga, Target
from gpuop.saga.upgrade.steps import Step, StepKind, executor_timeout, limit_seconds

RESUME_STEP = "operands-resume"
"""Token of the ResumeOperands sent in the uncordon step (the Uncordon uses `uncordon`)."""


issue = machine.issue
action_id = machine.action_id


def label_id(saga: NodeSaga) -> str:
    """The id of the label write for the saga's latest transition."""
    return ids.label(saga.saga_id, saga.sequence, saga.attempt)


def event_id(saga: NodeSaga) -> str:
    """The id of the Kubernetes Event for the saga's latest transition."""
    return ids.kube_event(saga.saga_id, saga.sequence, saga.attempt)


def timeout(saga: NodeSaga, policy: UpgradePolicy) -> int:
    """The executor's timeout for the saga's pending step (90% of its deadline)."""
    return _timeout(saga.step, policy, saga.attempt)


def _timeout(step: Step, policy: UpgradePolicy, attempt: int) -> int:
    limit = limit_seconds(step, policy, attempt)
    if limit is None:
        raise ValueError(f"step {step.token} has no deadline to take a timeout from")
    return executor_timeout(limit)


_CHECKS = {
    StepKind.VALIDATE: dm.ValidationCheck.NVML,
    StepKind.VALIDATE_CUDA: dm.ValidationCheck.CUDA,
    StepKind.VALIDATE_PEERMEM: dm.ValidationCheck.PEERMEM,
}
"""The driver-manager's rung of each validation step."""


def _source(target: Target) -> dm.DriverSource:
    """The driver source a target names, with how to trust it."""
    if target.source is None:
        raise ValueError(f"no driver source for {target.version}")
    return dm.DriverSource(
        uri=target.source,
        sha256=target.sha256,
        public_keys=target.public_keys,
        allow_unsigned=target.allow_unsigned,
        ca_bundle=target.ca_bundle,
    )


def _driver_command(saga: NodeSaga, step: Step, timeout: int, allow_nic_reload: bool) -> Command:
    component = step.component
    if component is None:
        raise ValueError(f"driver step {step.token} names no component")
    target = saga.targets[component]
    if step.kind in (StepKind.STAGE, StepKind.INSTALL):
        if target.source is None:
            raise ValueError(f"{component} has no driver source to install from")
        verb = dm.StageDriver if step.kind is StepKind.STAGE else dm.InstallDriver
        return verb(
            component=component,
            version=target.version,
            source=_source(target),
            flavour=target.flavour,
            timeout_seconds=timeout,
        )
    if step.kind is StepKind.UNLOAD:
        # only an OFED reload can reset the NIC that carries the default route
        return dm.UnloadDriver(
            component=component,
            timeout_seconds=timeout,
            allow_management_interface=allow_nic_reload and component is dm.Component.OFED,
        )
    if step.kind is StepKind.LOAD:
        return dm.LoadDriver(
            component=component,
            version=target.version,
            timeout_seconds=timeout,
            parameters=target.parameters,
        )
    if step.kind is StepKind.RUNTIME_CONFIGURE:
        # half the time for the answer: a runtime that does not answer is restarted again
        # with its earlier files, and that wait must fit in the step's deadline too
        return dm.ConfigureRuntime(component=component, timeout_seconds=max(1, timeout // 2))
    if step.kind in _CHECKS:
        return dm.ValidateDriver(
            component=component,
            version=target.version,
            expected_devices=saga.expected_devices.get(component),
            timeout_seconds=timeout,
            check=_CHECKS[step.kind],
        )
    previous = saga.previous_versions[component]
    if step.kind is StepKind.ROLLBACK:
        flavour = saga.previous_flavour if component is dm.Component.GPU else None
        source = None
        if flavour is not None and previous == target.version and target.source is not None:
            # a flavour change of one version: the source that has it has the old modules too
            source = _source(target)
        return dm.RollbackDriver(
            component=component, version=previous, source=source, flavour=flavour,
            timeout_seconds=timeout,
            parameters=(saga.previous_parameters or {}) if component is dm.Component.GPU else {},
        )  # fmt: skip
    if step.kind is StepKind.ROLLBACK_VALIDATE:
        return dm.ValidateDriver(
            component=component,
            version=previous,
            expected_devices=saga.expected_devices.get(component),
            timeout_seconds=timeout,
        )
    raise ValueError(f"{step.token} is not a driver step")


def driver_effects(saga: NodeSaga, spec: GPUClusterPolicySpec) -> Effects:
    """The command of a driver step (stage, install, unload, load, validate, rollback) to
    the node's driver-manager."""
    step = saga.step
    if step.component is None:
        return (), ()
    policy = spec.upgrade_policy
    allow = spec.network.allow_management_nic_reload
    command = _driver_command(saga, step, _timeout(step, policy, saga.attempt), allow)
    return (issue(saga, command, step.token),), ()
