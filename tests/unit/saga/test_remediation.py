"""The GPU remediation kind: its table, each phase's events and deadlines, the reboot
fallback, the fold into an upgrade, the circuit breaker, and the health events that start
one (and those that do not)."""

from __future__ import annotations

import importlib
import pkgutil
from datetime import UTC, datetime, timedelta

import pytest

from gpuop.events import device as dev
from gpuop.events import driver as dm
from gpuop.events import kube
from gpuop.events import remediation_commands as cmd
from gpuop.events.deadlines import DeadlineExpired
from gpuop.events.fields import NamespacedName
from gpuop.events.remediation import RemediationStarted
from gpuop.events.remediation import RemediationState as S
from gpuop.events.upgrade import NodeAdmitted, NodeUpgradeStateChanged, UpgradeState
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import actions as upgrade_actions
from gpuop.saga import machine
from gpuop.saga.remediation import breaker, folding, kind, phases, records
from gpuop.saga.remediation.actions import (
    REPLACEMENT_LABEL,
    EvictPods,
    MarkReplacement,
    MirrorHealth,
)
from gpuop.saga.remediation.drafting import Draft
from gpuop.saga.remediation.records import RemediationSaga
from gpuop.saga.remediation.table import TABLE
from tests.support.inventories import H200, inventory
from tests.support.sagas import policy

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
NODE = "gpu-1"
GPU = "GPU-20bce083-dbf9-2d4f-3c35-c858915accc5"
BOOT = "6f0e6b1c-3a52-4b8e-9a1d-0c5c2f3e4d5a"
BOOT_B = "7f0e6b1c-3a52-4b8e-9a1d-0c5c2f3e4d5b"
POD = NamespacedName(namespace="team", name="trainer-0")
SPEC = policy()


def started(**changes: object) -> RemediationStarted:
    fields: dict[str, object] = {
        "saga_id": f"remediation/{NODE}/1", "unhealthy": {GPU: (79,)}, "boot_id": BOOT,
        "driver_version": "535.161.08",
    }  # fmt: skip
    return RemediationStarted.model_validate({**fields, **changes})


class Walk:
    """A remediation fed events one at a time, a second later each."""

    def __init__(self, spec: GPUClusterPolicySpec = SPEC, **changes: object) -> None:
        self.spec = spec
        self.now = T0
        self.saga = records.start(NODE, started(**changes), T0)
        self.decisions: list[machine.Decision[RemediationSaga, S]] = []

    def feed(self, event: object) -> machine.Decision[RemediationSaga, S] | None:
        self.now += timedelta(seconds=1)
        decision = folding.step(self.saga, event, self.spec, self.now)  # type: ignore[arg-type]
        if decision is not None:
            self.saga = decision.saga
            self.decisions.append(decision)
        return decision

    def state(self) -> S:
        return self.saga.state

    def step_id(self) -> str:
        return Draft(kind.REMEDIATION, self.saga, self.spec, self.now).step_id()

    def admit(self) -> None:
        saga = self.saga
        self.feed(NodeAdmitted(rollout_id=saga.saga_id, saga_id=saga.saga_id, attempt=saga.attempt))

    def commands(self) -> list[object]:
        return [c.payload for d in self.decisions for c in d.commands]

    def actions(self) -> list[object]:
        return [a for d in self.decisions for a in d.kube_actions]

    def to_reset(self) -> None:
        self.admit()
        self.feed(cmd.GpuHoldersListed(command_id=self.step_id(), gpu_uuids=(GPU,), pods=(POD,)))
        self.feed(kube.PodsDeleted(action_id=self.step_id(), deleted=1))
        pause = self.step_id()
        for service in dev.OperandService:
            self.feed(dev.OperandPaused(command_id=pause, service=service))

    def driver_rungs(self) -> None:
        """The ladder up to its pod: the driver's rungs pass, the operands resume."""
        for _ in range(2):
            self.feed(dm.DriverValidated(
                command_id=self.step_id(), component=dm.Component.GPU, version="535.161.08",
                devices=8,
            ))  # fmt: skip
        resume = self.step_id()
        for service in dev.OperandService:
            self.feed(dev.OperandResumed(command_id=resume, service=service))

    def validate(self) -> None:
        self.driver_rungs()
        pod = NamespacedName(namespace="gpuop", name="gpuop-validate")
        self.feed(kube.ValidationPodSucceeded(action_id=self.step_id(), pod=pod))

    def reset(self, gpu: str) -> None:
        """Admitted, no pod holds `gpu`: the pause and its reset."""
        self.feed(cmd.GpuHoldersListed(command_id=self.step_id(), gpu_uuids=(gpu,), pods=()))
        pause = self.step_id()
        for service in dev.OperandService:
            self.feed(dev.OperandPaused(command_id=pause, service=service))
        nvml = cmd.ResetMethod.NVML
        self.feed(cmd.GpuReset(command_id=self.step_id(), gpu_uuids=(gpu,), method=nvml))

    def reset_unheld(self, gpu: str) -> None:
        """Admitted, no pod holds `gpu`: the pause, its reset and the validation."""
        self.reset(gpu)
        self.validate()

    def release(self) -> None:
        """The executor confirms the release (condition True, taint off)."""
        assert self.state() is S.RELEASE_REQUIRED and self.saga.step.name == "untaint"
        self.feed(kube.NodeUntainted(action_id=self.step_id()))


def test_every_state_has_exactly_one_phase_module_named_for_it() -> None:
    found = {}
    for info in pkgutil.iter_modules(phases.__path__):
        module = importlib.import_module(f"{phases.__name__}.{info.name}")
        state = getattr(module, "STATE", None)
        if state is None:
            assert info.name == "common", f"{info.name} is neither a phase nor shared"
            continue
        assert state not in found and info.name == state.value.replace("-", "_")
        found[state] = info.name
        for hook in ("enter", "on_event", "on_deadline", "effects"):
            assert callable(getattr(module, hook)), f"{info.name} lacks {hook}"
    assert set(found) == set(S) == set(phases.PHASES)


def test_the_kind_checks_and_every_state_has_a_row_and_a_phase() -> None:
    kind.REMEDIATION.check()
    assert set(TABLE) == set(S)
    reachable = {S.ADMISSION_REQUIRED, S.FOLDED} | {t for row in TABLE.values() for t in row}
    assert reachable == set(S)


def test_a_start_quarantines_and_waits_for_admission() -> None:
    walk = Walk()
    commands, actions = kind.REMEDIATION.effects(walk.saga, SPEC)

    assert walk.state() is S.ADMISSION_REQUIRED and walk.saga.deadline is None
    assert commands == ()
    mirror = actions[0]
    assert isinstance(mirror, MirrorHealth) and mirror.taint is True
    assert mirror.unhealthy == ((GPU, (79,)),)
    assert folding.waiting(walk.saga) and not folding.holds(walk.saga)


def test_without_quarantine_the_node_is_not_tainted() -> None:
    spec = SPEC.model_copy(
        update={"remediation": SPEC.remediation.model_copy(update={"quarantine": False})}
    )
    _, actions = kind.REMEDIATION.effects(Walk(spec).saga, spec)
    assert isinstance(actions[0], MirrorHealth) and actions[0].taint is None


def test_the_main_line_evicts_only_the_holders_resets_validates_and_releases() -> None:
    walk = Walk()
    walk.admit()
    assert walk.state() is S.HOLDERS_REQUIRED and walk.saga.deadline == walk.now + timedelta(
        seconds=60
    )
    assert isinstance(walk.commands()[-1], cmd.ListGpuHolders)
    walk.feed(cmd.GpuHoldersListed(command_id=walk.step_id(), gpu_uuids=(GPU,), pods=(POD,)))
    assert walk.state() is S.EVICTION_REQUIRED
    evict = walk.actions()[-1]
    assert isinstance(evict, EvictPods) and evict.pods == (POD,)
    walk.feed(kube.PodsDeleted(action_id=walk.step_id(), deleted=1))
    assert walk.state() is S.OPERANDS_PAUSE_REQUIRED
    pause = walk.step_id()
    for service in dev.OperandService:
        walk.feed(dev.OperandPaused(command_id=pause, service=service))
    assert walk.state() is S.RESET_REQUIRED
    reset = walk.commands()[-1]
    assert isinstance(reset, cmd.ResetGpu) and reset.gpu_uuids == (GPU,)
    walk.feed(
        cmd.GpuReset(command_id=walk.step_id(), gpu_uuids=(GPU,), method=cmd.ResetMethod.NVML)
    )
    assert walk.state() is S.VALIDATION_REQUIRED and walk.saga.step.name == "validate-gpu"
    walk.validate()

    assert walk.state() is S.RELEASE_REQUIRED and walk.saga.step.name == "untaint"
    release = walk.actions()[-1]
    assert isinstance(release, MirrorHealth) and release.taint is False and release.unhealthy == ()
    assert release.id == walk.step_id()
    walk.release()
    assert walk.state() is S.DONE
    assert kind.REMEDIATION.effects(walk.saga, SPEC) == ((), ())  # done issues nothing more
    walked = [t.to_state for d in walk.decisions for t in d.transitions]
    assert walked == [
        S.HOLDERS_REQUIRED, S.EVICTION_REQUIRED, S.OPERANDS_PAUSE_REQUIRED, S.RESET_REQUIRED,
        S.VALIDATION_REQUIRED, S.RELEASE_REQUIRED, S.DONE,
    ]  # fmt: skip
    assert not folding.holds(walk.saga)


def test_no_holder_skips_the_eviction_and_unknown_holders_evict_every_gpu_pod() -> None:
    walk = Walk()
    walk.admit()
    walk.feed(cmd.GpuHoldersListed(command_id=walk.step_id(), gpu_uuids=(GPU,), pods=()))
    assert walk.state() is S.OPERANDS_PAUSE_REQUIRED

    unknown = Walk()
    unknown.admit()
    unknown.feed(cmd.GpuHoldersUnknown(command_id=unknown.step_id(), message="no socket"))
    assert unknown.state() is S.EVICTION_REQUIRED
    assert type(unknown.actions()[-1]).__name__ == "DeletePods"


def test_an_answer_to_another_step_changes_nothing() -> None:
    walk = Walk()
    walk.admit()
    assert walk.feed(cmd.GpuHoldersListed(command_id="other", gpu_uuids=(GPU,), pods=())) is None


def test_a_failed_reset_reboots_and_a_new_boot_id_confirms_it() -> None:
    walk = Walk()
    walk.to_reset()
    walk.feed(cmd.GpuResetFailed(
        command_id=walk.step_id(), gpu_uuids=(GPU,), reason=cmd.ResetFailureReason.RESET_FAILED,
    ))  # fmt: skip
    assert walk.state() is S.REBOOT_REQUIRED and walk.saga.boot_id_at_reboot == BOOT
    reboot = walk.commands()[-1]
    assert isinstance(reboot, dm.RebootNode) and reboot.boot_id == BOOT
    assert (
        walk.feed(kube.NodeObserved(ready=True, unschedulable=False, boot_id=BOOT)) is None
    )  # the same boot: not yet
    walk.feed(kube.NodeObserved(ready=True, unschedulable=False, boot_id=BOOT_B))
    assert walk.state() is S.VALIDATION_REQUIRED and walk.saga.rebooted
    walk.validate()
    walk.release()
    assert walk.state() is S.DONE


def test_done_waits_for_the_release_to_be_confirmed() -> None:
    walk = Walk()
    walk.to_reset()
    walk.feed(
        cmd.GpuReset(command_id=walk.step_id(), gpu_uuids=(GPU,), method=cmd.ResetMethod.NVML)
    )
    walk.validate()
    assert walk.state() is S.RELEASE_REQUIRED

    for unrelated in (
        kube.NodeUntainted(action_id="another-action"),
        kube.NodeObserved(ready=True, unschedulable=False, boot_id=BOOT),
        kube.NodeUncordoned(action_id=walk.step_id()),
    ):
        walk.feed(unrelated)
        assert walk.state() is S.RELEASE_REQUIRED and walk.saga.step.name == "untaint"
    pending = kind.pending(walk.saga, SPEC)  # after a crash: the same release again
    assert [type(a) for a in pending.kube_actions] == [MirrorHealth]
    assert pending.kube_actions[0] == walk.actions()[-1]
    walk.release()
    assert walk.state() is S.DONE


def test_a_release_not_confirmed_in_time_fails_and_puts_the_taint_back() -> None:
    walk = Walk()
    walk.to_reset()
    walk.feed(
        cmd.GpuReset(command_id=walk.step_id(), gpu_uuids=(GPU,), method=cmd.ResetMethod.NVML)
    )
    walk.validate()
    release_id = walk.step_id()
    expired = machine.deadline_event(walk.saga)
    assert expired is not None and expired.step == "untaint"
    assert expired.deadline == walk.now + timedelta(
        seconds=SPEC.remediation.deadlines.operands_pause
    )
    walk.feed(expired)

    assert walk.state() is S.FAILED and "untaint did not finish in time" in walk.saga.failure
    mirror = next(a for a in walk.decisions[-1].kube_actions if isinstance(a, MirrorHealth))
    assert mirror.taint is True and mirror.unhealthy == ((GPU, (79,)),)
    assert walk.feed(kube.NodeUntainted(action_id=release_id)) is None  # too late: it ended


def test_a_reboot_not_confirmed_in_time_fails_and_keeps_the_taint() -> None:
    walk = Walk()
    walk.to_reset()
    walk.feed(cmd.GpuResetFailed(
        command_id=walk.step_id(), gpu_uuids=(GPU,), reason=cmd.ResetFailureReason.TIMEOUT,
    ))  # fmt: skip
    expired = machine.deadline_event(walk.saga)
    assert expired is not None and expired.step == "reboot"
    walk.feed(expired)

    assert walk.state() is S.FAILED
    assert "reboot not confirmed" in walk.saga.failure
    mirror = next(a for a in walk.decisions[-1].kube_actions if isinstance(a, MirrorHealth))
    assert mirror.taint is True and "remediation failed" in mirror.detail
    resume = walk.decisions[-1].commands[0].payload
    assert isinstance(resume, dev.ResumeOperands)  # the node's other GPUs go back to work


def test_a_failed_reset_without_reboots_allowed_fails() -> None:
    policy = SPEC.remediation.model_copy(update={"allow_reboot": False})
    walk = Walk(SPEC.model_copy(update={"remediation": policy}))
    walk.to_reset()
    walk.feed(cmd.GpuResetFailed(
        command_id=walk.step_id(), gpu_uuids=(GPU,), reason=cmd.ResetFailureReason.NOT_SUPPORTED,
    ))  # fmt: skip
    assert walk.state() is S.FAILED and "allowReboot" in walk.saga.failure


def test_a_fault_that_asks_for_a_reboot_skips_the_reset() -> None:
    walk = Walk(action="reboot")
    walk.to_reset()
    assert walk.state() is S.REBOOT_REQUIRED


def test_every_step_has_its_deadline_and_a_stale_one_changes_nothing() -> None:
    walk = Walk()
    walk.admit()
    expired = machine.deadline_event(walk.saga)
    assert expired is not None
    walk.feed(cmd.GpuHoldersListed(command_id=walk.step_id(), gpu_uuids=(GPU,), pods=(POD,)))
    assert walk.feed(expired) is None  # the holders step ended: its deadline is stale
    eviction = machine.deadline_event(walk.saga)
    assert eviction is not None and eviction.step == "evict"
    walk.feed(eviction)
    assert walk.state() is S.FAILED and walk.saga.history[-1].result == "expired"


def test_a_remediation_folded_into_an_upgrade_ends_when_the_upgrade_validates() -> None:
    walk = Walk(folded_into="rollout-1/gpu-1")
    assert walk.state() is S.FOLDED and not folding.holds(walk.saga)
    changed = NodeUpgradeStateChanged(
        rollout_id="rollout-1", from_state=UpgradeState.VALIDATION_REQUIRED,
        to_state=UpgradeState.UNCORDON_REQUIRED, components=(dm.Component.GPU,),
        target_versions={dm.Component.GPU: "550.54.15"},
    )  # fmt: skip
    walk.feed(changed)
    assert walk.state() is S.RELEASE_REQUIRED and walk.saga.step.name == "untaint"
    release = walk.actions()[-1]
    assert isinstance(release, MirrorHealth) and release.taint is False
    walk.release()
    assert walk.state() is S.DONE
    walked = [t.to_state for d in walk.decisions for t in d.transitions]
    assert walked == [S.RELEASE_REQUIRED, S.DONE]

    failing = Walk(folded_into="rollout-1/gpu-1")
    failing.feed(changed.model_copy(update={"to_state": UpgradeState.UPGRADE_FAILED}))
    assert failing.state() is S.FAILED


def test_a_removed_node_ends_it() -> None:
    walk = Walk()
    walk.admit()
    walk.feed(kube.NodeRemoved())
    assert walk.state() is S.FAILED


def test_another_gpu_failing_before_admission_is_reset_too() -> None:
    walk = Walk()
    other = "GPU-30bce083-dbf9-2d4f-3c35-c858915accc5"
    walk.feed(dev.DeviceHealthChanged(
        gpu_uuid=other, healthy=False, reason=dev.HealthReason.XID, xid=48,
        action=dev.XidAction.RESET_GPU,
    ))  # fmt: skip
    assert walk.saga.gpu_uuids == (GPU, other) and walk.saga.unhealthy[other] == (48,)


@pytest.mark.parametrize(
    ("action", "healthy", "calls"),
    [
        (dev.XidAction.RESTART_APPLICATION, False, False),
        (dev.XidAction.NONE, False, False),
        (dev.XidAction.RESET_GPU, False, True),
        (dev.XidAction.DRAIN_AND_REPLACE, False, True),
        (None, False, True),  # an old log's event: reset-gpu
        (None, True, False),
    ],
)
def test_only_a_fault_that_needs_a_reset_or_worse_calls_for_a_remediation(
    action: dev.XidAction | None, healthy: bool, calls: bool
) -> None:
    event = dev.DeviceHealthChanged(
        gpu_uuid=GPU, healthy=healthy, reason=dev.HealthReason.XID, xid=13, action=action
    )
    assert kind.calls_for_remediation(event) is calls


def test_the_breaker_trips_at_n_plus_one_and_reopens_an_hour_after() -> None:
    starts = [T0 + timedelta(minutes=m) for m in (0, 10, 20)]
    now = T0 + timedelta(minutes=30)
    assert breaker.allows(starts[:2], now, 3)
    assert not breaker.allows(starts, now, 3)
    assert breaker.reopens(starts, now, 3) == T0 + timedelta(hours=1)
    assert breaker.allows(starts, T0 + timedelta(hours=1), 3)
    assert breaker.allows(starts * 5, now, 0)


def test_a_deadline_of_another_saga_changes_nothing() -> None:
    walk = Walk()
    walk.admit()
    assert walk.saga.deadline is not None
    other = DeadlineExpired(
        saga_id="rollout-1/gpu-1", state="gpu-holders-required", step="holders", attempt=1,
        deadline=walk.saga.deadline,
    )  # fmt: skip
    assert walk.feed(other) is None


def test_a_new_inventory_boot_id_is_kept_for_the_reboot() -> None:
    walk = Walk()
    walk.feed(inventory(boot_id=BOOT_B))
    assert walk.saga.boot_id == BOOT_B


def test_a_gpu_failing_after_the_holders_were_asked_gets_the_next_attempt() -> None:
    walk = Walk()
    walk.admit()
    other = "GPU-30bce083-dbf9-2d4f-3c35-c858915accc5"
    walk.feed(dev.DeviceHealthChanged(
        gpu_uuid=other, healthy=False, reason=dev.HealthReason.XID, xid=48,
        action=dev.XidAction.RESET_GPU,
    ))  # fmt: skip
    assert walk.saga.gpu_uuids == (GPU,) and kind.leftover(walk.saga) == {other: (48,)}
    walk.reset_unheld(GPU)

    assert walk.state() is S.ADMISSION_REQUIRED and walk.saga.attempt == 2
    assert walk.saga.gpu_uuids == (other,) and walk.saga.unhealthy == {other: (48,)}
    quarantine = walk.actions()[-2]
    assert isinstance(quarantine, MirrorHealth) and quarantine.unhealthy == ((other, (48,)),)
    walk.admit()
    listing = walk.commands()[-1]
    assert isinstance(listing, cmd.ListGpuHolders) and listing.gpu_uuids == (other,)


def test_a_gpu_failing_while_the_release_is_pending_gets_the_next_attempt() -> None:
    walk = Walk(folded_into="rollout-1/gpu-1")
    walk.feed(NodeUpgradeStateChanged(
        rollout_id="rollout-1", from_state=UpgradeState.VALIDATION_REQUIRED,
        to_state=UpgradeState.UPGRADE_DONE, components=(dm.Component.GPU,),
        target_versions={dm.Component.GPU: "550.54.15"},
    ))  # fmt: skip
    other = "GPU-30bce083-dbf9-2d4f-3c35-c858915accc5"
    walk.feed(dev.DeviceHealthChanged(
        gpu_uuid=other, healthy=False, reason=dev.HealthReason.XID, xid=48,
        action=dev.XidAction.RESET_GPU,
    ))  # fmt: skip
    walk.release()

    assert walk.state() is S.ADMISSION_REQUIRED and walk.saga.gpu_uuids == (other,)
    quarantine = next(a for a in walk.decisions[-1].kube_actions if isinstance(a, MirrorHealth))
    assert quarantine.taint is True and quarantine.unhealthy == ((other, (48,)),)


OTHER = "GPU-30bce083-dbf9-2d4f-3c35-c858915accc5"
DRA_DEVICES = {GPU: ("gpu-3",), OTHER: ("gpu-4-mig-1g18gb-19-0", "gpu-4-mig-1g18gb-19-1")}
"""A DRA node's devices: GPU a whole `gpu-3`, OTHER carved into two MIG devices."""


def mirrors(actions: list[object]) -> list[MirrorHealth]:
    return [a for a in actions if isinstance(a, MirrorHealth)]


def test_on_a_dra_node_the_quarantine_taints_the_faulty_gpus_devices_not_the_node() -> None:
    walk = Walk(dra_devices=DRA_DEVICES)
    _, actions = kind.REMEDIATION.effects(walk.saga, SPEC)

    (mirror,) = mirrors(list(actions))
    assert mirror.taint is True and mirror.devices == ("gpu-3",)  # OTHER's keep serving
    assert walk.saga.quarantined_devices == ("gpu-3",)


def test_on_a_dra_node_the_release_deletes_exactly_the_rules_it_made_then_ends() -> None:
    walk = Walk(dra_devices=DRA_DEVICES)
    walk.to_reset()
    walk.feed(
        cmd.GpuReset(command_id=walk.step_id(), gpu_uuids=(GPU,), method=cmd.ResetMethod.NVML)
    )
    walk.validate()

    release = mirrors(walk.actions())[-1]
    assert release.taint is False and release.devices == ("gpu-3",)
    assert kind.pending(walk.saga, SPEC).kube_actions == (release,)  # a crash: the same again
    walk.release()
    assert walk.state() is S.DONE and walk.saga.quarantined_devices == ()


def test_on_a_dra_node_a_failure_keeps_the_faulty_gpus_rules() -> None:
    walk = Walk(dra_devices=DRA_DEVICES)
    walk.admit()
    walk.feed(machine.deadline_event(walk.saga))  # the holders never answered

    assert walk.state() is S.FAILED
    failed = mirrors(walk.decisions[-1].kube_actions)[-1]  # type: ignore[arg-type]
    assert failed.taint is True and failed.devices == ("gpu-3",)


def test_on_a_dra_node_a_gpu_failing_before_admission_has_its_devices_tainted_too() -> None:
    walk = Walk(dra_devices=DRA_DEVICES)
    walk.feed(dev.DeviceHealthChanged(
        gpu_uuid=OTHER, healthy=False, reason=dev.HealthReason.XID, xid=48,
        action=dev.XidAction.RESET_GPU,
    ))  # fmt: skip

    (mirror,) = mirrors(list(kind.REMEDIATION.effects(walk.saga, SPEC)[1]))
    assert mirror.devices == ("gpu-3", "gpu-4-mig-1g18gb-19-0", "gpu-4-mig-1g18gb-19-1")


def test_on_a_dra_node_the_next_attempt_taints_the_late_gpu_and_the_release_frees_both() -> None:
    walk = Walk(dra_devices=DRA_DEVICES)
    walk.admit()
    walk.feed(dev.DeviceHealthChanged(
        gpu_uuid=OTHER, healthy=False, reason=dev.HealthReason.XID, xid=48,
        action=dev.XidAction.RESET_GPU,
    ))  # fmt: skip
    walk.reset_unheld(GPU)
    assert walk.state() is S.ADMISSION_REQUIRED and walk.saga.gpu_uuids == (OTHER,)
    both = ("gpu-3", "gpu-4-mig-1g18gb-19-0", "gpu-4-mig-1g18gb-19-1")
    assert mirrors(walk.actions())[-1].devices == both  # gpu-3's rule stays until the end

    walk.admit()
    walk.reset_unheld(OTHER)
    release = mirrors(walk.actions())[-1]
    assert release.taint is False and release.devices == both


# A fault that asks for new hardware (drain-and-replace): the node is handed over (cordoned,
# its GPU pods gone, GPUHealthy False, a warning Event, the replacement label) and held until
# an admin or a repair flow releases it and discovery shows another GPU in the slot.

SLOT = H200.pci_bus_id
NEW_GPU = "GPU-30bce083-dbf9-2d4f-3c35-c858915accc6"
NEW_H200 = H200.model_copy(update={"uuid": NEW_GPU})


def held() -> Walk:
    """A drain-and-replace remediation handed over and waiting for the release."""
    walk = Walk(action="drain-and-replace", slots={GPU: SLOT})
    walk.to_reset()
    assert walk.state() is S.REPLACEMENT_REQUIRED and walk.saga.step.name == "hand-over"
    walk.feed(kube.NodeCordoned(action_id=walk.step_id()))
    assert walk.saga.step.name == "replacement"
    return walk


def release(walk: Walk) -> None:
    walk.feed(kube.NodeObserved(ready=True, unschedulable=True, labels={REPLACEMENT_LABEL: "done"}))


def test_drain_and_replace_hands_the_node_over_instead_of_rebooting() -> None:
    walk = Walk(action="drain-and-replace", slots={GPU: SLOT})
    walk.to_reset()

    assert walk.state() is S.REPLACEMENT_REQUIRED
    [evicted] = [a for a in walk.actions() if isinstance(a, EvictPods)]
    assert evicted.pods == (POD,)
    hand_over = walk.decisions[-1].kube_actions
    cordon = [a for a in hand_over if isinstance(a, upgrade_actions.Cordon)]
    assert len(cordon) == 1 and cordon[0].id == walk.step_id()
    (mirror,) = [a for a in hand_over if isinstance(a, MirrorHealth)]
    assert mirror.taint is True and mirror.unhealthy == ((GPU, (79,)),)
    assert f"{GPU} at {SLOT} (XID 79): drain-and-replace" in mirror.detail
    (label,) = [a for a in hand_over if isinstance(a, MarkReplacement)]
    assert label.value == "required"
    (event,) = [a for a in hand_over if isinstance(a, upgrade_actions.RecordEvent)]
    assert event.warning and GPU in event.message and "XID 79" in event.message
    assert not any(c.__class__.__name__ == "RebootNode" for c in walk.commands())


@pytest.mark.parametrize(
    ("unhealthy", "signal", "said"),
    [
        ((), "row-remap-failure", "(signal row-remap-failure)"),
        ((), "pcie-link-width", "(signal pcie-link-width)"),
        ((79,), "gpu-lost-again", "(XID 79, signal gpu-lost-again)"),
        ((79,), None, "(XID 79)"),
    ],
)
def test_the_hand_over_names_the_signal_that_asked_for_new_hardware(
    unhealthy: tuple[int, ...], signal: str | None, said: str
) -> None:
    signals = {GPU: signal} if signal else {}
    walk = Walk(action="drain-and-replace", slots={GPU: SLOT}, unhealthy={GPU: unhealthy},
                signals=signals)  # fmt: skip
    walk.to_reset()

    hand_over = walk.decisions[-1].kube_actions
    (mirror,) = [a for a in hand_over if isinstance(a, MirrorHealth)]
    (event,) = [a for a in hand_over if isinstance(a, upgrade_actions.RecordEvent)]
    for text in (mirror.detail, event.message):
        assert f"{GPU} at {SLOT} {said}: drain-and-replace asks for new hardware" in text
    # replay builds the same saga from the start it records
    assert records.start(NODE, records.start_of(walk.saga), T0).signals == signals


def test_a_held_node_waits_with_no_deadline_and_is_neither_done_nor_failed() -> None:
    walk = held()

    assert walk.saga.deadline is None
    assert kind.REMEDIATION.effects(walk.saga, SPEC) == ((), ())
    walk.feed(kube.NodeObserved(ready=True, unschedulable=True, labels={REPLACEMENT_LABEL: "x"}))
    walk.feed(inventory(gpus=(NEW_H200,)))  # new hardware alone releases nothing
    assert walk.state() is S.REPLACEMENT_REQUIRED and walk.saga.step.name == "replacement"


def test_a_release_without_new_hardware_is_refused_saying_why() -> None:
    walk = held()
    walk.feed(inventory())  # the same GPU still in the slot
    release(walk)

    assert walk.state() is S.REPLACEMENT_REQUIRED and walk.saga.step.name == "replacement-1"
    assert walk.saga.history[-1].result == "failed"
    refusal = walk.decisions[-1].kube_actions
    (label,) = [a for a in refusal if isinstance(a, MarkReplacement)]
    assert label.value == "required"  # back, so the flow sees its release was not taken
    (event,) = [a for a in refusal if isinstance(a, upgrade_actions.RecordEvent)]
    assert f"{SLOT} still holds {GPU}" in event.message and event.warning


def test_a_release_before_any_inventory_or_with_the_slot_empty_is_refused() -> None:
    walk = held()
    release(walk)
    assert walk.saga.step.name == "replacement-1"
    assert "no inventory" in walk.saga.history[-1].detail
    walk.feed(inventory(gpus=()))  # the GPU fell off the bus: nothing at its address
    release(walk)
    assert walk.saga.step.name == "replacement-2"
    assert f"no GPU at {SLOT}" in walk.saga.history[-1].detail


def test_a_gpu_whose_address_no_inventory_named_cannot_be_released() -> None:
    walk = Walk(action="drain-and-replace")  # the inventory at the start did not list it
    walk.to_reset()
    walk.feed(kube.NodeCordoned(action_id=walk.step_id()))
    walk.feed(inventory(gpus=(NEW_H200,)))
    release(walk)
    assert walk.state() is S.REPLACEMENT_REQUIRED
    assert f"no inventory named the PCI address of {GPU}" in walk.saga.history[-1].detail


def test_a_release_with_another_gpu_in_the_slot_uncordons_and_validates() -> None:
    walk = held()
    walk.feed(inventory(gpus=(NEW_H200,)))
    release(walk)

    assert walk.saga.step.name == "return"
    returning = walk.decisions[-1].kube_actions
    (label,) = [a for a in returning if isinstance(a, MarkReplacement)]
    assert label.value is None
    (uncordon,) = [a for a in returning if isinstance(a, upgrade_actions.Uncordon)]
    assert walk.state() is S.REPLACEMENT_REQUIRED
    walk.feed(kube.NodeUncordoned(action_id="another-action"))
    assert walk.state() is S.REPLACEMENT_REQUIRED
    walk.feed(kube.NodeUncordoned(action_id=uncordon.id))
    assert walk.state() is S.VALIDATION_REQUIRED
    walk.validate()
    walk.release()
    assert walk.state() is S.DONE


def test_a_start_rebuilt_from_its_record_keeps_the_dra_devices() -> None:
    saga = records.start(NODE, started(dra_devices=DRA_DEVICES), T0)
    assert records.start(NODE, records.start_of(saga), T0) == saga


def test_a_node_cordoned_before_the_hand_over_stays_cordoned() -> None:
    walk = Walk(action="drain-and-replace", slots={GPU: SLOT})
    walk.to_reset()
    walk.feed(kube.NodeCordoned(action_id=walk.step_id(), was_unschedulable=True))
    walk.feed(inventory(gpus=(NEW_H200,)))
    release(walk)

    assert walk.state() is S.VALIDATION_REQUIRED
    assert not any(isinstance(a, upgrade_actions.Uncordon) for a in walk.actions())


def test_a_removed_held_node_ends_it() -> None:
    walk = held()
    walk.feed(kube.NodeRemoved())
    assert walk.state() is S.FAILED and walk.saga.failure == "the node was removed"


def validation_pod(walk: Walk, gpu: str) -> upgrade_actions.RunValidationPod:
    """The pod rung's action once `gpu`, unheld, was reset and its driver rungs passed."""
    walk.admit()
    walk.reset(gpu)
    walk.driver_rungs()
    assert walk.saga.step.name == "validate-pod"
    (run,) = [a for a in walk.actions() if isinstance(a, upgrade_actions.RunValidationPod)]
    return run


def test_on_a_dra_node_the_pod_rung_claims_exactly_the_reset_gpu_through_its_taint() -> None:
    run = validation_pod(Walk(dra_devices=DRA_DEVICES), GPU)
    assert (run.device_class, run.gpu_uuids) == ("gpu.nvidia.com", (GPU,))


def test_the_pod_rung_of_a_node_quarantine_or_a_mig_gpu_asks_as_the_node_serves() -> None:
    node_quarantine = validation_pod(Walk(), GPU)
    assert (node_quarantine.device_class, node_quarantine.gpu_uuids) == ("", ())
    mig = Walk(dra_devices=DRA_DEVICES, unhealthy={OTHER: (79,)})
    carved = validation_pod(mig, OTHER)  # no whole-GPU device to claim
    assert (carved.device_class, carved.gpu_uuids) == ("", ())


DCGM = "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04"


def preflight_spec() -> GPUClusterPolicySpec:
    """A remediation whose ladder ends in the admin's diagnostic (the upgrade's keeps its
    default rungs)."""
    validation = {"preflight": {"image": DCGM, "command": ["dcgmi", "diag", "-r", "1"],
                                "deadline_seconds": 400}}  # fmt: skip
    return policy(validation=validation).model_copy(
        update={"remediation": SPEC.remediation.model_copy(update={"rungs": ("nvml", "preflight")})}
    )


def to_preflight(walk: Walk) -> upgrade_actions.RunValidationPod:
    walk.to_reset()
    nvml = cmd.ResetMethod.NVML
    walk.feed(cmd.GpuReset(command_id=walk.step_id(), gpu_uuids=(GPU,), method=nvml))
    walk.feed(dm.DriverValidated(
        command_id=walk.step_id(), component=dm.Component.GPU, version="535.161.08", devices=8,
    ))  # fmt: skip
    resume = walk.step_id()
    for service in dev.OperandService:
        walk.feed(dev.OperandResumed(command_id=resume, service=service))
    assert walk.saga.step.name == "validate-preflight"
    (run,) = walk.decisions[-1].kube_actions
    assert isinstance(run, upgrade_actions.RunValidationPod)
    return run


def test_the_remediations_preflight_runs_the_diagnostic_on_every_gpu_before_the_release() -> None:
    walk = Walk(preflight_spec())
    run = to_preflight(walk)

    assert (run.image, run.command, run.all_gpus) == (DCGM, ("dcgmi", "diag", "-r", "1"), True)
    assert run.id == walk.step_id() and run.timeout_seconds == 360
    assert walk.saga.deadline == walk.now + timedelta(seconds=400)
    pod = NamespacedName(namespace="gpuop", name="gpuop-validate")
    walk.feed(kube.ValidationPodSucceeded(action_id=walk.step_id(), pod=pod))
    assert walk.state() is S.RELEASE_REQUIRED
    steps = [r.step for r in walk.saga.history if r.state is S.VALIDATION_REQUIRED]
    assert steps == ["validate-gpu", "validate-resume", "validate-preflight"]


def test_a_failing_diagnostic_fails_the_remediation_with_its_last_log_lines() -> None:
    walk = Walk(preflight_spec())
    to_preflight(walk)
    pod = NamespacedName(namespace="gpuop", name="gpuop-validate")
    said = "Failed: validator exited 226 (Error): GPU 0: Memory: Fail - DBE"
    walk.feed(kube.ValidationPodFailed(
        action_id=walk.step_id(), pod=pod, reason=kube.ValidationPodFailureReason.FAILED,
        message=said,
    ))  # fmt: skip
    assert walk.state() is S.FAILED
    reason = walk.saga.failure or ""
    assert reason.startswith("validate-preflight: pod gpuop/gpuop-validate failed")
    assert "GPU 0: Memory: Fail - DBE" in reason


def test_a_diagnostic_that_never_ends_fails_the_remediation_at_its_own_deadline() -> None:
    walk = Walk(preflight_spec())
    to_preflight(walk)
    expired = machine.deadline_event(walk.saga)
    assert expired is not None and expired.step == "validate-preflight"
    walk.feed(expired)
    assert walk.state() is S.FAILED
    assert "validate-preflight" in (walk.saga.failure or "")


def test_without_remediation_rungs_the_remediation_climbs_the_upgrades_ladder() -> None:
    spec = preflight_spec()
    plain = spec.model_copy(update={"remediation": SPEC.remediation})
    assert phases.validation_required.plan(plain, True) == (
        "validate-gpu", "validate-cuda-gpu", "validate-resume", "validate-pod",
    )  # fmt: skip
    assert phases.validation_required.plan(spec, True) == (
        "validate-gpu", "validate-resume", "validate-preflight",
    )  # fmt: skip
