"""The orchestrator's runtime on the in-memory bus: persist first then act, compare-and-set
conflicts decided again, rebuild after a crash with the same ids, deadlines as events."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from gpuop.bus import InMemoryBus, KeyExists, MessageTooLarge, PublishAck, PublishTimeout
from gpuop.events import Command, Envelope, ids, kube, subjects
from gpuop.events import device as dev
from gpuop.events import driver as dm
from gpuop.events.deadlines import DeadlineExpired
from gpuop.events.upgrade import NodeAdmitted, NodeUpgradeStateChanged, SagaStarted, UpgradeState
from gpuop.saga import NodeSaga, NodeStatus, actions, pending
from gpuop.saga.machine import deadline_event
from gpuop.saga.upgrade import folding
from gpuop.saga.upgrade.core import Admitted, decide
from gpuop.services.upgrade_orchestrator import intake, running
from gpuop.services.upgrade_orchestrator.deadlines import deadline_event_id
from gpuop.services.upgrade_orchestrator.store import SagaStore, StoredSaga
from tests.support.orchestrator import Stack, events, messages
from tests.support.sagas import BOOT_B, NODE, T0, Run, policy, saga_for

S = UpgradeState


@pytest.fixture
async def stack(bus: InMemoryBus) -> AsyncIterator[Stack]:
    running = Stack(bus, policy())
    await running.start()
    yield running
    await running.stop()


async def wait_for_state(stack: Stack, state: UpgradeState) -> NodeSaga:
    async with asyncio.timeout(5):
        while (saga := await stack.saga(NODE)).state is not state:
            await asyncio.sleep(0.005)
    return saga


async def admission_recorded(stack: Stack) -> tuple[NodeAdmitted, Envelope]:
    """Store the node's saga and admit it: the `NodeAdmitted` in the log, not decided yet."""
    assert stack.runner is not None and stack.store is not None
    await stack.store.create(saga_for(stack.policy))
    await stack.runner.admit({NODE: NodeStatus()}, T0)
    [(envelope, admitted)] = await messages(
        stack.bus, events(stack.bus.prefix, "upgrade", NODE, "admitted")
    )
    assert isinstance(admitted, NodeAdmitted)
    return admitted, envelope


async def admit_and_decide(stack: Stack) -> None:
    """Admit the node and answer its stage: the saga's next step is the cordon."""
    assert stack.runner is not None
    admitted, envelope = await admission_recorded(stack)
    await stack.runner.apply(NODE, admitted, envelope.time)
    saga = await stack.saga(NODE)
    assert saga.step.token == "stage-gpu"
    staged = dm.DriverStaged(
        command_id=ids.step(saga.saga_id, saga.step.token, saga.attempt),
        component=dm.Component.GPU,
        version=saga.targets[dm.Component.GPU].version,
    )
    await stack.runner.apply(NODE, staged, envelope.time)


async def test_admission_is_recorded_then_persisted_then_acted_on(stack: Stack) -> None:
    await admit_and_decide(stack)
    assert (await stack.saga(NODE)).state is S.CORDON_REQUIRED
    assert stack.outbox is not None
    await stack.outbox.idle()

    done = [action for _, action in stack.kube.done]
    # the state label and the Event go out with the stage command, the cordon once staged
    assert [type(a) for a in done] == [actions.SetStateLabel, actions.RecordEvent, actions.Cordon]
    assert isinstance(done[0], actions.SetStateLabel) and done[0].value is S.CORDON_REQUIRED
    [(_, stage)] = await messages(stack.bus, subjects.commands_filter(prefix=stack.bus.prefix))
    assert isinstance(stage, dm.StageDriver)
    [(_, cordoned)] = await messages(stack.bus, events(stack.bus.prefix, "kube", NODE, "cordoned"))
    assert isinstance(cordoned, kube.NodeCordoned)
    assert cordoned.action_id == done[2].id
    [(envelope, changed)] = await messages(
        stack.bus, events(stack.bus.prefix, "upgrade", NODE, "cordon-required")
    )
    assert isinstance(changed, NodeUpgradeStateChanged)
    assert changed.from_state is S.UPGRADE_REQUIRED
    assert envelope.correlationid == changed.rollout_id


async def test_states_passed_through_in_one_decision_write_only_the_last_state_label(
    stack: Stack,
) -> None:
    await admit_and_decide(stack)
    assert stack.outbox is not None and stack.runner is not None
    await stack.outbox.idle()
    (cordon,) = [a for _, a in stack.kube.done if isinstance(a, actions.Cordon)]
    stack.kube.done.clear()

    decision = await stack.runner.apply(NODE, kube.NodeCordoned(action_id=cordon.id), T0)
    await stack.outbox.idle()

    assert decision is not None
    assert [t.to_state for t in decision.transitions] == [
        S.WAIT_FOR_JOBS_REQUIRED,  # no job selector: passed through
        S.POD_DELETION_REQUIRED,
    ]
    done = [action for _, action in stack.kube.done]
    # no Kubernetes Event for these states (`drafting.RECORDED_STATES`)
    assert [type(a) for a in done] == [actions.SetStateLabel, actions.DeletePods]
    assert [a.value for a in done if isinstance(a, actions.SetStateLabel)] == [
        S.POD_DELETION_REQUIRED
    ]


async def test_a_node_whose_actions_all_ran_holds_no_worker_or_queue(stack: Stack) -> None:
    """With thousands of nodes, an idle worker and queue kept per node add up."""
    await admit_and_decide(stack)
    assert stack.outbox is not None
    await stack.outbox.idle()

    assert len(stack.kube.done) == 3
    assert stack.outbox._workers == {} and stack.outbox._queues == {}


async def test_a_second_admission_pass_does_not_admit_beyond_the_limit(bus: InMemoryBus) -> None:
    stack = Stack(bus, policy(max_parallel_upgrades=1, max_unavailable=2))
    runner = await stack.start()
    try:
        assert stack.store is not None
        for node in ("gpu-a", "gpu-b"):
            await stack.store.create(saga_for(stack.policy, node=node))
        statuses = {"gpu-a": NodeStatus(), "gpu-b": NodeStatus()}
        first = await runner.admit(statuses, T0)
        second = await runner.admit(statuses, T0)
        assert first is not None and second is not None
        assert first.nodes == ("gpu-a",)
        assert second.nodes == ()
    finally:
        await stack.stop()


class InterferingStore(SagaStore):
    """Another writer records a new boot id just before our first write."""

    interfered = True
    """Set once the test armed it: the admission's own write goes through."""

    async def replace(self, saga: NodeSaga, revision: int) -> StoredSaga:
        if not self.interfered:
            self.interfered = True
            current = await self.get(saga.node)
            assert current is not None
            newer = current.saga.model_copy(update={"boot_id": BOOT_B})
            await self.replace(newer, current.revision)
        return await super().replace(saga, revision)


async def test_revision_conflict_reads_again_and_decides_on_the_newer_saga(
    bus: InMemoryBus,
) -> None:
    stack = Stack(bus, policy(), store_type=InterferingStore)
    runner = await stack.start()
    try:
        await admit_and_decide(stack)
        assert isinstance(stack.store, InterferingStore)
        stack.store.interfered = False
        saga = await stack.saga(NODE)
        cordon_id = ids.step(saga.saga_id, saga.step.token, saga.attempt)
        decision = await runner.apply(NODE, kube.NodeCordoned(action_id=cordon_id), T0)
    finally:
        await stack.stop()

    assert decision is not None
    stored = await stack.saga(NODE)
    assert stored.state is S.POD_DELETION_REQUIRED
    assert stored.boot_id == BOOT_B  # decided on the other writer's saga, not over it


async def test_a_second_create_of_a_node_saga_is_refused(stack: Stack) -> None:
    assert stack.store is not None
    await stack.store.create(saga_for(stack.policy))
    with pytest.raises(KeyExists):
        await stack.store.create(saga_for(stack.policy, rollout="rollout-2"))


async def test_rebuild_after_a_crash_reissues_the_pending_step_with_the_same_ids(
    bus: InMemoryBus,
) -> None:
    first = Stack(bus, policy())
    runner = await first.start()
    subscription = await intake.start(bus, runner)
    try:
        await admit_and_decide(first)
        saga = await wait_for_state(first, S.OPERANDS_PAUSE_REQUIRED)
    finally:
        await subscription.stop()
        await first.stop()  # the crash: nothing of the first process survives but the bus
    commands = subjects.commands_filter(prefix=bus.prefix)
    issued = [envelope.id for envelope, _ in await messages(bus, commands)]
    assert issued, "the pause commands were published before the crash"

    second = Stack(bus, policy())
    rebuilt = await second.start()
    try:
        assert await rebuilt.resume() == 1
        assert second.outbox is not None
        await second.outbox.idle()
        again = pending(saga, second.policy)
        assert {command.id for command in again.commands} <= set(issued)
        assert all(isinstance(c.payload, Command) for c in again.commands)
        assert [envelope.id for envelope, _ in await messages(bus, commands)] == issued
        relabelled = [a for _, a in second.kube.done if isinstance(a, actions.SetStateLabel)]
        assert [a.value for a in relabelled] == [S.OPERANDS_PAUSE_REQUIRED]
        assert second.deadlines is not None
        assert NODE in second.deadlines.pending()
    finally:
        await second.stop()


async def test_a_deadline_fires_as_an_event_once(stack: Stack) -> None:
    await admit_and_decide(stack)
    saga = await stack.saga(NODE)
    assert saga.deadline is not None and stack.deadlines is not None
    stack.deadlines.schedule(saga)  # a second schedule of the same deadline keeps one timer
    subject = events(stack.bus.prefix, DeadlineExpired.DOMAIN, NODE, DeadlineExpired.NAME)
    assert await messages(stack.bus, subject) == []

    stack.clock.advance((saga.deadline - T0).total_seconds())
    async with asyncio.timeout(5):
        while not (fired := await messages(stack.bus, subject)):
            await asyncio.sleep(0.005)
    [(envelope, expired)] = fired
    assert isinstance(expired, DeadlineExpired)
    assert (expired.state, expired.step) == (S.CORDON_REQUIRED, saga.step.token)
    assert envelope.id == deadline_event_id(expired)


async def test_a_deadline_timer_is_replaced_only_when_the_pending_step_changes(
    stack: Stack,
) -> None:
    """The timer is keyed by the step its deadline guards, the expiry made when it fires."""
    await admit_and_decide(stack)
    saga = await stack.saga(NODE)
    timers = stack.deadlines
    assert saga.deadline is not None and timers is not None
    expired = deadline_event(saga)
    assert expired is not None
    assert timers.pending() == {NODE: deadline_event_id(expired)}
    later = saga.model_copy(update={"deadline": saga.deadline + timedelta(seconds=60)})
    timers.schedule(later)  # the same step: the armed timer stays, its deadline with it
    assert timers.pending() == {NODE: deadline_event_id(expired)}
    retried = saga.model_copy(update={"attempt": saga.attempt + 1})
    timers.schedule(retried)
    renewed = deadline_event(retried)
    assert renewed is not None and renewed.attempt == saga.attempt + 1
    assert timers.pending() == {NODE: deadline_event_id(renewed)}
    timers.schedule(retried.model_copy(update={"deadline": None}))  # a step without one
    assert timers.pending() == {}


async def test_a_successor_holds_an_overdue_deadline_until_held_results_are_due(
    stack: Stack,
) -> None:
    await admit_and_decide(stack)
    saga = await stack.saga(NODE)
    assert saga.deadline is not None and stack.deadlines is not None
    subject = events(stack.bus.prefix, DeadlineExpired.DOMAIN, NODE, DeadlineExpired.NAME)
    stack.deadlines.cancel(NODE)
    # the deadline passed while no replica led; the successor takes over 5 s after it
    stack.clock.advance((saga.deadline - T0).total_seconds() + 5)
    stack.deadlines.hold_until(stack.clock.now() + timedelta(seconds=3))
    stack.deadlines.schedule(saga)

    stack.clock.advance(2.9)
    await asyncio.sleep(0.05)
    assert await messages(stack.bus, subject) == []  # a result redelivered now comes first
    stack.clock.advance(0.1)
    async with asyncio.timeout(5):
        while not await messages(stack.bus, subject):
            await asyncio.sleep(0.005)


async def test_a_state_change_stored_but_never_published_is_published_by_the_successor(
    bus: InMemoryBus,
) -> None:
    first = Stack(bus, policy())
    await first.start()
    assert first.store is not None
    try:
        # the first leader stored its decision to admit the node and died before acting
        saga = saga_for(first.policy)
        await first.store.create(saga)
        admitted = decide(saga, Admitted(canary=False), first.policy, T0)
        stored = await first.store.get(NODE)
        assert stored is not None
        await first.store.replace(admitted.saga, stored.revision)
    finally:
        await first.stop()
    upgrade_events = events(bus.prefix, "upgrade", NODE)

    async def state_changes() -> list[NodeUpgradeStateChanged]:
        found = [p for _, p in await messages(bus, upgrade_events)]
        return [p for p in found if isinstance(p, NodeUpgradeStateChanged)]

    assert await state_changes() == []

    second = Stack(bus, policy())
    rebuilt = await second.start()
    try:
        await rebuilt.resume()
        published = await state_changes()
        assert [(c.from_state, c.to_state) for c in published] == [
            (S.UPGRADE_REQUIRED, S.CORDON_REQUIRED)
        ]
        tried: list[str] = []
        publish = bus.publish

        async def recorded(envelope: Envelope, *, republish: bool = False) -> PublishAck:
            tried.append(envelope.type)
            return await publish(envelope, republish=republish)

        bus.publish = recorded  # type: ignore[method-assign]
        # a third leader, maybe long after (past the server's duplicate window): the log has
        # the state change, so it is not sent again
        await rebuilt.resume()
        assert len(await state_changes()) == 1
        assert not [sent for sent in tried if "state-changed" in sent], tried
    finally:
        await second.stop()


async def admitted_with_publishes_failing(stack: Stack) -> tuple[NodeAdmitted, Envelope]:
    """Admit the node, then decide the admission while the bus refuses the first state change
    (a PublishTimeout after the saga was stored): the handler raises, the decision is in KV,
    and neither its state change nor its stage command is in the log."""
    assert stack.runner is not None
    admitted, envelope = await admission_recorded(stack)
    publish = stack.bus.publish
    refused: list[str] = []

    async def failing_once(sent: Envelope, *, republish: bool = False) -> PublishAck:
        if sent.type == NodeUpgradeStateChanged.TYPE and not refused:
            refused.append(sent.id)
            raise PublishTimeout(f"publish of {sent.id} not confirmed")
        return await publish(sent, republish=republish)

    stack.bus.publish = failing_once  # type: ignore[method-assign]
    with pytest.raises(PublishTimeout):
        await stack.runner.apply(NODE, admitted, envelope.time)
    assert (await stack.saga(NODE)).state is S.CORDON_REQUIRED  # stored before the publish
    assert await published_steps(stack) == ([], [])
    return admitted, envelope


async def published_steps(stack: Stack) -> tuple[list[tuple[S | None, S]], list[str]]:
    """The node's state changes in the log, and the types of the commands for it."""
    changes = [
        (p.from_state, p.to_state)
        for _, p in await messages(stack.bus, events(stack.bus.prefix, "upgrade", NODE))
        if isinstance(p, NodeUpgradeStateChanged)
    ]
    commands = subjects.commands_filter(prefix=stack.bus.prefix)
    return changes, [e.type for e, _ in await messages(stack.bus, commands) if e.subject == NODE]


async def test_a_decision_stored_but_not_published_goes_out_when_its_event_is_handled_again(
    stack: Stack,
) -> None:
    assert stack.runner is not None
    admitted, envelope = await admitted_with_publishes_failing(stack)
    # the dispatcher calls the handler again in place while the bus fails: the stored saga has
    # moved on, so the admission decides nothing new, but the decision it made goes out now
    assert await stack.runner.apply(NODE, admitted, envelope.time) is None
    assert await published_steps(stack) == (
        [(S.UPGRADE_REQUIRED, S.CORDON_REQUIRED)],
        [dm.StageDriver.TYPE],
    )
    # once: the next event of the node does not carry it out again
    assert await stack.runner.apply(NODE, admitted, envelope.time) is None
    assert len((await published_steps(stack))[0]) == 1


async def test_a_decision_stored_but_not_published_goes_out_on_the_next_reconcile(
    stack: Stack,
) -> None:
    assert stack.runner is not None
    await admitted_with_publishes_failing(stack)
    await stack.runner.settle()  # no event of the node comes: the controller's pass settles it
    assert await published_steps(stack) == (
        [(S.UPGRADE_REQUIRED, S.CORDON_REQUIRED)],
        [dm.StageDriver.TYPE],
    )


async def test_a_decision_whose_outputs_cannot_be_sent_at_all_fails_only_its_own_event(
    stack: Stack,
) -> None:
    assert stack.runner is not None
    admitted, envelope = await admission_recorded(stack)
    publish = stack.bus.publish

    async def too_large(sent: Envelope, *, republish: bool = False) -> PublishAck:
        if sent.type == NodeUpgradeStateChanged.TYPE:
            raise MessageTooLarge(f"{sent.id}: over the payload limit")
        return await publish(sent, republish=republish)

    stack.bus.publish = too_large  # type: ignore[method-assign]
    with pytest.raises(MessageTooLarge):
        await stack.runner.apply(NODE, admitted, envelope.time)
    stack.bus.publish = publish  # type: ignore[method-assign]
    # not the bus's weather: it is not tried again before every later event of the node
    await stack.runner.settle()
    assert await published_steps(stack) == ([], [])


async def test_a_decision_cut_off_with_its_term_goes_out_when_its_event_is_redelivered(
    bus: InMemoryBus,
) -> None:
    first = Stack(bus, policy())
    await first.start()
    try:
        admitted, envelope = await admitted_with_publishes_failing(first)
    finally:
        await first.stop()  # the term ended: what it had not carried out is forgotten
    second = Stack(bus, policy())
    runner = await second.start()
    try:
        # the event comes back (never acked), before the successor's resume has run
        assert await runner.apply(NODE, admitted, envelope.time, redelivered=True) is None
        assert await published_steps(second) == (
            [(S.UPGRADE_REQUIRED, S.CORDON_REQUIRED)],
            [dm.StageDriver.TYPE],
        )
    finally:
        await second.stop()


async def test_a_saga_stored_without_its_start_recorded_gets_it_from_the_successor(
    bus: InMemoryBus,
) -> None:
    first = Stack(bus, policy())
    await first.start()
    assert first.store is not None
    saga = saga_for(first.policy)
    try:
        await first.store.create(saga)  # and died before publishing SagaStarted
    finally:
        await first.stop()
    subject = events(bus.prefix, "upgrade", NODE, SagaStarted.NAME)
    assert await messages(bus, subject) == []

    second = Stack(bus, policy())
    rebuilt = await second.start()
    try:
        await rebuilt.resume()
        await rebuilt.resume()  # a third leader finds it recorded
        [(envelope, started)] = await messages(bus, subject)
    finally:
        await second.stop()
    assert isinstance(started, SagaStarted)
    # what a replay of the log builds from it is the saga that was stored
    assert folding.started_saga(envelope.node, started, second.policy, envelope.time) == saga


async def test_a_decisions_state_changes_go_out_before_its_commands(stack: Stack) -> None:
    published: list[str] = []
    publish = stack.bus.publish

    async def recorded(envelope: Envelope, *, republish: bool = False) -> PublishAck:
        published.append(envelope.type)
        return await publish(envelope, republish=republish)

    stack.bus.publish = recorded  # type: ignore[method-assign]
    assert stack.runner is not None
    subscription = await intake.start(stack.bus, stack.runner)
    try:
        await admit_and_decide(stack)
        await wait_for_state(stack, S.OPERANDS_PAUSE_REQUIRED)
    finally:
        await subscription.stop()
    pause = published.index(dev.PauseOperands.TYPE)
    entered = [i for i, t in enumerate(published) if t == NodeUpgradeStateChanged.TYPE]
    # a successor can only see the pause answered once the state change is in the log
    assert entered and max(i for i in entered if i < pause) == pause - 1


async def test_a_takeover_racing_a_decision_leaves_the_node_labelled_as_its_saga(
    bus: InMemoryBus,
) -> None:
    """The successor consumes before it resumes: the dead leader's uncordon outcome can be
    decided while the resume re-issues the uncordon it read, and the label written last must
    be the saga's final state, not the step the resume read (the chaos test caught this)."""
    spec = policy()
    run = Run(spec, saga_for(spec))
    run.admit()
    run.until(UpgradeState.UNCORDON_REQUIRED)
    stack = Stack(bus, spec)
    runner = await stack.start()
    assert stack.store is not None and stack.outbox is not None
    try:
        await stack.store.create(run.saga)
        outcome = kube.NodeUncordoned(action_id=run.step_id)  # the dead leader's uncordon
        read_all = stack.store.all

        async def read_all_then_yield() -> list[StoredSaga]:
            found = await read_all()
            for _ in range(20):  # a real KV listing lets the intake decide meanwhile
                await asyncio.sleep(0)
            return found

        stack.store.all = read_all_then_yield  # type: ignore[method-assign]
        await asyncio.gather(runner.resume(), runner.apply(NODE, outcome, T0))
        await stack.outbox.idle()
        final = await stack.saga(NODE)
    finally:
        await stack.stop()
    written = [
        action.label if isinstance(action, actions.Uncordon) else action.value
        for _, action in stack.kube.done
        if isinstance(action, actions.Uncordon | actions.SetStateLabel)
    ]
    assert final.state is UpgradeState.UPGRADE_DONE
    assert written[-1] is UpgradeState.UPGRADE_DONE, written


async def test_an_admission_never_decided_is_published_again_instead_of_holding_a_slot(
    stack: Stack,
) -> None:
    assert stack.runner is not None and stack.store is not None
    await stack.store.create(saga_for(stack.policy))
    first = await stack.runner.admit({NODE: NodeStatus()}, T0)
    assert first is not None and first.nodes == (NODE,)
    # the intake never sees it (lost with a stream leader, in the cluster test): the saga
    # stays in upgrade-required, and holds its slot while the admission may still come
    again = await stack.runner.admit({NODE: NodeStatus()}, T0)
    assert again is not None and again.nodes == () and again.in_progress == 1
    stack.clock.advance(running.ANNOUNCED_FOR + 1)
    late = await stack.runner.admit({NODE: NodeStatus()}, T0)
    assert late is not None and late.nodes == (NODE,)
    admitted = await messages(stack.bus, events(stack.bus.prefix, "upgrade", NODE, "admitted"))
    assert len(admitted) == 1  # the same id again: the copy the log holds is kept once
    [(envelope, payload)] = admitted
    await stack.runner.apply(NODE, payload, envelope.time)
    assert (await stack.saga(NODE)).state is S.CORDON_REQUIRED
