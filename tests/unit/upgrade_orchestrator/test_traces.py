"""The orchestrator's traces: one per saga attempt under ids derived from the saga, commands
parented on their step, a new leader continuing the same trace, nothing when tracing is off."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import timedelta

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gpuop.bus import ConsumerSpec, Delivery, InMemoryBus, Subscription, spans
from gpuop.events import Envelope, new_event, subjects
from gpuop.events import device as dev
from gpuop.events.deadlines import DeadlineExpired
from gpuop.events.upgrade import NodeAdmitted, UpgradeState
from gpuop.saga import NodeSaga, NodeStatus
from gpuop.services.upgrade_orchestrator import intake, traces
from tests.support.orchestrator import Stack, answers, events, messages
from tests.support.sagas import NODE, T0, policy, saga_for
from tests.support.spans import ancestry, named, one_tree, recorded_spans, untraced

S = UpgradeState
STEPS = [
    "step stage-gpu", "step cordon", "step pod-deletion", "step operands-pause", "step install-gpu",
    "step unload-gpu", "step load-gpu", "step validate-gpu", "step validate-cuda-gpu",
    "step validate-resume", "step validate-pod", "step uncordon", "step done",
]  # fmt: skip
"""The steps of a GPU driver upgrade, in the order they end (wait-for-jobs and the drain
have nothing to do under the default policy)."""


async def fake_agents(bus: InMemoryBus) -> Subscription:
    """Every node agent at once: each command answered inside its `handle <verb>` span."""

    async def handle(delivery: Delivery) -> None:
        with spans.handling(__name__, delivery):
            for event in answers(delivery.payload, delivery.envelope.id):
                await bus.publish(
                    new_event(event, node=delivery.envelope.node, source="/test/agents",
                              causationid=delivery.envelope.id)
                )  # fmt: skip

    every_command = subjects.stream_filter(subjects.Kind.COMMAND, prefix=bus.prefix)
    return await bus.consume(ConsumerSpec(durable="agents", subjects=(every_command,)), handle)


async def wait_for_state(stack: Stack, state: UpgradeState) -> NodeSaga:
    async with asyncio.timeout(10):
        while (saga := await stack.saga(NODE)).state is not state:
            await asyncio.sleep(0.005)
    return saga


async def wait_for_spans(
    exporter: InMemorySpanExporter, done: Callable[[tuple[ReadableSpan, ...]], bool]
) -> tuple[ReadableSpan, ...]:
    async with asyncio.timeout(10):
        while not done(found := exporter.get_finished_spans()):
            await asyncio.sleep(0.005)
    return found


def resumed(found: tuple[ReadableSpan, ...]) -> bool:
    return bool(named(found, "handle resume"))


async def test_one_node_upgrade_is_one_trace_rooted_at_the_saga(bus: InMemoryBus) -> None:
    with recorded_spans("upgrade-orchestrator") as exporter:
        stack = Stack(bus, policy())
        runner = await stack.start()
        consumer = await intake.start(bus, runner)
        agents = await fake_agents(bus)
        try:
            assert stack.store is not None and stack.outbox is not None
            saga = saga_for(stack.policy)
            await stack.store.create(saga)
            await runner.admit({NODE: NodeStatus()}, T0)
            await wait_for_state(stack, S.UPGRADE_DONE)
            await stack.outbox.idle()
            found = await wait_for_spans(exporter, resumed)
        finally:
            await agents.stop()
            await consumer.stop()
            await stack.stop()

    root = one_tree(found)
    assert root.name == traces.ROOT
    assert root.context.trace_id == traces.trace_id(saga.saga_id, 1)
    assert root.context.span_id == traces.step_span_id(saga.saga_id, 1, "admission")
    steps = [s for s in found if s.name.startswith("step ")]  # in the order they ended
    assert [s.name for s in steps] == STEPS
    assert all(s.parent is not None and s.parent.span_id == root.context.span_id for s in steps)
    [unload] = named(found, "handle unload")
    assert ancestry(unload, found) == ["handle unload", "step unload-gpu", traces.ROOT]
    [unloaded] = named(found, "decide driver.unloaded")
    assert ancestry(unloaded, found)[:2] == ["decide driver.unloaded", "handle unload"]
    [cordoned] = named(found, "decide kube.cordoned")
    assert ancestry(cordoned, found) == [
        "decide kube.cordoned", "kube cordon", "step cordon", traces.ROOT
    ]  # fmt: skip


async def test_commands_carry_their_step_span_as_parent(bus: InMemoryBus) -> None:
    with recorded_spans():
        stack = Stack(bus, policy(source=None))  # no agents: nothing answers a stage
        runner = await stack.start()
        consumer = await intake.start(bus, runner)
        try:
            assert stack.store is not None
            saga = saga_for(stack.policy)
            await stack.store.create(saga)
            await runner.admit({NODE: NodeStatus()}, T0)
            await wait_for_state(stack, S.OPERANDS_PAUSE_REQUIRED)
        finally:
            await consumer.stop()
            await stack.stop()
    operands = subjects.commands_filter(dev.OPERANDS, NODE, prefix=bus.prefix)
    [(pause, _)] = await messages(bus, operands)
    [(admitted, _)] = await messages(bus, events(bus.prefix, "upgrade", NODE, NodeAdmitted.NAME))

    trace = f"{traces.trace_id(saga.saga_id, 1):032x}"
    step = f"{traces.step_span_id(saga.saga_id, 1, 'operands-pause'):016x}"
    root = f"{traces.step_span_id(saga.saga_id, 1, 'admission'):016x}"
    assert pause.traceparent == f"00-{trace}-{step}-01"
    assert admitted.traceparent == f"00-{trace}-{root}-01"


async def test_a_new_leader_continues_the_same_trace(bus: InMemoryBus) -> None:
    with recorded_spans("upgrade-orchestrator") as exporter:
        first = Stack(bus, policy(source=None))  # no agents: nothing answers a stage
        runner = await first.start()
        consumer = await intake.start(bus, runner)
        try:
            assert first.store is not None and first.outbox is not None
            saga = saga_for(first.policy)
            await first.store.create(saga)
            await runner.admit({NODE: NodeStatus()}, T0)
            await wait_for_state(first, S.OPERANDS_PAUSE_REQUIRED)  # no agents: it waits
            await first.outbox.idle()
        finally:
            await consumer.stop()
            await first.stop()  # the leader is gone; the bus and KV remain
        before_takeover = len(exporter.get_finished_spans())

        second = Stack(bus, policy(source=None))
        runner = await second.start()
        consumer = await intake.start(bus, runner)
        agents = await fake_agents(bus)
        try:
            assert await runner.resume() == 1
            await wait_for_state(second, S.UPGRADE_DONE)
            assert second.outbox is not None
            await second.outbox.idle()
            found = await wait_for_spans(exporter, resumed)
        finally:
            await agents.stop()
            await consumer.stop()
            await second.stop()

    root = one_tree(found)
    assert root.context.trace_id == traces.trace_id(saga.saga_id, 1)
    [pause_step] = named(found, "step operands-pause")
    assert found.index(pause_step) >= before_takeover, "the new leader recorded the step"
    [pause] = named(found, "handle pause")
    assert found.index(pause) >= before_takeover
    assert ancestry(pause, found) == ["handle pause", "step operands-pause", traces.ROOT]
    assert found.index(root) < before_takeover, "the first leader recorded the root"


async def test_a_deadline_is_published_under_its_step(bus: InMemoryBus) -> None:
    stack = Stack(bus, policy())
    await stack.start()
    saga = saga_for(stack.policy).model_copy(
        update={"state": S.CORDON_REQUIRED, "deadline": T0 - timedelta(seconds=1)}
    )
    try:
        with recorded_spans():
            assert stack.deadlines is not None
            stack.deadlines.schedule(saga)
            subject = events(bus.prefix, DeadlineExpired.DOMAIN, NODE, DeadlineExpired.NAME)
            async with asyncio.timeout(5):
                while not (fired := await messages(bus, subject)):
                    await asyncio.sleep(0.005)
            expected = traces.step_traceparent(saga.saga_id, 1, saga.step.token)
    finally:
        await stack.stop()
    [(envelope, _)] = fired
    assert expected is not None
    assert envelope.traceparent == expected


async def test_with_tracing_off_nothing_carries_a_trace_and_the_upgrade_goes_on(
    bus: InMemoryBus,
) -> None:
    with untraced():  # as OTEL_SDK_DISABLED=true leaves the process
        stack = Stack(bus, policy())
        runner = await stack.start()
        consumer = await intake.start(bus, runner)
        agents = await fake_agents(bus)
        try:
            assert stack.store is not None
            await stack.store.create(saga_for(stack.policy))
            await runner.admit({NODE: NodeStatus()}, T0)
            await wait_for_state(stack, S.UPGRADE_DONE)
        finally:
            await agents.stop()
            await consumer.stop()
            await stack.stop()
        assert traces.step_traceparent("saga", 1, "drain") is None
    every = [envelope async for envelope in _envelopes(bus)]
    assert every and all(envelope.traceparent is None for envelope in every)


async def _envelopes(bus: InMemoryBus) -> AsyncIterator[Envelope]:
    for kind in (subjects.Kind.COMMAND, subjects.Kind.EVENT):
        for envelope, _ in await messages(bus, subjects.stream_filter(kind, prefix=bus.prefix)):
            yield envelope
