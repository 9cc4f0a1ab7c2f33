"""A node never waits on nothing: a deadline's expiry the bus refuses is tried again until it
is stored, and a saga under way that no deadline bounds is reported by the orchestrator (a
Warning Event on the node and the policy's `Stalled` condition) and its deadline armed again."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from gpuop.bus import InMemoryBus
from gpuop.bus.errors import BusUnavailable
from gpuop.events import Envelope
from gpuop.events.deadlines import DeadlineExpired
from gpuop.events.upgrade import UpgradeState
from gpuop.kube.recording import EventType
from gpuop.policy import ConditionType
from gpuop.saga import NodeSaga
from gpuop.services.upgrade_orchestrator import deadlines as deadlines_
from gpuop.services.upgrade_orchestrator.deadlines import DeadlineScheduler
from gpuop.services.upgrade_orchestrator.stalls import REASON, REPORT_AFTER, StallWatch
from tests.support.clocks import ManualClock
from tests.support.orchestrator import events, messages
from tests.support.sagas import T0, Run, policy
from tests.support.waiting import eventually


class RefusingBus(InMemoryBus):
    """Refuses its first `refusals` publishes, as a cluster between leaders does."""

    def __init__(self, refusals: int) -> None:
        super().__init__()
        self.refusals = refusals

    async def publish(self, envelope: Envelope, *, republish: bool = False) -> Any:
        if self.refusals > 0:
            self.refusals -= 1
            raise BusUnavailable("no stream leader")
        return await super().publish(envelope, republish=republish)


class Recorder:
    """The orchestrator's `EventRecorder`, keeping what it would write."""

    def __init__(self) -> None:
        self.recorded: list[tuple[str, str, str, EventType]] = []

    async def node_event(
        self, node: str, reason: str, message: str, *, event_type: EventType, **_: Any
    ) -> dict[str, Any]:
        self.recorded.append((node, reason, message, event_type))
        return {}


def cordoning() -> NodeSaga:
    """A saga just admitted: it waits on its first step, which its deadline bounds."""
    run = Run(policy())
    run.admit()
    assert run.saga.state is UpgradeState.CORDON_REQUIRED and run.saga.deadline is not None
    return run.saga


async def expiries(bus: InMemoryBus) -> list[DeadlineExpired]:
    stored = await messages(bus, events(bus.prefix, "saga", name="deadline-expired"))
    return [payload for _, payload in stored if isinstance(payload, DeadlineExpired)]


async def test_a_deadline_the_bus_refuses_is_published_once_it_takes_it() -> None:
    saga = cordoning()
    bus = RefusingBus(refusals=2)
    clock = ManualClock(T0)
    scheduler = DeadlineScheduler(bus, clock=clock)
    scheduler.schedule(saga)
    try:
        assert saga.deadline is not None
        clock.advance((saga.deadline - clock.now()).total_seconds())
        await eventually(lambda: bus.refusals == 1 or None)
        assert scheduler.unbounded([saga]) == []  # still trying: its timer waits for it
        for _ in range(2):
            clock.advance(deadlines_.PUBLISH_RETRY_SECONDS)
            await asyncio.sleep(0.05)
        found = await eventually(lambda: expiries(bus))
        assert [(e.saga_id, e.step) for e in found] == [(saga.saga_id, saga.step.token)]
        assert scheduler.unbounded([saga]) == []  # stored: the saga waits on the log
    finally:
        await scheduler.close()


async def test_a_saga_no_deadline_bounds_is_reported_once_and_its_deadline_armed() -> None:
    saga = cordoning()
    bus = InMemoryBus()
    clock = ManualClock(T0)
    scheduler = DeadlineScheduler(bus, clock=clock)
    recorder = Recorder()
    watch = StallWatch(recorder, scheduler)  # type: ignore[arg-type]
    try:
        # no timer for it (never armed, or one that died): but just decided, not yet
        assert scheduler.unbounded([saga]) == [saga]
        started = saga.step_started
        assert await watch.check([saga], started + REPORT_AFTER / 2) is None
        assert recorder.recorded == []

        stalled = await watch.check([saga], started + REPORT_AFTER)
        assert stalled is not None and stalled.type == ConditionType.STALLED
        assert (stalled.status, stalled.reason) == ("True", "NodesWaitOnNothing")
        assert saga.node in stalled.message
        ((node, reason, message, kind),) = recorder.recorded
        assert (node, reason, kind) == (saga.node, REASON, EventType.WARNING)
        assert f"{saga.state}" in message and saga.step.token in message

        # armed again by the report: it waits on its deadline now, and is said to
        assert scheduler.unbounded([saga]) == []
        bounded = await watch.check([saga], started + REPORT_AFTER + timedelta(seconds=1))
        assert bounded is not None and (bounded.status, bounded.reason) == (
            "False",
            "EveryNodeBounded",
        )
        assert len(recorder.recorded) == 1
    finally:
        await scheduler.close()


async def test_a_saga_whose_step_has_no_deadline_is_reported_once() -> None:
    saga = cordoning().model_copy(update={"deadline": None})
    scheduler = DeadlineScheduler(InMemoryBus(), clock=ManualClock(T0))
    recorder = Recorder()
    watch = StallWatch(recorder, scheduler)  # type: ignore[arg-type]
    try:
        for seconds in (0, 5, 60):
            later = saga.step_started + REPORT_AFTER + timedelta(seconds=seconds)
            stalled = await watch.check([saga], later)
            assert stalled is not None and stalled.status == "True"
        assert len(recorder.recorded) == 1
    finally:
        await scheduler.close()


async def test_a_saga_whose_deadline_is_armed_is_not_reported() -> None:
    saga = cordoning()
    scheduler = DeadlineScheduler(InMemoryBus(), clock=ManualClock(T0))
    recorder = Recorder()
    watch = StallWatch(recorder, scheduler)  # type: ignore[arg-type]
    scheduler.schedule(saga)
    try:
        assert await watch.check([saga], saga.step_started + REPORT_AFTER * 3) is None
        assert recorder.recorded == []
    finally:
        await scheduler.close()
