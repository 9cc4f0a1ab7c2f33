"""The one fold from the log to decisions, which the runtime and replay both take: its
inbound set is the intake's, an admission counts only for its own attempt, an event that
changes nothing is no step, and a decision's outputs come state changes first, with ids."""

from __future__ import annotations

import pytest

from gpuop.bus import streams
from gpuop.events import bus_subject, new_event, subjects
from gpuop.events import driver as dm
from gpuop.events import upgrade as up
from gpuop.events.driver import Component, Flavour
from gpuop.events.kube import NodeCordoned
from gpuop.saga import kinds
from gpuop.saga.upgrade import effects, folding, records
from gpuop.saga.upgrade.core import Admitted
from gpuop.saga.upgrade.steps import Step, StepKind
from gpuop.services.upgrade_orchestrator import intake
from tests.support.sagas import BOOT_A, GPU_NEW, GPU_OLD, NODE, T0, inventory, policy, saga_for

SPEC = policy()


def test_the_intake_consumes_exactly_the_inbound_set() -> None:
    filters = intake.consumer_spec(subjects.DEFAULT_PREFIX).subjects
    saga = saga_for(SPEC)
    admitted = up.NodeAdmitted(rollout_id="r", saga_id=saga.saga_id, attempt=1, canary=False)
    decision = folding.step(saga, admitted, SPEC, T0)
    assert decision is not None
    changed = folding.KIND.outputs(decision)[0].payload
    for payload, inbound in ((admitted, True), (inventory(BOOT_A), True), (changed, False)):
        assert folding.is_inbound(payload) is inbound, payload
        subject = bus_subject(new_event(payload, node=NODE, source="/t"))
        assert any(streams.subject_matches(f, subject) for f in filters) is inbound, subject


def test_an_admission_counts_only_for_its_own_saga_and_attempt() -> None:
    saga = saga_for(SPEC)
    own = up.NodeAdmitted(rollout_id="r", saga_id=saga.saga_id, attempt=1, canary=True)
    earlier = own.model_copy(update={"attempt": 2})
    other = own.model_copy(update={"saga_id": "another-saga"})
    assert folding.trigger(saga, own) == Admitted(canary=True)
    assert folding.trigger(saga, earlier) is None and folding.trigger(saga, other) is None
    assert folding.step(saga, other, SPEC, T0) is None


def test_an_admission_carries_the_components_of_its_window() -> None:
    saga = saga_for(policy(ofed=True))
    narrowed = up.NodeAdmitted(
        rollout_id="r", saga_id=saga.saga_id, attempt=1, components=(Component.OFED,)
    )
    assert folding.trigger(saga, narrowed) == Admitted(components=(Component.OFED,))
    decision = folding.step(saga, narrowed, policy(ofed=True), T0)
    assert decision is not None and decision.saga.components == (Component.OFED,)


def test_an_event_that_changes_nothing_is_no_step() -> None:
    saga = saga_for(SPEC)  # upgrade-required: a cordon it did not ask for changes nothing
    assert folding.step(saga, NodeCordoned(action_id="x"), SPEC, T0) is None


def test_outputs_are_state_changes_then_commands_with_the_ids_the_outbox_publishes() -> None:
    saga = saga_for(SPEC)
    admitted = up.NodeAdmitted(rollout_id="r", saga_id=saga.saga_id, attempt=1, canary=False)
    decision = folding.step(saga, admitted, SPEC, T0)
    assert decision is not None and decision.transitions
    outs = folding.KIND.outputs(decision)
    changes = [isinstance(out, kinds.StateChange) for out in outs]
    assert changes == sorted(changes, reverse=True)  # every state change before any command
    assert len({out.id for out in outs}) == len(outs)
    assert folding.KIND.outputs(decision) == outs  # the same ids every time it is decided


def test_a_saga_is_rebuilt_from_its_start_record() -> None:
    saga = saga_for(SPEC)
    running = {component: GPU_OLD for component in saga.components}
    rebuilt = folding.started_saga(NODE, folding.start_of(saga, running), SPEC, T0)
    assert rebuilt == saga


def test_the_resolved_flavour_is_rebuilt_from_the_start_record_not_the_policy() -> None:
    saga = records.new_saga(
        node=NODE,
        rollout_id="rollout-1",
        policy=SPEC,
        running={Component.GPU: GPU_NEW},
        now=T0,
        flavour=Flavour.OPEN,
        running_flavour=Flavour.PROPRIETARY,
    )
    assert saga.components == (Component.GPU,)  # the version runs: the flavour differs

    started = folding.start_of(saga, {Component.GPU: GPU_NEW})
    assert (started.flavour, started.running_flavour) == (Flavour.OPEN, Flavour.PROPRIETARY)
    rebuilt = folding.started_saga(NODE, started, SPEC, T0)
    assert rebuilt == saga
    assert rebuilt.targets[Component.GPU].flavour is Flavour.OPEN
    with pytest.raises(ValueError, match="already runs"):  # the same modules: nothing to do
        records.new_saga(
            node=NODE, rollout_id="rollout-1", policy=SPEC, running={Component.GPU: GPU_NEW},
            now=T0, flavour=Flavour.OPEN, running_flavour=Flavour.OPEN,
        )  # fmt: skip


def test_the_install_command_carries_the_targets_flavour() -> None:
    saga = saga_for(SPEC, flavour=Flavour.PROPRIETARY)
    install = saga.model_copy(update={"step": Step(kind=StepKind.INSTALL, component=Component.GPU)})

    [issued], _ = effects.driver_effects(install, SPEC)

    assert isinstance(issued.payload, dm.InstallDriver)
    assert issued.payload.flavour is Flavour.PROPRIETARY
    unflavoured = saga_for(SPEC).model_copy(update={"step": install.step})
    [plain], _ = effects.driver_effects(unflavoured, SPEC)
    assert isinstance(plain.payload, dm.InstallDriver) and plain.payload.flavour is None


def test_the_rollback_of_a_flavour_change_asks_for_the_old_modules_from_the_source() -> None:
    changed = records.new_saga(
        node=NODE, rollout_id="rollout-1", policy=SPEC, running={Component.GPU: GPU_NEW},
        now=T0, flavour=Flavour.OPEN, running_flavour=Flavour.PROPRIETARY,
    )  # fmt: skip
    step = Step(kind=StepKind.ROLLBACK, component=Component.GPU)

    [issued], _ = effects.driver_effects(changed.model_copy(update={"step": step}), SPEC)

    back = issued.payload
    assert isinstance(back, dm.RollbackDriver)
    assert (back.version, back.flavour) == (GPU_NEW, Flavour.PROPRIETARY)
    assert back.source is not None and back.source.uri == SPEC.driver.gpu.source
    upgraded = saga_for(SPEC, flavour=Flavour.OPEN)  # another version: rolled back as it is
    [plain], _ = effects.driver_effects(upgraded.model_copy(update={"step": step}), SPEC)
    assert isinstance(plain.payload, dm.RollbackDriver)
    assert (plain.payload.version, plain.payload.source) == (GPU_OLD, None)
