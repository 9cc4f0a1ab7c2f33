"""The MIG reconfiguration kind in the orchestrator's runtime, on the in-memory bus: the
node label's request re-carves the node evicting only the holders of the re-carved GPUs,
never cordoning it, and sets `nvidia.com/mig.config.state`; a failed apply the node did not
undo restores the recorded layout and ends failed; an unknown config fails at once; a
relabel while a reconfiguration runs is started after it, not interleaved."""

from __future__ import annotations

from gpuop.cli.events import export_lines
from gpuop.events import kube, subjects
from gpuop.events import mig_commands as migev
from gpuop.events.mig import (
    ConfigState,
    MigReconfigurationStarted,
    MigState,
    NodeMigStateChanged,
)
from gpuop.events.remediation import RemediationStarted, RemediationState
from gpuop.kube import errors
from gpuop.policy import UpgradePolicy
from gpuop.saga import actions, replaying
from gpuop.saga.mig import records
from gpuop.saga.mig.actions import EvictPods, SetConfigState
from gpuop.saga.mig.folding import started
from gpuop.saga.remediation import records as remediation_records
from gpuop.services.upgrade_orchestrator.kinds import KindRunner
from gpuop.services.upgrade_orchestrator.remediations import REMEDIATION
from gpuop.services.upgrade_orchestrator.store import SagaStore
from tests.support.mig_runtime import ConfigMaps, MigAgents, actions_of, reconfiguring
from tests.support.mig_sagas import CONFIG, POD_A, UUIDS, plan_for, policy
from tests.support.orchestrator import events, messages, replays_identically

NODE = "gpu-node-1"
S = MigState


async def published_states(harness: object) -> list[MigState]:
    bus = harness.bus  # type: ignore[attr-defined]
    found = await messages(bus, events(bus.prefix, "mig", NODE))
    return [p.to_state for _, p in found if isinstance(p, NodeMigStateChanged)]


async def test_a_relabel_recarves_the_node_evicting_only_the_holders_and_says_success():
    async with reconfiguring(policy()) as harness:
        await harness.relabel(NODE, "half-balanced")
        await harness.started(NODE)
        await harness.settle(until_ended=(NODE,))
        saga = await harness.saga(NODE)

        assert saga is not None and saga.state is S.MIG_CONFIG_DONE, saga
        [evicted] = actions_of(harness.stack, EvictPods)
        assert evicted.pods == (POD_A,)
        assert not actions_of(harness.stack, actions.Cordon)
        labels = [a.value for a in actions_of(harness.stack, SetConfigState)]
        assert labels == [ConfigState.PENDING, ConfigState.SUCCESS]
        assert await published_states(harness) == [
            S.OPERANDS_PAUSE_REQUIRED, S.HOLDERS_EVICTION_REQUIRED, S.APPLY_REQUIRED,
            S.VERIFICATION_REQUIRED, S.OPERANDS_RESUME_REQUIRED, S.MIG_CONFIG_DONE,
        ]  # fmt: skip
        [apply] = harness.agents.applied
        assert apply.config == "half-balanced"


async def test_the_recorded_start_rebuilds_the_same_saga():
    async with reconfiguring(policy()) as harness:
        await harness.relabel(NODE, "half-balanced")
        saga = await harness.started(NODE)
        await harness.settle(until_ended=(NODE,))
        found = await messages(harness.bus, events(harness.bus.prefix, "mig", NODE, "started"))
        [(envelope, start)] = found
        assert isinstance(start, MigReconfigurationStarted)
        rebuilt = started(NODE, start, saga.step_started)
        assert (rebuilt.saga_id, rebuilt.plan) == (saga.saga_id, saga.plan)
        assert envelope.correlationid == saga.saga_id


async def half_balanced(agents: MigAgents) -> tuple[records.MigSaga, list[ConfigState],
                                                 list[MigState], list[str]]:  # fmt: skip
    """Relabel the node to half-balanced with `agents` until it ends: its saga, the values of
    its state label, the states published and the log."""
    async with reconfiguring(policy(), agents=agents) as harness:
        await harness.relabel(NODE, "half-balanced")
        await harness.started(NODE)
        await harness.settle(until_ended=(NODE,))
        saga = await harness.saga(NODE)
        assert saga is not None
        labels = [a.value for a in actions_of(harness.stack, SetConfigState)]
        return saga, labels, await published_states(harness), await export_lines(harness.bus)


async def test_a_failed_apply_the_node_did_not_undo_is_restored_and_fails():
    agents = MigAgents(fails=migev.MigFailureReason.APPLY_FAILED, restored=False)
    saga, labels, states, _ = await half_balanced(agents)

    assert saga.state is S.MIG_CONFIG_FAILED
    assert saga.restored is True
    _, restore = agents.applied
    assert [layout.mig_enabled for layout in restore.layouts] == [False, False]
    assert S.RESTORE_REQUIRED in states
    assert labels[-1] is ConfigState.FAILED


async def test_an_unknown_config_fails_at_once_without_a_command():
    async with reconfiguring(policy()) as harness:
        await harness.relabel(NODE, "no-such-layout")
        saga = await harness.started(NODE)
        await harness.settle()
        assert saga.state is S.MIG_CONFIG_FAILED
        assert "no MIG config named 'no-such-layout'" in (
            saga.failure.reason if saga.failure else ""
        )
        assert harness.agents.applied == []
        labels = [a.value for a in actions_of(harness.stack, SetConfigState)]
        assert labels == [ConfigState.FAILED]


async def test_a_removed_label_starts_nothing():
    async with reconfiguring(policy()) as harness:
        await harness.relabel(NODE, None)
        await harness.settle()
        assert await harness.saga(NODE) is None


async def test_a_relabel_while_running_is_started_after_it_not_interleaved():
    async with reconfiguring(policy()) as harness:
        await harness.relabel(NODE, "half-balanced")
        await harness.relabel(NODE, "all-balanced")
        first = await harness.started(NODE)
        await harness.settle()
        second = await harness.saga(NODE)
        assert second is not None and second.config == "all-balanced", second
        assert second.state is S.MIG_CONFIG_DONE and second.saga_id != first.saga_id
        assert [a.config for a in harness.agents.applied] == ["half-balanced", "all-balanced"]
        labels = [a.value for a in actions_of(harness.stack, SetConfigState)]
        assert labels == [ConfigState.PENDING, ConfigState.SUCCESS] * 2


async def test_a_leader_records_the_start_its_predecessor_stored_and_did_not_record():
    async with reconfiguring(policy(), ("gpu-node-1", "gpu-node-2")) as harness:
        plan = plan_for("half-balanced")
        stored = records.new_saga(
            node="gpu-node-2", request_id="f" * 32, plan=plan, now=harness.stack.clock.now()
        )
        await harness.store.create(stored)
        runner = harness.stack.runner
        assert runner is not None
        await runner.resume()
        await runner.resume()  # a second leader finds it recorded
        found = await messages(
            harness.bus, events(harness.bus.prefix, "mig", "gpu-node-2", "started")
        )
        assert [p.saga_id for _, p in found] == [stored.saga_id]


async def test_gpuop_replay_reproduces_every_decision_of_each_reconfiguration():
    agents = MigAgents(fails=migev.MigFailureReason.APPLY_FAILED, restored=False)
    async with reconfiguring(policy(), ("gpu-node-1", "gpu-node-2"), agents=agents) as harness:
        await harness.relabel("gpu-node-1", "half-balanced")  # fails, restored by the saga
        await harness.relabel("gpu-node-2", "no-such-layout")  # fails at once
        await harness.relabel("gpu-node-1", "all-balanced")  # queued behind the first
        await harness.started("gpu-node-1")
        await harness.settle(until_ended=("gpu-node-1", "gpu-node-2"))
        await harness.publish(kube.NodeObserved(ready=True, unschedulable=False), NODE)
        await harness.settle(until_ended=("gpu-node-1",))
        lines = await export_lines(harness.bus)

    replayed = replays_identically(lines)
    assert replayed.nodes == {"gpu-node-1", "gpu-node-2"}
    assert replayed.events >= 10, "every answer the reconfigurations decided is counted"
    recorded = replaying.recorded_outputs(replaying.parse_log(lines))
    node_1 = [o.type for o in recorded["gpu-node-1"] if o.kind == "command"]
    assert node_1.count("io.gpuop.cmd.driver-manager.apply-mig-layout.v1") == 3
    assert any(o.kind == "transition" for o in recorded["gpu-node-2"])


async def test_the_configs_of_a_configmap_are_read_when_a_reconfiguration_starts():
    maps = ConfigMaps({("gpuop", "default-mig-parted-config"): {"config.yaml": CONFIG}})
    spec = policy(config=None, config_map="default-mig-parted-config")
    async with reconfiguring(spec, kube=maps) as harness:
        await harness.relabel(NODE, "half-balanced")
        await harness.started(NODE)
        await harness.settle(until_ended=(NODE,))
        saga = await harness.saga(NODE)
        assert saga is not None and saga.state is S.MIG_CONFIG_DONE
        assert maps.reads == [("gpuop", "default-mig-parted-config")]


async def test_a_configmap_that_cannot_be_read_or_parsed_fails_naming_it():
    forbidden = errors.KubeError("configmaps is forbidden", code=403, reason="Forbidden")
    spec = policy(config=None, config_map="layouts", config_map_key="mig.yaml")
    async with reconfiguring(spec, kube=ConfigMaps({}, forbidden)) as harness:
        await harness.relabel(NODE, "half-balanced")
        saga = await harness.started(NODE)
        assert saga.state is S.MIG_CONFIG_FAILED
        assert saga.failure is not None
        assert "ConfigMap layouts key mig.yaml: cannot be read: configmaps is forbidden" in (
            saga.failure.reason
        )
    garbled = ConfigMaps({("gpuop", "layouts"): {"mig.yaml": "version: v2\n"}})
    async with reconfiguring(spec, kube=garbled) as harness:
        await harness.relabel(NODE, "half-balanced")
        saga = await harness.started(NODE)
        assert saga.failure is not None
        assert "ConfigMap layouts key mig.yaml: version must be 'v1'" in saga.failure.reason


async def test_a_node_another_kind_holds_is_not_reconfigured_until_it_ends():
    roomy = policy().model_copy(update={"upgrade_policy": UpgradePolicy(max_unavailable=2)})
    async with reconfiguring(roomy, ("gpu-node-1", "gpu-node-2")) as harness:
        runner = harness.stack.runner
        assert runner is not None
        remediations = await SagaStore.open(harness.bus, REMEDIATION)
        start = RemediationStarted(saga_id=f"remediation/{NODE}/1", unhealthy={UUIDS[0]: (79,)})
        holding = remediation_records.start(NODE, start, harness.stack.clock.now())
        holding = holding.model_copy(update={"state": RemediationState.RESET_REQUIRED})
        await remediations.create(holding)
        runner.kinds = (KindRunner(REMEDIATION, remediations), *runner.kinds)

        await harness.relabel(NODE, "half-balanced")
        await harness.started(NODE)
        await harness.settle()
        waiting = await harness.saga(NODE)
        assert waiting is not None and waiting.state is S.MIG_CONFIG_REQUIRED, waiting

        stored = await remediations.get(NODE)
        assert stored is not None
        ended = stored.saga.model_copy(update={"state": RemediationState.DONE})
        await remediations.replace(ended, stored.revision)
        await harness.settle(until_ended=(NODE,))
        done = await harness.saga(NODE)
        assert done is not None and done.state is S.MIG_CONFIG_DONE


async def test_a_request_about_no_node_starts_nothing_and_is_settled():
    """Discovery never sends one, but a `MigConfigRequested` on the `_cluster` subject (a
    valid event about no node) must be taken and ignored, not redelivered until it is
    dead-lettered (the hostile-input e2e found it)."""
    for spec in (policy(), policy(config=None)):
        async with reconfiguring(spec) as harness:
            await harness.relabel(subjects.CLUSTER, "all-balanced")
            await harness.settle()
            assert await harness.saga(subjects.CLUSTER) is None
            await harness.relabel(NODE, "half-balanced")
            await harness.started(NODE)  # the intake went on past it


async def test_a_pending_mig_mode_reboots_the_node_applies_again_and_replays():
    agents = MigAgents(fails=migev.MigFailureReason.MODE_PENDING, restored=False)
    saga, labels, states, lines = await half_balanced(agents)

    assert saga.state is S.MIG_CONFIG_DONE and saga.rebooted, saga
    assert saga.boot_id == agents.boot_after_reboot and len(agents.applied) == 2
    assert S.REBOOT_REQUIRED in states
    assert ConfigState.REBOOTING in labels and labels[-1] is ConfigState.SUCCESS
    replays_identically(lines)
    recorded = replaying.recorded_outputs(replaying.parse_log(lines))
    sent = [o.type for o in recorded[NODE] if o.kind == "command"]
    assert "io.gpuop.cmd.driver-manager.reboot.v1" in sent
