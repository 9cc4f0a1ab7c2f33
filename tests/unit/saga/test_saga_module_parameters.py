"""A change of the GPU driver's `kernelModuleParameters` alone is an upgrade saga of the same
version (the upgrade kind, its plan unchanged: unload, install (already there), load with the
new parameters, validate): started when the node's last saga loaded its modules with other
ones, its load carrying the policy's, its rollback the old ones; the start record rebuilds it,
so a replay decides the same; a new rollout, so every node is looked at again."""

from __future__ import annotations

from gpuop.events import driver as dm
from gpuop.events.driver import Component
from gpuop.events.upgrade import SagaReason, UpgradeState
from gpuop.policy import GPUClusterPolicySpec, validate_spec
from gpuop.saga.upgrade import effects, folding, records
from gpuop.saga.upgrade.steps import Step, StepKind
from gpuop.services.upgrade_orchestrator import rollouts
from tests.support.sagas import GPU_NEW, NODE, SOURCE, T0

BEFORE = {"nvidia": {"NVreg_EnableGpuFirmware": "1"}}
AFTER = {"nvidia": {"NVreg_EnableGpuFirmware": "0"}, "nvidia_uvm": {"uvm_disable_hmm": "Y"}}
RUNNING = {Component.GPU: GPU_NEW}


def spec(parameters: dict[str, dict[str, str]] | None) -> GPUClusterPolicySpec:
    gpu: dict[str, object] = {"version": GPU_NEW, "source": SOURCE}
    if parameters is not None:
        gpu["kernelModuleParameters"] = parameters
    return validate_spec({"driver": {"gpu": gpu}})


def started_with(before: dict[str, dict[str, str]] | None) -> records.NodeSaga:
    return records.new_saga(
        node=NODE,
        rollout_id="rollout-2",
        policy=spec(AFTER),
        running=RUNNING,
        now=T0,
        running_parameters=before,
    )


def test_other_parameters_than_the_last_saga_loaded_start_a_reload_of_the_same_version() -> None:
    assert records.start_reason(spec(AFTER), RUNNING, None, running_parameters=BEFORE) is (
        SagaReason.VERSION_CHANGE
    )
    assert records.start_reason(spec(AFTER), RUNNING, None, running_parameters=AFTER) is None
    # unknown (no done saga of this node's GPU driver): nothing reloads for parameters
    assert records.start_reason(spec(AFTER), RUNNING, None, running_parameters=None) is None
    assert records.start_reason(spec(None), RUNNING, None, running_parameters={}) is None
    saga = started_with(BEFORE)
    assert saga.components == (Component.GPU,)
    assert saga.targets[Component.GPU].version == GPU_NEW
    assert saga.targets[Component.GPU].parameters == AFTER
    assert saga.previous_parameters == BEFORE


def test_the_parameters_a_done_saga_loaded_are_what_the_node_runs() -> None:
    saga = started_with(BEFORE)
    assert records.parameters_loaded_by(None) is None
    assert records.parameters_loaded_by(saga) is None  # not done yet
    done = saga.model_copy(update={"state": UpgradeState.UPGRADE_DONE})
    assert records.parameters_loaded_by(done) == AFTER


def test_the_load_carries_the_new_parameters_and_the_rollback_the_old_ones() -> None:
    saga = started_with(BEFORE)
    load = saga.model_copy(update={"step": Step(kind=StepKind.LOAD, component=Component.GPU)})
    [issued], _ = effects.driver_effects(load, spec(AFTER))
    assert isinstance(issued.payload, dm.LoadDriver)
    assert (issued.payload.version, issued.payload.parameters) == (GPU_NEW, AFTER)

    back = saga.model_copy(update={"step": Step(kind=StepKind.ROLLBACK, component=Component.GPU)})
    [issued], _ = effects.driver_effects(back, spec(AFTER))
    assert isinstance(issued.payload, dm.RollbackDriver)
    assert (issued.payload.version, issued.payload.parameters) == (GPU_NEW, BEFORE)


def test_the_start_record_rebuilds_the_saga_so_a_replay_decides_the_same() -> None:
    saga = started_with(BEFORE)
    started = folding.start_of(saga, RUNNING)
    assert started.running_parameters == BEFORE
    assert folding.started_saga(NODE, started, spec(AFTER), T0) == saga


def test_a_change_of_the_parameters_alone_is_a_new_rollout() -> None:
    first = rollouts.versions_of(spec(BEFORE))
    assert rollouts.versions_of(spec(AFTER)) != first
    assert rollouts.versions_of(spec(BEFORE)) == first
    assert rollouts.versions_of(spec(None)) == {"gpu": GPU_NEW}  # none: the rollout it had
