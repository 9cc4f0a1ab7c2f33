"""The remediation kind in the orchestrator's runtime, on the in-memory bus: a fatal XID
quarantines, evicts only the holders, resets, validates and releases; a failed reset
reboots; the breaker trips at N+1, says so and records the refusal once, which replays (and
a log whose refusal was removed, or whose start became a refusal, is reported); a node in
its upgrade's window folds the remediation in; a remediation and upgrades share one
maxUnavailable budget; the log of each replays identically; a restarted runner re-issues the
pending step."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any, cast

import pytest

from gpuop.bus import Buckets, KeyValue, PublishAck
from gpuop.cli.replay import replay_log
from gpuop.events import Envelope, kube
from gpuop.events import device as dev
from gpuop.events import driver as dm
from gpuop.events import remediation_commands as remedies
from gpuop.events.device_api_commands import DeviceApi, DeviceApiApplied
from gpuop.events.hardware import Gpu, MigInstance, MigMode
from gpuop.events.remediation import (
    NodeRemediationStateChanged,
    RemediationRefused,
    RemediationStarted,
)
from gpuop.events.remediation import RemediationState as R
from gpuop.events.upgrade import NodeAdmitted, NodeUpgradeStateChanged, UpgradeState
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import NodeStatus, actions, replaying
from gpuop.saga.remediation import records
from gpuop.saga.remediation.actions import (
    REPLACEMENT_LABEL,
    EvictPods,
    MarkReplacement,
    MirrorHealth,
)
from gpuop.services.upgrade_orchestrator.kinds import KindRunner
from gpuop.services.upgrade_orchestrator.remediations import REMEDIATION, Starter
from gpuop.services.upgrade_orchestrator.store import SagaStore, is_saga_key
from tests.support import orchestrator
from tests.support.inventories import H200, inventory
from tests.support.orchestrator import events, messages
from tests.support.remediations import GPU, HOLDER, Agents, Remediating, actions_of, remediating
from tests.support.sagas import BOOT_A, BOOT_B, policy, saga_for

NODE = "gpu-node-1"


def with_remediation(spec: GPUClusterPolicySpec, **changes: object) -> GPUClusterPolicySpec:
    return spec.model_copy(update={"remediation": spec.remediation.model_copy(update=changes)})


def replays_identically(lines: list[str]) -> replaying.Replayed:
    replayed = orchestrator.replays_identically(lines)
    assert not replayed.breaker_differs, (replayed.refused, replayed.allowed, replayed.unrecorded)
    return replayed


async def states(bus_prefix: str, harness: object, node: str = NODE) -> list[R]:
    found = await messages(harness.bus, events(bus_prefix, "remediation", node))  # type: ignore[attr-defined]
    return [p.to_state for _, p in found if isinstance(p, NodeRemediationStateChanged)]


async def test_a_fatal_xid_ends_with_the_gpu_validated_the_node_released_only_holders_evicted() -> (
    None
):
    async with remediating(policy()) as harness:
        await harness.fault(NODE)
        await harness.settle(until_ended=(NODE,))
        saga = await harness.saga(NODE)

        assert saga is not None and saga.state is R.DONE, saga
        mirrors = actions_of(harness.stack, MirrorHealth)
        assert [m.taint for m in mirrors] == [True, False]
        assert mirrors[0].unhealthy == ((GPU, (79,)),) and mirrors[-1].unhealthy == ()
        [evicted] = actions_of(harness.stack, EvictPods)
        assert evicted.pods == (HOLDER,)
        assert not actions_of(harness.stack, actions.Cordon)  # only the holders move
        assert actions_of(harness.stack, actions.RunValidationPod)
        walked = await states(harness.bus.prefix, harness)
        assert walked == [
            R.HOLDERS_REQUIRED, R.EVICTION_REQUIRED, R.OPERANDS_PAUSE_REQUIRED,
            R.RESET_REQUIRED, R.VALIDATION_REQUIRED, R.RELEASE_REQUIRED, R.DONE,
        ]  # fmt: skip
        commands = await messages(harness.bus, f"{harness.bus.prefix}.cmd.>")
        kinds = [type(p) for _, p in commands]
        assert remedies.ResetGpu in kinds and dm.RebootNode not in kinds
        replayed = replays_identically(await harness.export())
        assert NODE in replayed.nodes


def marks_when_done_is_published(harness: Remediating) -> list[tuple[bool, bool]]:
    """Each time remediation-done is published: the node's marks as the executor left them
    (`GPUHealthy` True, the taint on), read at that very moment."""
    seen: list[tuple[bool, bool]] = []
    publish = harness.bus.publish

    async def watching(envelope: Envelope, *, republish: bool = False) -> PublishAck:
        if (
            envelope.type == NodeRemediationStateChanged.TYPE
            and envelope.data.get("to_state") == R.DONE.value
        ):
            seen.append(harness.stack.kube.marks.get(envelope.subject, (False, True)))
        return await publish(envelope, republish=republish)

    harness.bus.publish = watching  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize("folded", [False, True])
async def test_done_is_published_only_once_the_node_is_released(folded: bool) -> None:
    async with remediating(policy()) as harness:
        seen = marks_when_done_is_published(harness)
        if folded:
            await fold_and_validate(harness)
        else:
            await harness.fault(NODE)
            await harness.settle(until_ended=(NODE,))

        saga = await harness.saga(NODE)
        assert saga is not None and saga.state is R.DONE
        assert seen == [(True, False)], "remediation-done went out before the node's release"
        assert saga.last_transitions[-1].from_state is R.RELEASE_REQUIRED
        if not folded:  # the folded case's upgrade move is the test's, not a replayed saga's
            replays_identically(await harness.export())


async def test_an_application_xid_changes_nothing() -> None:
    async with remediating(policy()) as harness:
        await harness.fault(NODE, xid=13, action=dev.XidAction.RESTART_APPLICATION)
        await harness.settle()
        assert await harness.saga(NODE) is None
        assert harness.stack.kube.done == []


async def test_a_reset_that_fails_reboots_and_the_new_boot_validates() -> None:
    agents = Agents(reset_fails=remedies.ResetFailureReason.RESET_FAILED)
    async with remediating(policy(), agents=agents) as harness:
        await harness.fault(NODE)
        await harness.settle(until_ended=(NODE,))
        saga = await harness.saga(NODE)

        assert saga is not None and saga.state is R.DONE and saga.rebooted
        assert saga.boot_id == BOOT_B
        [(_, reboot)] = [
            m for m in await messages(harness.bus, f"{harness.bus.prefix}.cmd.>")
            if isinstance(m[1], dm.RebootNode)
        ]  # fmt: skip
        assert isinstance(reboot, dm.RebootNode) and reboot.boot_id == BOOT_A
        assert R.REBOOT_REQUIRED in await states(harness.bus.prefix, harness)
        replays_identically(await harness.export())


async def test_a_reset_that_fails_without_reboots_allowed_fails_tainted() -> None:
    agents = Agents(reset_fails=remedies.ResetFailureReason.NOT_SUPPORTED)
    spec = with_remediation(policy(), allow_reboot=False)
    async with remediating(spec, agents=agents) as harness:
        await harness.fault(NODE)
        await harness.settle(until_ended=(NODE,))
        saga = await harness.saga(NODE)

        assert saga is not None and saga.state is R.FAILED
        last = actions_of(harness.stack, MirrorHealth)[-1]
        assert last.taint is True and "not-supported" in last.detail
        replays_identically(await harness.export())


async def test_the_breaker_trips_at_n_plus_one_and_the_policy_says_so() -> None:
    nodes = ("gpu-node-1", "gpu-node-2", "gpu-node-3", "gpu-node-4")
    spec = with_remediation(policy(max_unavailable=4), max_per_hour=3)
    async with remediating(spec, nodes) as harness:
        for node in nodes:
            await harness.fault(node)
        await harness.settle(until_ended=nodes[:3])

        started = [await harness.saga(node) for node in nodes]
        assert [s is not None for s in started] == [True, True, True, False]
        now = harness.stack.clock.now()
        tripped = harness.starter.condition(spec, now)
        assert (tripped.type, tripped.status, tripped.reason) == (
            "RemediationBreaker", "True", "Tripped",
        )  # fmt: skip
        assert harness.starter.refused_at == now
        lines = await harness.export()
        replays_identically(lines)
        assert sum('"type":"io.gpuop.remediation.started.v1"' in line for line in lines) == 3
        [(envelope, refused)] = await refusals(harness)
        assert envelope.node == "gpu-node-4" and envelope.causationid
        assert (refused.starts, refused.max_per_hour) == (3, 3)
        assert refused.unhealthy == {GPU: (79,)} and refused.reopens is not None
        assert refused.reopens > envelope.time


async def refusals(harness: Remediating) -> list[tuple[Envelope, RemediationRefused]]:
    found = await messages(harness.bus, f"{harness.bus.prefix}.evt.remediation.>")
    return [(e, p) for e, p in found if isinstance(p, RemediationRefused)]


async def tripped_log() -> list[str]:
    """The exported log of two faults under `maxPerHour: 1`: one start, one refusal."""
    nodes = ("gpu-node-1", "gpu-node-2")
    spec = with_remediation(policy(max_unavailable=2), max_per_hour=1)
    async with remediating(spec, nodes) as harness:
        for node in nodes:
            await harness.fault(node)
        await harness.settle(until_ended=nodes[:1])
        assert len(await refusals(harness)) == 1
        return await harness.export()


def is_type(line: str, type_: str) -> bool:
    return bool(json.loads(line)["message"]["type"] == type_)


async def test_a_refused_health_event_redelivered_is_recorded_once() -> None:
    nodes = ("gpu-node-1", "gpu-node-2")
    spec = with_remediation(policy(max_unavailable=2), max_per_hour=1)
    async with remediating(spec, nodes) as harness:
        for node in nodes:
            await harness.fault(node)
        await harness.settle(until_ended=nodes[:1])
        [(envelope, _)] = await refusals(harness)
        health = dev.DeviceHealthChanged(
            gpu_uuid=GPU, healthy=False, reason=dev.HealthReason.XID, xid=79
        )
        later = harness.stack.clock.now()
        for _ in range(3):  # redelivered after a crash: the same cause each time
            await harness.starter("gpu-node-2", health, later, envelope.causationid)
        assert len(await refusals(harness)) == 1
        replays_identically(await harness.export())


async def test_a_log_with_its_refusal_removed_is_reported(tmp_path: Path) -> None:
    lines = [
        line for line in await tripped_log()
        if not is_type(line, RemediationRefused.TYPE)
    ]  # fmt: skip
    replayed = replaying.replay(replaying.parse_log(lines))
    [missing] = replayed.unrecorded
    assert "gpu-node-2" in missing and "no refusal" in missing
    assert not replayed.refused and not replayed.allowed

    tampered = tmp_path / "log.jsonl"
    tampered.write_text("\n".join(lines))
    assert await replay_log(argparse.Namespace(file=str(tampered), policy=None), {}) == 1


async def test_a_log_whose_start_became_a_refusal_is_reported(tmp_path: Path) -> None:
    lines = await tripped_log()
    [index] = [i for i, line in enumerate(lines) if is_type(line, RemediationStarted.TYPE)]
    line = json.loads(lines[index])
    started = RemediationStarted.model_validate(line["message"]["data"])
    refused = RemediationRefused(unhealthy=started.unhealthy, starts=1, max_per_hour=1)
    line["message"]["type"] = RemediationRefused.TYPE
    line["message"]["data"] = refused.model_dump(mode="json")
    line["subject"] = line["subject"].replace(".started", ".refused")
    lines[index] = json.dumps(line)

    replayed = replaying.replay(replaying.parse_log(lines))
    assert replayed.allowed and "gpu-node-1" in replayed.allowed[0]
    assert "maxPerHour" in replayed.allowed[0]
    tampered = tmp_path / "log.jsonl"
    tampered.write_text("\n".join(lines))
    assert await replay_log(argparse.Namespace(file=str(tampered), policy=None), {}) == 1


async def test_the_untampered_tripped_log_replays_through_the_cli(tmp_path: Path) -> None:
    recorded = tmp_path / "log.jsonl"
    recorded.write_text("\n".join(await tripped_log()))
    assert await replay_log(argparse.Namespace(file=str(recorded), policy=None), {}) == 0


async def test_the_replay_reports_a_start_the_breaker_would_have_refused() -> None:
    nodes = ("gpu-node-1", "gpu-node-2")
    spec = with_remediation(policy(max_unavailable=2), max_per_hour=0)
    async with remediating(spec, nodes) as harness:
        for node in nodes:
            await harness.fault(node)
        await harness.settle(until_ended=nodes)
        lines = await harness.export()

    log = replaying.parse_log(lines)
    strict = with_remediation(spec, max_per_hour=1)
    replayed = replaying.replay(log, strict)
    assert len(replayed.refused) == 1 and "maxPerHour" in replayed.refused[0]


async def fold_and_validate(harness: Remediating) -> None:
    """A fault on a node in its upgrade's window (folded in), then the upgrade validates."""
    store = harness.stack.store
    assert store is not None
    upgrade = saga_for(harness.stack.policy, node=NODE).model_copy(
        update={"state": UpgradeState.DRIVER_RELOAD_REQUIRED}
    )
    await store.create(upgrade)
    await harness.fault(NODE)
    await harness.settle()
    saga = await harness.saga(NODE)
    assert saga is not None and saga.state is R.FOLDED
    assert saga.folded_into == upgrade.saga_id
    assert not actions_of(harness.stack, EvictPods)  # the upgrade's window moves the pods

    validated = NodeUpgradeStateChanged(
        rollout_id=upgrade.rollout_id, from_state=UpgradeState.VALIDATION_REQUIRED,
        to_state=UpgradeState.UNCORDON_REQUIRED, components=upgrade.components,
        target_versions={c: t.version for c, t in upgrade.targets.items()},
    )  # fmt: skip
    await harness.publish(validated, NODE, source="/gpuop/upgrade-orchestrator")
    await harness.settle(until_ended=(NODE,))


async def test_a_node_whose_upgrade_reload_is_ahead_folds_the_remediation_into_it() -> None:
    async with remediating(policy()) as harness:
        await fold_and_validate(harness)
        done = await harness.saga(NODE)
        assert done is not None and done.state is R.DONE
        assert actions_of(harness.stack, MirrorHealth)[-1].taint is False
        assert await states(harness.bus.prefix, harness) == [R.RELEASE_REQUIRED, R.DONE]


async def test_a_remediation_waits_while_the_node_s_upgrade_holds_it_past_its_reload() -> None:
    async with remediating(policy()) as harness:
        store = harness.stack.store
        assert store is not None
        # validated already: the reload is behind, so the remediation does not fold in
        upgrade = saga_for(harness.stack.policy, node=NODE).model_copy(
            update={"state": UpgradeState.UNCORDON_REQUIRED}
        )
        stored = await store.create(upgrade)
        await harness.fault(NODE)
        await harness.started(NODE)
        await harness.settle()
        waiting = await harness.saga(NODE)
        assert waiting is not None and waiting.folded_into is None
        assert waiting.state is R.ADMISSION_REQUIRED  # the upgrade holds the node

        done = upgrade.model_copy(update={"state": UpgradeState.UPGRADE_DONE})
        await store.replace(done, stored.revision)
        await harness.settle()
        admitted = await harness.saga(NODE)
        assert admitted is not None and admitted.state is not R.ADMISSION_REQUIRED


async def test_a_remediation_and_upgrades_share_one_max_unavailable_budget() -> None:
    nodes = ("gpu-node-1", "gpu-node-2")
    spec = policy(max_unavailable=1)
    async with remediating(spec, nodes) as harness:
        store = harness.stack.store
        runner = harness.stack.runner
        assert store is not None and runner is not None
        for node in nodes:
            await store.create(saga_for(spec, node=node))
        await harness.fault("gpu-node-1")
        await harness.started("gpu-node-1")
        await harness.settle(until_ended=("gpu-node-1",))

        admitted = await messages(
            harness.bus, events(harness.bus.prefix, "upgrade", name="admitted")
        )
        order = [p.saga_id for _, p in admitted if isinstance(p, NodeAdmitted)]
        remediation = await harness.saga("gpu-node-1")
        assert remediation is not None and remediation.state is R.DONE
        # the remediation took the one slot: no upgrade was admitted while it held its node
        assert order[0] == remediation.saga_id
        assert runner.held() == {}  # released once done
        await harness.settle()
        admitted = await messages(
            harness.bus, events(harness.bus.prefix, "upgrade", name="admitted")
        )
        later = [p.saga_id for _, p in admitted if isinstance(p, NodeAdmitted)][1:]
        assert later and all(saga_id.startswith("rollout-1/") for saga_id in later)


async def test_a_waiting_remediation_holds_its_node_from_upgrades() -> None:
    nodes = ("gpu-node-1", "gpu-node-2")
    spec = policy(max_unavailable=1)
    # gpu-node-2 is cordoned by someone: the one slot is taken, the remediation waits
    statuses = {"gpu-node-2": NodeStatus(unschedulable=True)}
    async with remediating(spec, nodes, statuses=statuses) as harness:
        runner = harness.stack.runner
        store = harness.stack.store
        assert runner is not None and store is not None
        await store.create(saga_for(spec, node="gpu-node-1"))
        await harness.fault("gpu-node-1")
        await harness.started("gpu-node-1")
        await harness.settle()
        waiting = await harness.saga("gpu-node-1")
        assert waiting is not None and waiting.state is R.ADMISSION_REQUIRED
        assert runner.held() == {"gpu-node-1": "gpu-remediation"}
        planned = await runner.admit(
            {"gpu-node-1": NodeStatus(), **harness.statuses}, harness.stack.clock.now()
        )
        assert planned is not None and planned.nodes == ()
        harness.statuses.clear()  # the slot frees: the remediation goes first
        await harness.settle(until_ended=("gpu-node-1",))
        done = await harness.saga("gpu-node-1")
        assert done is not None and done.state is R.DONE


async def test_the_remediation_record_lives_under_its_own_key() -> None:
    async with remediating(policy()) as harness:
        await harness.fault(NODE)
        await harness.settle()
        keys = await (await harness.bus.kv(Buckets.SAGAS)).keys()
        assert "remediation.gpu-node-1" in keys
        assert not is_saga_key("remediation.gpu-node-1") and is_saga_key("gpu-node-1")
        [(_, started)] = await messages(
            harness.bus, events(harness.bus.prefix, "remediation", NODE, "started")
        )
        assert isinstance(started, RemediationStarted) and started.boot_id == BOOT_A


async def test_a_restarted_runner_reissues_the_pending_step_with_the_same_ids() -> None:
    agents = Agents(reboots=False, reset_fails=remedies.ResetFailureReason.TIMEOUT)
    async with remediating(policy(), agents=agents) as harness:
        await harness.fault(NODE)
        await harness.settle()
        saga = await harness.saga(NODE)
        assert saga is not None and saga.state is R.REBOOT_REQUIRED
        before = [m for m in await messages(harness.bus, f"{harness.bus.prefix}.cmd.>")]
        runner = harness.stack.runner
        assert runner is not None
        fresh = SagaStore(await harness.bus.kv(Buckets.SAGAS), REMEDIATION)
        runner.kinds = (KindRunner(REMEDIATION, fresh),)
        assert await runner.resume() == 1
        after = [m for m in await messages(harness.bus, f"{harness.bus.prefix}.cmd.>")]
        assert [e.id for e, _ in after] == [e.id for e, _ in before]  # the reboot, deduped
        assert harness.stack.deadlines is not None
        assert NODE in harness.stack.deadlines.pending("gpu-remediation")


@pytest.mark.parametrize("quarantine", [True, False])
async def test_quarantine_is_the_policys_choice(quarantine: bool) -> None:
    spec = with_remediation(policy(), quarantine=quarantine)
    async with remediating(spec) as harness:
        await harness.fault(NODE)
        await harness.settle()
        first = actions_of(harness.stack, MirrorHealth)[0]
        assert first.taint is (True if quarantine else None)


async def test_a_start_its_leader_did_not_record_is_recorded_on_takeover() -> None:
    async with remediating(policy()) as harness:
        runner = harness.stack.runner
        assert runner is not None
        started = RemediationStarted(
            saga_id="remediation/gpu-node-1/1", unhealthy={GPU: (79,)}, boot_id=BOOT_A,
            driver_version="535.161.08",
        )  # fmt: skip
        saga = records.start(NODE, started, harness.stack.clock.now())
        await harness.store.create(saga)  # stored, then the leader died

        await runner.resume()
        await runner.resume()  # a second takeover finds it recorded
        found = await messages(
            harness.bus, events(harness.bus.prefix, "remediation", NODE, "started")
        )
        assert [p for _, p in found] == [started]
        await harness.settle(until_ended=(NODE,))
        replays_identically(await harness.export())


async def test_faults_on_two_nodes_at_once_start_no_more_than_the_breaker_allows() -> None:
    nodes = ("gpu-node-1", "gpu-node-2", "gpu-node-3")
    spec = with_remediation(policy(max_unavailable=3), max_per_hour=1)
    async with remediating(spec, nodes) as harness:
        runner = harness.stack.runner
        assert runner is not None and harness.stack.store is not None

        class Slow:
            """The inventories, read slowly: every start in flight at once."""

            def __init__(self, kv: Any) -> None:
                self.kv = kv

            async def get(self, key: str) -> Any:
                await asyncio.sleep(0.05)
                return await self.kv.get(key)

        inventories = cast(KeyValue, Slow(await harness.bus.kv(Buckets.NODES)))
        starter = Starter(runner, harness.stack.store, harness.store, inventories)
        runner.kinds = (starter.runner(),)
        fault = dev.DeviceHealthChanged(
            gpu_uuid=GPU, healthy=False, reason=dev.HealthReason.XID, xid=48,
            action=dev.XidAction.RESET_GPU,
        )  # fmt: skip
        now = harness.stack.clock.now()
        await asyncio.gather(*(runner.apply(node, fault, now) for node in nodes))
        started = [await harness.saga(node) for node in nodes]
        assert sum(saga is not None for saga in started) == 1


async def test_a_remediation_on_a_node_the_upgrades_do_not_select_is_admitted() -> None:
    async with remediating(policy(), ("gpu-node-1", "gpu-node-2")) as harness:
        runner = harness.stack.runner
        assert runner is not None
        await harness.fault("gpu-node-2")
        await harness.started("gpu-node-2")
        every = {node: NodeStatus() for node in harness.nodes}
        await runner.admit({"gpu-node-1": NodeStatus()}, harness.stack.clock.now(), every=every)
        admitted = await messages(
            harness.bus, events(harness.bus.prefix, "upgrade", "gpu-node-2", "admitted")
        )
        ids = [p.saga_id for _, p in admitted if isinstance(p, NodeAdmitted)]
        assert ids == [(await harness.started("gpu-node-2")).saga_id]


MIG = MigInstance(
    uuid="MIG-11111111-2222-3333-4444-555555555555", profile="1g.18gb", gpu_instance_slices=1,
    compute_instance_slices=1, memory_bytes=18 << 30, multiprocessors=16,
    gpu_instance_profile_id=19, placement_start=2, placement_size=1,
)  # fmt: skip


@pytest.mark.parametrize(
    ("applied", "gpus", "devices"),
    [
        (DeviceApiApplied(api=DeviceApi.DRA, serving=True), (H200,), {GPU: ("gpu-0",)}),
        (
            DeviceApiApplied(api=DeviceApi.DRA, serving=True),
            (H200.model_copy(update={"mig_mode": MigMode.ENABLED, "mig_devices": (MIG,)}),),
            {GPU: ("gpu-0-mig-1g18gb-19-2",)},
        ),
        (DeviceApiApplied(api=DeviceApi.DRA, serving=False), (H200,), {}),
        (DeviceApiApplied(api=DeviceApi.DEVICE_PLUGIN, serving=True), (H200,), {}),
        (None, (H200,), {}),
    ],
    ids=["dra", "dra-mig", "dra-not-serving", "device-plugin", "never-said"],
)
async def test_a_start_quarantines_the_devices_of_a_node_serving_dra_only(
    applied: DeviceApiApplied | None, gpus: tuple[Gpu, ...], devices: dict[str, tuple[str, ...]]
) -> None:
    async with remediating(policy(), gpus=gpus) as harness:
        if applied is not None:
            await harness.publish(applied, NODE, source="/gpuop/device-plugin")
        await harness.fault(NODE)
        await harness.settle()
        [(_, started)] = await messages(
            harness.bus, events(harness.bus.prefix, "remediation", NODE, "started")
        )
        first = actions_of(harness.stack, MirrorHealth)[0]

    assert isinstance(started, RemediationStarted) and started.dra_devices == devices
    assert first.taint is True
    assert first.devices == (tuple(d for names in devices.values() for d in names) or None)


NEW_GPU = "GPU-30bce083-dbf9-2d4f-3c35-c858915accc6"


async def ask_release(harness: Remediating) -> None:
    """An admin (`gpuop remediation release`) or a repair flow set the label to done."""
    seen = kube.NodeObserved(
        ready=True, unschedulable=True, boot_id=BOOT_A, labels={REPLACEMENT_LABEL: "done"}
    )
    await harness.publish(seen, NODE, source="/gpuop/upgrade-orchestrator")
    await harness.settle()


async def test_drain_and_replace_holds_the_node_until_new_hardware_is_released() -> None:
    async with remediating(policy()) as harness:
        await harness.fault(NODE, action=dev.XidAction.DRAIN_AND_REPLACE)
        await harness.settle()
        saga = await harness.saga(NODE)
        assert saga is not None and saga.state is R.REPLACEMENT_REQUIRED
        assert saga.step.name == "replacement"
        assert saga.slots == {saga.gpu_uuids[0]: H200.pci_bus_id}
        [evicted] = actions_of(harness.stack, EvictPods)
        assert evicted.pods == (HOLDER,)
        assert len(actions_of(harness.stack, actions.Cordon)) == 1
        assert [m.value for m in actions_of(harness.stack, MarkReplacement)] == ["required"]
        commands = await messages(harness.bus, f"{harness.bus.prefix}.cmd.>")
        assert not any(isinstance(p, dm.RebootNode) for _, p in commands)

        await ask_release(harness)  # the old GPU is still what discovery last listed
        saga = await harness.saga(NODE)
        assert saga is not None and saga.state is R.REPLACEMENT_REQUIRED
        assert saga.release_refusals == 1 and not actions_of(harness.stack, actions.Uncordon)

        swapped = inventory(gpus=(H200.model_copy(update={"uuid": NEW_GPU}),), boot_id=BOOT_A)
        await harness.publish(swapped, NODE, source="/gpuop/discovery")
        await ask_release(harness)
        await harness.settle(until_ended=(NODE,))

        saga = await harness.saga(NODE)
        assert saga is not None and saga.state is R.DONE, saga
        assert len(actions_of(harness.stack, actions.Uncordon)) == 1
        assert [m.value for m in actions_of(harness.stack, MarkReplacement)][-1] is None
        walked = await states(harness.bus.prefix, harness)
        assert walked[-4:] == [
            R.REPLACEMENT_REQUIRED, R.VALIDATION_REQUIRED, R.RELEASE_REQUIRED, R.DONE,
        ]  # fmt: skip
        replays_identically(await harness.export())


def with_preflight() -> GPUClusterPolicySpec:
    dcgm = {"image": "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04",
            "command": ["dcgmi", "diag", "-r", "1"]}  # fmt: skip
    return with_remediation(policy(validation={"preflight": dcgm}), rungs=("nvml", "preflight"))


@pytest.mark.parametrize("fails", ["", "Failed: validator exited 226 (Error): GPU 0: Fail"])
async def test_the_preflight_diagnostic_gates_the_release_and_replays_identically(
    fails: str,
) -> None:
    fake = orchestrator.FakeKube(diagnostic_fails=fails)
    async with remediating(with_preflight(), kube=fake) as harness:
        await harness.fault(NODE)
        await harness.settle(until_ended=(NODE,))
        saga = await harness.saga(NODE)

        [diagnostic] = actions_of(harness.stack, actions.RunValidationPod)
        assert diagnostic.all_gpus and diagnostic.command == ("dcgmi", "diag", "-r", "1")
        assert saga is not None
        if fails:
            assert saga.state is R.FAILED and saga.failure is not None
            assert "validate-preflight" in saga.failure and "GPU 0: Fail" in saga.failure
            assert actions_of(harness.stack, MirrorHealth)[-1].taint is True
        else:
            assert saga.state is R.DONE
        replays_identically(await harness.export())
