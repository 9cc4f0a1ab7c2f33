"""A driver for the decision core in tests: a saga, a policy, a fake time, and answers.

`Run` feeds events to `core.decide` the way the orchestrator's runtime would (with the
saga each decision returns), keeps every decision, and can answer the pending step the way
its executor would: `ok()` succeeds it, `expire()` fires its deadline.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from gpuop.events import Event, ids, kube
from gpuop.events import device as dev
from gpuop.events import driver as dm
from gpuop.events import hardware as hw
from gpuop.events.driver import Component
from gpuop.events.fields import NamespacedName
from gpuop.events.upgrade import UpgradeState
from gpuop.policy import ComponentSpec, DriverSpec, GPUClusterPolicySpec, UpgradePolicy
from gpuop.saga import actions
from gpuop.saga.actions import Decision
from gpuop.saga.upgrade import core, records
from gpuop.saga.upgrade.steps import StepKind

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
BOOT_A = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa"
BOOT_B = "bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb"
GPU_OLD, GPU_NEW = "570.1", "580.2"
OFED_OLD, OFED_NEW = "24.10-1", "25.04-2"
SOURCE = "/srv/drivers"
NODE = "gpu-node-1"
VALIDATION_POD = NamespacedName(namespace="gpuop-system", name="gpuop-validate-gpu-node-1")
S = UpgradeState


def policy(
    *, ofed: bool = False, source: str | None = SOURCE, **upgrade: Any
) -> GPUClusterPolicySpec:
    """A policy upgrading the GPU driver (and OFED) with `upgrade` as its upgradePolicy."""
    return GPUClusterPolicySpec(
        driver=DriverSpec(
            gpu=ComponentSpec(version=GPU_NEW, source=source),
            ofed=ComponentSpec(version=OFED_NEW, source=source) if ofed else None,
        ),
        upgrade_policy=UpgradePolicy(**upgrade),
    )


def saga_for(
    spec: GPUClusterPolicySpec,
    *,
    node: str = NODE,
    unschedulable: bool = False,
    boot_id: str | None = BOOT_A,
    rollout: str = "rollout-1",
    pool: str | None = None,
    flavour: dm.Flavour | None = None,
) -> records.NodeSaga:
    running: dict[Component, str | None] = {Component.GPU: GPU_OLD, Component.OFED: OFED_OLD}
    return records.new_saga(
        node=node,
        rollout_id=rollout,
        policy=spec,
        running=running,
        now=T0,
        boot_id=boot_id,
        unschedulable=unschedulable,
        pool=pool,
        flavour=flavour,
    )


def inventory(boot_id: str, gpu: str | None = GPU_OLD, ofed: str | None = OFED_OLD) -> Event:
    draft = hw.HardwareDiscovered(
        kernel_release="6.8.0-1-generic",
        machine="x86_64",
        boot_id=boot_id,
        driver_version=gpu,
        ofed_version=ofed,
        inventory_hash="0" * 64,
    )
    return draft.model_copy(update={"inventory_hash": draft.content_hash()})


class Run:
    """One saga driven through the core, with every decision kept."""

    def __init__(self, spec: GPUClusterPolicySpec, saga: records.NodeSaga | None = None):
        self.policy = spec
        self.saga = saga or saga_for(spec)
        self.now = T0
        self.decisions: list[Decision] = []
        self.events: list[core.Trigger] = []
        self.times: list[datetime] = []

    # feeding

    def feed(self, event: core.Trigger, after: float = 1.0) -> Decision:
        self.now += timedelta(seconds=after)
        decision = core.decide(self.saga, event, self.policy, self.now)
        self.events.append(event)
        self.times.append(self.now)
        self.saga = decision.saga
        self.decisions.append(decision)
        return decision

    def admit(self, canary: bool = False) -> Decision:
        return self.feed(core.Admitted(canary=canary))

    def expire(self) -> Decision:
        expired = core.deadline_event(self.saga)
        assert expired is not None, f"{self.saga.step.token} has no deadline"
        assert self.saga.deadline is not None
        self.now = self.saga.deadline
        return self.feed(expired, after=0)

    @property
    def step_id(self) -> str:
        return ids.step(self.saga.saga_id, self.saga.step.token, self.saga.attempt)

    @property
    def state(self) -> UpgradeState:
        return self.saga.state

    # answering the pending step

    def ok(self) -> Decision:
        """Answer the pending step with its success."""
        saga, step_id = self.saga, self.step_id
        kind, component = saga.step.kind, saga.step.component
        if kind is StepKind.OPERANDS_PAUSE:
            decision = self.decisions[-1]
            for service in saga.operands:
                decision = self.feed(dev.OperandPaused(command_id=step_id, service=service))
            return decision
        if kind is StepKind.VALIDATE_RESUME:
            decision = self.decisions[-1]
            for service in saga.operands:
                decision = self.feed(dev.OperandResumed(command_id=step_id, service=service))
            return decision
        if kind is StepKind.REBOOT:
            return self.feed(inventory(BOOT_B))
        if kind is StepKind.BACKOFF:
            return self.expire()
        answers: dict[StepKind, Any] = {
            StepKind.CORDON: lambda: kube.NodeCordoned(action_id=step_id),
            StepKind.WAIT_FOR_JOBS: lambda: kube.PodsObserved(
                gpu_pods=0, job_pods=0, drainable_pods=0
            ),
            StepKind.POD_DELETION: lambda: kube.PodsDeleted(action_id=step_id, deleted=2),
            StepKind.DRAIN: lambda: kube.DrainCompleted(action_id=step_id, evicted=3),
            StepKind.UNCORDON: lambda: kube.NodeUncordoned(action_id=step_id),
            StepKind.VALIDATE_POD: lambda: kube.ValidationPodSucceeded(
                action_id=step_id, pod=VALIDATION_POD
            ),
            StepKind.VALIDATE_PREFLIGHT: lambda: kube.ValidationPodSucceeded(
                action_id=step_id, pod=VALIDATION_POD
            ),
        }
        if kind in answers:
            return self.feed(answers[kind]())
        assert component is not None
        return self.feed(self.driver_success(kind, component, step_id))

    def driver_success(self, kind: StepKind, component: Component, step_id: str) -> Event:
        target = self.saga.targets[component].version
        previous = self.saga.previous_versions.get(component, "1.0")
        results: dict[StepKind, Event] = {
            StepKind.RUNTIME_CONFIGURE: dm.RuntimeConfigured(
                command_id=step_id,
                component=component,
                runtime="containerd",
                drop_in="/etc/containerd/conf.d/99-nvidia.toml",
                changed=True,
            ),
            StepKind.STAGE: dm.DriverStaged(
                command_id=step_id, component=component, version=target
            ),
            StepKind.INSTALL: dm.DriverInstalled(
                command_id=step_id, component=component, version=target
            ),
            StepKind.UNLOAD: dm.DriverUnloaded(
                command_id=step_id, component=component, version=previous
            ),
            StepKind.LOAD: dm.DriverLoaded(command_id=step_id, component=component, version=target),
            StepKind.VALIDATE: dm.DriverValidated(
                command_id=step_id, component=component, version=target, devices=8
            ),
            StepKind.VALIDATE_CUDA: dm.DriverValidated(
                command_id=step_id, component=component, version=target, devices=8
            ),
            StepKind.VALIDATE_PEERMEM: dm.DriverValidated(
                command_id=step_id, component=component, version=target, devices=8
            ),
            StepKind.ROLLBACK: dm.DriverRolledBack(
                command_id=step_id, component=component, version=previous
            ),
            StepKind.ROLLBACK_VALIDATE: dm.DriverValidated(
                command_id=step_id, component=component, version=previous, devices=8
            ),
        }
        return results[kind]

    def fail(self, message: str = "broken") -> Decision:
        """Answer the pending step with its executor's failure (or its deadline)."""
        saga, step_id = self.saga, self.step_id
        kind, component = saga.step.kind, saga.step.component
        version = saga.targets[component].version if component else GPU_NEW
        reason = kube.EvictionFailureReason.PDB_BLOCKED
        failures: dict[StepKind, Any] = {
            StepKind.RUNTIME_CONFIGURE: lambda: dm.RuntimeConfigureFailed(
                command_id=step_id,
                component=component,
                reason=dm.RuntimeFailureReason.NOT_ANSWERING,
                message=message,
            ),
            StepKind.POD_DELETION: lambda: kube.PodDeletionFailed(
                action_id=step_id, reason=reason, message=message
            ),
            StepKind.DRAIN: lambda: kube.DrainFailed(
                action_id=step_id, reason=reason, message=message
            ),
            StepKind.STAGE: lambda: dm.DriverStageFailed(
                command_id=step_id,
                component=component,
                version=version,
                reason=dm.InstallFailureReason.NOT_FOUND,
                message=message,
            ),
            StepKind.INSTALL: lambda: dm.DriverInstallFailed(
                command_id=step_id,
                component=component,
                version=version,
                reason=dm.InstallFailureReason.NOT_FOUND,
                message=message,
            ),
            StepKind.UNLOAD: lambda: dm.DriverUnloadFailed(
                command_id=step_id,
                component=component,
                reason=dm.UnloadFailureReason.IN_USE,
                message=message,
                retryable=True,
            ),
            StepKind.LOAD: lambda: dm.DriverLoadFailed(
                command_id=step_id,
                component=component,
                version=version,
                reason=dm.LoadFailureReason.MODULE_ERROR,
                message=message,
            ),
            StepKind.VALIDATE: lambda: dm.DriverValidationFailed(
                command_id=step_id,
                component=component,
                version=version,
                reason=dm.LoadFailureReason.UNHEALTHY,
                message=message,
            ),
            StepKind.VALIDATE_CUDA: lambda: dm.DriverValidationFailed(
                command_id=step_id,
                component=component,
                version=version,
                reason=dm.LoadFailureReason.CUDA_FAILED,
                message=message,
            ),
            StepKind.VALIDATE_PEERMEM: lambda: dm.DriverValidationFailed(
                command_id=step_id,
                component=component,
                version=version,
                reason=dm.LoadFailureReason.PEERMEM_NOT_REGISTERED,
                message=message,
            ),
            StepKind.VALIDATE_POD: lambda: kube.ValidationPodFailed(
                action_id=step_id,
                pod=VALIDATION_POD,
                reason=kube.ValidationPodFailureReason.FAILED,
                message=message,
            ),
            StepKind.VALIDATE_PREFLIGHT: lambda: kube.ValidationPodFailed(
                action_id=step_id,
                pod=VALIDATION_POD,
                reason=kube.ValidationPodFailureReason.FAILED,
                message=message,
            ),
            StepKind.ROLLBACK_VALIDATE: lambda: dm.DriverValidationFailed(
                command_id=step_id,
                component=component,
                version=saga.previous_versions.get(component or Component.GPU, "1.0"),
                reason=dm.LoadFailureReason.UNHEALTHY,
                message=message,
            ),
            StepKind.ROLLBACK: lambda: dm.DriverRollbackFailed(
                command_id=step_id,
                component=component,
                version=saga.previous_versions.get(component or Component.GPU, "1.0"),
                failed_step=dm.DriverStep.LOAD,
                message=message,
            ),
        }
        if kind in failures:
            return self.feed(failures[kind]())
        return self.expire()

    def until(self, state: UpgradeState, limit: int = 40) -> None:
        """Answer every step with success until the saga is in `state`."""
        for _ in range(limit):
            if self.saga.state is state:
                return
            self.ok()
        raise AssertionError(f"never reached {state}; stuck in {self.saga.state}")

    # reading what was decided

    def transitions(self) -> list[tuple[UpgradeState, UpgradeState]]:
        return [(t.from_state, t.to_state) for d in self.decisions for t in d.transitions]

    def states(self) -> list[UpgradeState]:
        moves = self.transitions()
        return [moves[0][0], *(to for _, to in moves)] if moves else [self.saga.state]

    def commands(self) -> Iterator[actions.IssuedCommand]:
        for decision in self.decisions:
            yield from decision.commands

    def kube_actions(self) -> Iterator[actions.KubeAction]:
        for decision in self.decisions:
            yield from decision.kube_actions

    def work(self) -> list[str]:
        """Commands and Kubernetes actions other than labels and events, in order, as
        `verb[:component]` (`cordon`, `pause`, `unload:gpu`)."""
        done: list[str] = []
        for decision in self.decisions:
            for command in decision.commands:
                component = getattr(command.payload, "component", None)
                verb = type(command.payload).VERB
                check = getattr(command.payload, "check", dm.ValidationCheck.NVML)
                if check is not dm.ValidationCheck.NVML:
                    verb = f"{verb}-{check}"  # the ladder's later rungs: validate-cuda
                done.append(f"{verb}:{component}" if component else verb)
            for action in decision.kube_actions:
                if not isinstance(action, actions.SetStateLabel | actions.RecordEvent):
                    done.append(type(action).__name__.lower())
        return done
