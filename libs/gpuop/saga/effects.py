"""What each saga step issues: the commands and Kubernetes actions that start it.

The decision core (`gpuop.saga.core`) calls `step_effects` when a saga enters a step, and
the runtime calls `pending` after a crash to issue again what the stored saga's current
step needs. Both derive everything from the saga record and the policy, with ids from
`ids.step(saga_id, token, attempt)`, so a step issued twice carries the same ids and the
second copy is dropped (by the bus's duplicate window, the agents, the runtime).

Executors get 90% of the step's deadline as their own timeout (`steps.executor_timeout`),
so they report a failure with its reason before the saga's deadline fails the step.
"""

from __future__ import annotations

from gpuop.events import Command, ids
from gpuop.events import device as dev
from gpuop.events import driver as dm
from gpuop.policy import GPUClusterPolicySpec, UpgradePolicy
from gpuop.saga.actions import (
    Cordon,
    Decision,
    DeletePods,
    Drain,
    IssuedCommand,
    KubeAction,
    SetStateLabel,
    Uncordon,
)
from gpuop.saga.records import NodeSaga
from gpuop.saga.steps import Step, StepKind, executor_timeout, limit_seconds

RESUME_STEP = "operands-resume"
"""Token of the ResumeOperands sent in the uncordon step (the Uncordon uses `uncordon`)."""


def issue(saga: NodeSaga, payload: Command, token: str) -> IssuedCommand:
    """`payload` under the id of `token` in the saga's current attempt."""
    return IssuedCommand(
        payload=payload,
        id=ids.step(saga.saga_id, token, saga.attempt),
        step=token,
        attempt=saga.attempt,
    )


def action_id(saga: NodeSaga, token: str) -> str:
    """The id of the Kubernetes action of `token` in the saga's current attempt."""
    return ids.step(saga.saga_id, token, saga.attempt)


def label_id(saga: NodeSaga) -> str:
    """The id of the label write for the saga's latest transition."""
    return ids.label(saga.saga_id, saga.sequence, saga.attempt)


def event_id(saga: NodeSaga) -> str:
    """The id of the Kubernetes Event for the saga's latest transition."""
    return ids.kube_event(saga.saga_id, saga.sequence, saga.attempt)


def _timeout(step: Step, policy: UpgradePolicy, attempt: int) -> int:
    limit = limit_seconds(step, policy, attempt)
    if limit is None:
        raise ValueError(f"step {step.token} has no deadline to take a timeout from")
    return executor_timeout(limit)


def _driver_command(saga: NodeSaga, step: Step, timeout: int, allow_nic_reload: bool) -> Command:
    component = step.component
    if component is None:
        raise ValueError(f"driver step {step.token} names no component")
    target = saga.targets[component]
    if step.kind is StepKind.INSTALL:
        if target.source is None:
            raise ValueError(f"{component} has no driver source to install from")
        return dm.InstallDriver(
            component=component,
            version=target.version,
            source=dm.DriverSource(uri=target.source),
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
        return dm.LoadDriver(component=component, version=target.version, timeout_seconds=timeout)
    if step.kind is StepKind.VALIDATE:
        return dm.ValidateDriver(
            component=component,
            version=target.version,
            expected_devices=saga.expected_devices.get(component),
            timeout_seconds=timeout,
        )
    previous = saga.previous_versions[component]
    if step.kind is StepKind.ROLLBACK:
        return dm.RollbackDriver(component=component, version=previous, timeout_seconds=timeout)
    if step.kind is StepKind.ROLLBACK_VALIDATE:
        return dm.ValidateDriver(
            component=component,
            version=previous,
            expected_devices=saga.expected_devices.get(component),
            timeout_seconds=timeout,
        )
    raise ValueError(f"{step.token} is not a driver step")


def step_effects(
    saga: NodeSaga, spec: GPUClusterPolicySpec
) -> tuple[tuple[IssuedCommand, ...], tuple[KubeAction, ...]]:
    """The commands and Kubernetes actions that start the saga's current step."""
    policy = spec.upgrade_policy
    step, token, attempt = saga.step, saga.step.token, saga.attempt
    kind = step.kind
    if kind is StepKind.CORDON:
        return (), (Cordon(id=action_id(saga, token)),)
    if kind is StepKind.POD_DELETION:
        deletion = policy.pod_deletion
        pods = DeletePods(
            id=action_id(saga, token),
            force=deletion.force,
            timeout_seconds=_timeout(step, policy, attempt),
            delete_empty_dir=deletion.delete_empty_dir,
        )
        return (), (pods,)
    if kind is StepKind.DRAIN:
        drain = Drain(
            id=action_id(saga, token),
            force=policy.drain.force,
            pod_selector=policy.drain.pod_selector,
            timeout_seconds=_timeout(step, policy, attempt),
            delete_empty_dir=policy.drain.delete_empty_dir,
        )
        return (), (drain,)
    if kind is StepKind.OPERANDS_PAUSE:
        pause = dev.PauseOperands(
            components=saga.components, reason=f"driver upgrade of {saga.rollout_id}"
        )
        return (issue(saga, pause, token),), ()
    if kind is StepKind.REBOOT:
        if saga.boot_id_at_reboot is None:
            raise ValueError("a reboot needs the boot id it was decided in")
        reboot = dm.RebootNode(
            boot_id=saga.boot_id_at_reboot,
            reason=f"driver unload failed in use during {saga.rollout_id}",
        )
        return (issue(saga, reboot, token),), ()
    if kind is StepKind.UNCORDON:
        commands: tuple[IssuedCommand, ...] = ()
        if saga.operands_paused:
            resume = dev.ResumeOperands(reason=f"driver upgrade of {saga.rollout_id} ended")
            commands = (issue(saga, resume, RESUME_STEP),)
        actions: tuple[KubeAction, ...] = ()
        if not saga.initially_unschedulable:
            actions = (Uncordon(id=action_id(saga, token)),)
        return commands, actions
    if step.component is not None:
        allow = spec.network.allow_management_nic_reload
        command = _driver_command(saga, step, _timeout(step, policy, attempt), allow)
        return (issue(saga, command, token),), ()
    return (), ()


def pending(saga: NodeSaga, policy: GPUClusterPolicySpec) -> Decision:
    """What to issue again for a saga read back after a crash: its state label, the current
    step's commands and actions, and the public events of its latest transitions, with the
    ids they had when first issued (the bus drops what was published already)."""
    commands, actions = step_effects(saga, policy)
    label = SetStateLabel(id=label_id(saga), value=saga.state)
    return Decision(
        saga=saga,
        commands=commands,
        kube_actions=(label, *actions),
        transitions=saga.last_transitions,
    )
