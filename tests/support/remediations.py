"""The orchestrator's runtime with the remediation kind, on an InMemoryBus: the intake
consumer feeding the runner, node agents answering every command at once (the GPUs' holders,
the reset, or its failure and the reboot), and health events put on the bus as telemetry
publishes them. `Remediating` drives it: `fault` reports a GPU, `settle` runs admission
passes until the sagas rest, `export` is the log as `gpuop events export` writes it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from gpuop.bus import Buckets, ConsumerSpec, Delivery, InMemoryBus
from gpuop.cli.events import export_lines
from gpuop.events import Event, new_event, subjects
from gpuop.events import device as dev
from gpuop.events import driver as dm
from gpuop.events import remediation_commands as remedies
from gpuop.events.fields import NamespacedName
from gpuop.events.hardware import Gpu
from gpuop.events.remediation import TERMINAL_STATES
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import NodeStatus
from gpuop.saga.remediation.records import RemediationSaga
from gpuop.services.upgrade_orchestrator import intake
from gpuop.services.upgrade_orchestrator.executing import KubeActions
from gpuop.services.upgrade_orchestrator.remediations import REMEDIATION, Starter
from gpuop.services.upgrade_orchestrator.store import SagaStore
from tests.support.inventories import H200, inventory
from tests.support.orchestrator import Stack, answers
from tests.support.sagas import BOOT_A, BOOT_B

GPU = "GPU-20bce083-dbf9-2d4f-3c35-c858915accc5"
HOLDER = NamespacedName(namespace="team", name="trainer-0")


@dataclass
class Agents:
    """How the fake node agents answer the remediation's commands."""

    holders: tuple[NamespacedName, ...] = (HOLDER,)
    reset_fails: remedies.ResetFailureReason | None = None
    """The reset's failure, or None: it succeeds."""
    reboots: bool = True
    """A reboot brings the node back with a new boot id (discovery's inventory)."""

    def answer(self, payload: object, command_id: str) -> list[Event]:
        if isinstance(payload, remedies.ListGpuHolders):
            return [remedies.GpuHoldersListed(
                command_id=command_id, gpu_uuids=payload.gpu_uuids, pods=self.holders,
            )]  # fmt: skip
        if isinstance(payload, remedies.ResetGpu) and self.reset_fails is not None:
            return [remedies.GpuResetFailed(
                command_id=command_id, gpu_uuids=payload.gpu_uuids, reason=self.reset_fails,
            )]  # fmt: skip
        if isinstance(payload, dm.RebootNode):
            return [inventory(boot_id=BOOT_B)] if self.reboots else []
        return answers(payload, command_id)


@dataclass
class Remediating:
    """A running orchestrator with the remediation kind, and its node agents."""

    bus: InMemoryBus
    stack: Stack
    starter: Starter
    store: SagaStore[RemediationSaga]
    nodes: tuple[str, ...]
    statuses: dict[str, NodeStatus] = field(default_factory=dict)

    async def fault(
        self, node: str, *, gpu: str = GPU, xid: int = 79, action: dev.XidAction | None = None
    ) -> None:
        """Telemetry reports `gpu` of `node` unhealthy with `xid`."""
        health = dev.DeviceHealthChanged(
            gpu_uuid=gpu, healthy=False, reason=dev.HealthReason.XID, xid=xid,
            action=action if action is not None else dev.XidAction.RESET_GPU,
        )  # fmt: skip
        await self.publish(health, node, source="/gpuop/telemetry")

    async def publish(self, event: Event, node: str, *, source: str) -> None:
        await self.bus.publish(
            new_event(event, node=node, source=source, now=self.stack.clock.now())
        )

    async def started(self, node: str) -> RemediationSaga:
        """The node's remediation, once the intake has started it."""
        async with asyncio.timeout(5):
            while (saga := await self.saga(node)) is None:
                await asyncio.sleep(0.005)
        return saga

    async def saga(self, node: str) -> RemediationSaga | None:
        stored = await self.store.get(node)
        return None if stored is None else stored.saga

    async def settle(self, *, until_ended: tuple[str, ...] = (), quiet: float = 0.15) -> None:
        """Admission passes until the nodes `until_ended` name have ended (and then until
        nothing changes for `quiet` seconds)."""
        runner = self.stack.runner
        assert runner is not None and self.stack.outbox is not None
        loop = asyncio.get_running_loop()
        calm_from: float | None = None
        async with asyncio.timeout(10):
            while calm_from is None or loop.time() - calm_from < quiet:
                statuses = {n: self.statuses.get(n, NodeStatus()) for n in self.nodes}
                await runner.admit(statuses, self.stack.clock.now())
                sagas = [await self.saga(node) for node in until_ended]
                ended = all(s is not None and s.state in TERMINAL_STATES for s in sagas)
                if ended and calm_from is None:
                    calm_from = loop.time()
                await asyncio.sleep(0.01)
            await self.stack.outbox.idle()

    async def export(self) -> list[str]:
        return await export_lines(self.bus)


@asynccontextmanager
async def remediating(
    spec: GPUClusterPolicySpec,
    nodes: tuple[str, ...] = ("gpu-node-1",),
    *,
    agents: Agents | None = None,
    statuses: Mapping[str, NodeStatus] | None = None,
    gpus: tuple[Gpu, ...] = (H200,),
    kube: KubeActions | None = None,
    bus: InMemoryBus | None = None,
) -> AsyncIterator[Remediating]:
    """The runtime with the remediation kind, each node's inventory in KV (`gpus`, boot id
    `BOOT_A`), agents answering as `agents` says, Kubernetes actions done by `kube` (a
    `FakeKube` by default). On `bus` (left open: a second runtime on it takes over, as a
    new leader after a crash), else on a bus of its own."""
    agents = agents or Agents()
    own_bus = bus is None
    if bus is None:
        bus = InMemoryBus()
        await bus.start()
    stack = Stack(bus, spec) if kube is None else Stack(bus, spec, kube=kube)
    runner = await stack.start()
    assert stack.store is not None
    inventories = await bus.kv(Buckets.NODES)
    for node in nodes:
        await inventories.put(
            subjects.encode_node(node),
            inventory(gpus, boot_id=BOOT_A).model_dump_json().encode(),
        )
    store = await SagaStore.open(bus, REMEDIATION)
    starter = Starter(runner, stack.store, store, inventories, clock=stack.clock)
    runner.kinds = (starter.runner(),)

    async def agent(delivery: Delivery) -> None:
        envelope = delivery.envelope
        for event in agents.answer(delivery.payload, envelope.id):
            await bus.publish(
                new_event(event, node=envelope.node, source="/gpuop/agent",
                          causationid=envelope.id, now=stack.clock.now())
            )  # fmt: skip

    consumer = await bus.consume(
        ConsumerSpec(durable="agents", subjects=(subjects.stream_filter(subjects.Kind.COMMAND),)),
        agent,
    )
    subscription = await intake.start(bus, runner)
    await runner.record_policy(spec)
    try:
        yield Remediating(bus, stack, starter, store, nodes, dict(statuses or {}))
    finally:
        await subscription.stop()
        await consumer.stop()
        await stack.stop()
        if own_bus:
            await bus.close()


def actions_of(stack: Stack, kind: type[Any]) -> list[Any]:
    """The Kubernetes actions of `kind` the fake API server was asked for, in order."""
    return [action for _, action in stack.kube.done if isinstance(action, kind)]
