"""A recorded rollout: the orchestrator's runtime on an InMemoryBus with agents that answer
every command at once, exported as `gpuop events export` lines (for the replay tests).

The sagas are started the way the controller starts them (saga in KV, then `SagaStarted`,
after the policy was recorded); the runner decides every event through the intake consumer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from gpuop.bus import ConsumerSpec, Delivery, InMemoryBus
from gpuop.cli.events import export_lines
from gpuop.events import ids, new_event, subjects
from gpuop.events.driver import Component, Flavour
from gpuop.events.upgrade import SagaStarted, UpgradeState
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import NodeSaga, NodeStatus
from gpuop.services.upgrade_orchestrator import intake
from gpuop.services.upgrade_orchestrator.publishing import SOURCE
from tests.support.orchestrator import Stack, answers
from tests.support.sagas import BOOT_A, GPU_OLD, OFED_OLD, T0, saga_for

NODES = ("gpu-node-1", "gpu-node-2", "gpu-node-3")


async def record_rollout(
    spec: GPUClusterPolicySpec,
    nodes: tuple[str, ...] = NODES,
    *,
    switch_to: GPUClusterPolicySpec | None = None,
    statuses: Mapping[str, NodeStatus] | None = None,
    between_passes: Callable[[list[NodeSaga], Stack], None] | None = None,
    pools: Mapping[str, str] | None = None,
    flavour: Flavour | None = None,
) -> list[str]:
    """Roll `spec` across `nodes` until every one is done or left out by admission (the
    policy in force becomes `switch_to` once the first node is done; `statuses`: what
    admission sees of some nodes, such as their skip labels; `between_passes` sees the sagas
    before each admission pass and may move the clock; `pools`: the driver pool of some
    nodes; `flavour`: the GPU driver's kernel modules the sagas install, as the controller
    resolves them); the export of the whole log."""
    bus = InMemoryBus()
    await bus.start()
    stack = Stack(bus, spec)
    runner = await stack.start()
    assert stack.store is not None and stack.outbox is not None

    async def agent(delivery: Delivery) -> None:
        for event in answers(delivery.payload, delivery.envelope.id):
            await bus.publish(
                new_event(event, node=delivery.envelope.node, source="/gpuop/agent",
                          causationid=delivery.envelope.id, now=stack.clock.now())
            )  # fmt: skip

    agents = await bus.consume(
        ConsumerSpec(durable="agents", subjects=(subjects.stream_filter(subjects.Kind.COMMAND),)),
        agent,
    )
    consumer = await intake.start(bus, runner)
    try:
        await runner.record_policy(spec)
        running: dict[Component, str | None] = {Component.GPU: GPU_OLD, Component.OFED: OFED_OLD}
        for node in nodes:
            saga = saga_for(spec, node=node, pool=(pools or {}).get(node), flavour=flavour)
            await stack.store.create(saga)
            started = SagaStarted(
                rollout_id=saga.rollout_id, saga_id=saga.saga_id, running_versions=running,
                boot_id=BOOT_A, operands=saga.operands, pool=saga.pool, flavour=flavour,
            )  # fmt: skip
            await bus.publish(
                new_event(started, node=node, source=SOURCE, now=T0,
                          id=ids.step(saga.saga_id, "started", 1))
            )  # fmt: skip
        async with asyncio.timeout(10):
            while True:
                sagas = [await stack.saga(node) for node in nodes]
                if switch_to is not None and sagas[0].state is UpgradeState.UPGRADE_DONE:
                    stack.policy = switch_to
                if between_passes is not None:
                    between_passes(sagas, stack)
                seen = {node: (statuses or {}).get(node, NodeStatus()) for node in nodes}
                planned = await runner.admit(seen, stack.clock.now())
                assert planned is not None
                if all(
                    s.state is UpgradeState.UPGRADE_DONE or s.node in planned.skipped for s in sagas
                ):
                    break
                await asyncio.sleep(0.01)
        await stack.outbox.idle()
        return await export_lines(bus)
    finally:
        await consumer.stop()
        await agents.stop()
        await stack.stop()
        await bus.close()
