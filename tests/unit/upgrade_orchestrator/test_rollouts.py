"""The public rollout events: started once, progress when counts change, completed or failed
once every node ended; and the rollout id every replica derives from the policy."""

from __future__ import annotations

from datetime import timedelta

from gpuop.bus import InMemoryBus, PublishAck
from gpuop.events import Envelope, subjects
from gpuop.events import upgrade as up
from gpuop.events.upgrade import UpgradeState
from gpuop.policy.conditions import RolloutRecord
from gpuop.saga import NodeSaga
from gpuop.services.upgrade_orchestrator.rollouts import (
    RolloutReporter,
    current_rollout,
    rollout_id_for,
)
from tests.support.orchestrator import messages
from tests.support.sagas import T0, policy, saga_for

S = UpgradeState


def in_state(saga: NodeSaga, state: UpgradeState, **changes: object) -> NodeSaga:
    return saga.model_copy(update={"state": state, **changes})


async def rollout_events(bus: InMemoryBus) -> list[up.RolloutEvent]:
    subject = subjects.events_filter("upgrade", subjects.CLUSTER, prefix=bus.prefix)
    found = [payload for _, payload in await messages(bus, subject)]
    assert all(isinstance(event, up.RolloutEvent) for event in found)
    return [event for event in found if isinstance(event, up.RolloutEvent)]


def test_the_rollout_id_names_the_versions_it_installs() -> None:
    assert rollout_id_for(policy()) == "rollout-gpu-580.2"
    assert rollout_id_for(policy(ofed=True)) == "rollout-gpu-580.2-ofed-25.04-2"
    assert rollout_id_for(policy(), 7) == "rollout-gpu-580.2-g7"


def test_a_rollout_is_kept_while_the_versions_stay_and_new_when_they_come_back() -> None:
    first = current_rollout(policy(), None, 1)
    assert first == RolloutRecord(id="rollout-gpu-580.2", versions={"gpu": "580.2"})
    assert current_rollout(policy(max_parallel_upgrades=3), first, 2) == first
    other = current_rollout(policy(ofed=True), first, 3)
    assert other.id == "rollout-gpu-580.2-ofed-25.04-2-g3"
    back = current_rollout(policy(), other, 4)
    assert back.id == "rollout-gpu-580.2-g4" and back.versions == first.versions


def test_a_kernel_module_type_change_is_a_new_rollout_and_auto_keeps_the_old_one() -> None:
    spec = policy()
    first = current_rollout(spec, None, 1)
    gpu = spec.driver.gpu.model_copy(update={"kernel_module_type": "open"})
    opened = spec.model_copy(update={"driver": spec.driver.model_copy(update={"gpu": gpu})})

    second = current_rollout(opened, first, 2)

    assert second.id == "rollout-gpu-580.2-g2"
    assert second.versions == {"gpu": "580.2", "gpu.kernelModuleType": "open"}
    assert current_rollout(spec, second, 3).versions == first.versions  # back to auto


async def test_a_rollout_is_started_once_and_completed_when_every_node_is_done() -> None:
    bus = InMemoryBus()
    await bus.start()
    spec = policy()
    reporter = RolloutReporter(bus)
    a, b = saga_for(spec, node="gpu-a"), saga_for(spec, node="gpu-b")

    await reporter.report("r1", spec, [a, b], T0)
    await reporter.report("r1", spec, [a, b], T0)  # nothing changed: nothing new
    await reporter.report("r1", spec, [in_state(a, S.DRAIN_REQUIRED), b], T0)
    done = [in_state(a, S.UPGRADE_DONE), in_state(b, S.UPGRADE_DONE)]
    await reporter.report("r1", spec, done, T0 + timedelta(seconds=90))
    await RolloutReporter(bus).report("r1", spec, done, T0 + timedelta(seconds=95))  # new leader

    events = await rollout_events(bus)
    assert [type(e) for e in events] == [
        up.RolloutStarted,
        up.RolloutProgress,
        up.RolloutProgress,
        up.RolloutProgress,
        up.RolloutCompleted,
        up.RolloutProgress,
    ]
    progress = [e for e in events if isinstance(e, up.RolloutProgress)]
    assert progress[1].counts == {S.UPGRADE_REQUIRED: 1, S.DRAIN_REQUIRED: 1}
    completed = events[4]
    assert isinstance(completed, up.RolloutCompleted)
    assert (completed.done, completed.total, completed.duration_seconds) == (2, 2, 90)


async def test_a_rollout_fails_when_every_node_ended_and_one_has_no_retry_left() -> None:
    bus = InMemoryBus()
    await bus.start()
    spec = policy()
    a, b = saga_for(spec, node="gpu-a"), saga_for(spec, node="gpu-b")
    retrying = [in_state(a, S.UPGRADE_DONE), in_state(b, S.UPGRADE_FAILED, retry_at=T0)]
    ended = [in_state(a, S.UPGRADE_DONE), in_state(b, S.UPGRADE_FAILED)]

    await RolloutReporter(bus).report("r1", spec, retrying, T0)
    assert not [e for e in await rollout_events(bus) if isinstance(e, up.RolloutFailed)]
    await RolloutReporter(bus).report("r1", spec, ended, T0)

    [failed] = [e for e in await rollout_events(bus) if isinstance(e, up.RolloutFailed)]
    assert failed.failed_nodes == ("gpu-b",)
    assert failed.reason is up.RolloutFailureReason.NODES_FAILED


async def test_a_rollout_the_policy_moved_away_from_is_told_superseded_once() -> None:
    bus = InMemoryBus()
    await bus.start()
    spec = policy()
    reporter = RolloutReporter(bus)
    a, b = saga_for(spec, node="gpu-a"), saga_for(spec, node="gpu-b")
    await reporter.report("r1", spec, [in_state(a, S.UPGRADE_DONE), b], T0)
    await reporter.report("r0", spec, [], T0)  # aborted: back to what the nodes ran
    await reporter.report("r0", spec, [], T0)

    [superseded] = [e for e in await rollout_events(bus) if isinstance(e, up.RolloutFailed)]
    assert superseded.rollout_id == "r1"
    assert superseded.reason is up.RolloutFailureReason.SUPERSEDED
    assert (superseded.done, superseded.failed, superseded.total) == (1, 0, 2)
    assert "r0" in superseded.message


async def test_a_leader_announces_a_rollout_once_however_long_it_runs() -> None:
    # the server drops a repeated id only within its two-minute duplicate window, and the
    # controller reports at every reconcile: a repeat published later is stored again
    bus = InMemoryBus()
    await bus.start()
    published: list[str] = []
    publish = bus.publish

    async def recording(envelope: Envelope, *, republish: bool = False) -> PublishAck:
        published.append(envelope.type)
        return await publish(envelope, republish=republish)

    bus.publish = recording  # type: ignore[method-assign]
    spec = policy()
    reporter = RolloutReporter(bus)
    a, b = saga_for(spec, node="gpu-a"), saga_for(spec, node="gpu-b")
    for minutes, sagas in enumerate(([a, b], [in_state(a, S.DRAIN_REQUIRED), b], [a, b])):
        await reporter.report("r1", spec, sagas, T0 + timedelta(minutes=5 * minutes))

    started = [kind for kind in published if up.RolloutStarted.NAME in kind]
    assert len(started) == 1


async def test_a_reporter_keeps_nothing_of_the_rollouts_before_the_current_one() -> None:
    bus = InMemoryBus()
    await bus.start()
    spec = policy()
    reporter = RolloutReporter(bus)
    saga = saga_for(spec, node="gpu-a")
    for generation in range(1, 6):
        rollout_id = f"r{generation}"
        await reporter.report(rollout_id, spec, [saga], T0)
        await reporter.report(rollout_id, spec, [in_state(saga, S.UPGRADE_DONE)], T0)

    kept = (reporter._reported, reporter._started, reporter._announced, reporter._ended)
    assert all(set(part) <= {"r5"} for part in kept)
    completed = [e for e in await rollout_events(bus) if isinstance(e, up.RolloutCompleted)]
    assert [e.rollout_id for e in completed] == ["r1", "r2", "r3", "r4", "r5"]


async def test_progress_counts_the_skipped_nodes_and_a_skipped_node_keeps_it_open() -> None:
    bus = InMemoryBus()
    await bus.start()
    spec = policy()
    reporter = RolloutReporter(bus)
    a, b = saga_for(spec, node="gpu-a"), saga_for(spec, node="gpu-b")

    await reporter.report("r1", spec, [a, b], T0)
    await reporter.report("r1", spec, [a, b], T0, skipped={"gpu-b"})  # the label set
    done = [in_state(a, S.UPGRADE_DONE), b]
    await reporter.report("r1", spec, done, T0, skipped={"gpu-b"})

    events = await rollout_events(bus)
    progress = [e for e in events if isinstance(e, up.RolloutProgress)]
    assert [p.skipped for p in progress] == [0, 1, 1]
    assert progress[-1].counts == {S.UPGRADE_REQUIRED: 1, S.UPGRADE_DONE: 1}
    assert not [e for e in events if isinstance(e, up.RolloutCompleted | up.RolloutFailed)]
