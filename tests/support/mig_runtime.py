"""The orchestrator's runtime with the MIG reconfiguration kind, on an InMemoryBus: the
intake consumer feeding the runner, node agents answering every command at once (the
GPUs' holders, the apply, or its failure), and the label's requests put on the bus as
discovery's cluster role publishes them. `Reconfiguring` drives it: `relabel` sets a
node's `nvidia.com/mig.config`, `settle` runs admission passes until the sagas rest.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from gpuop.bus import Buckets, ConsumerSpec, Delivery, InMemoryBus
from gpuop.events import Event, new_event, subjects
from gpuop.events import driver as dm
from gpuop.events import mig_commands as migev
from gpuop.events import remediation_commands as remedies
from gpuop.events.fields import NamespacedName
from gpuop.events.mig_requests import MigConfigRequested
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import NodeStatus
from gpuop.saga.mig.records import MigSaga
from gpuop.saga.mig.states import TERMINAL_STATES
from gpuop.services.upgrade_orchestrator import intake
from gpuop.services.upgrade_orchestrator.migs import MIG_RECONFIGURATION, Starter
from gpuop.services.upgrade_orchestrator.store import SagaStore
from tests.support.mig_sagas import POD_A, inventory
from tests.support.orchestrator import Stack, answers


@dataclass
class MigAgents:
    """How the fake node agents answer the reconfiguration's commands."""

    holders: tuple[NamespacedName, ...] = (POD_A,)
    fails: migev.MigFailureReason | None = None
    """The apply's failure (the node restores, `restored`), or None: it succeeds."""
    restored: bool = True
    applied: list[migev.ApplyMigLayout] = field(default_factory=list)
    boot_after_reboot: str = "7f0e6b1c-3a52-4b8e-9a1d-0c5c2f3e4d5b"
    """The boot id discovery reports once the node rebooted (`RebootNode`)."""

    def answer(self, payload: object, command_id: str) -> list[Event]:
        if isinstance(payload, dm.RebootNode):
            return [inventory().model_copy(update={"boot_id": self.boot_after_reboot})]
        if isinstance(payload, remedies.ListGpuHolders):
            listed = remedies.GpuHoldersListed(
                command_id=command_id, gpu_uuids=payload.gpu_uuids, pods=self.holders
            )
            return [listed]
        if isinstance(payload, migev.ApplyMigLayout):
            self.applied.append(payload)
            if self.fails is not None and len(self.applied) == 1:
                return [migev.MigLayoutFailed(
                    command_id=command_id, config=payload.config, reason=self.fails,
                    restored=self.restored, message="nvmlDeviceCreateGpuInstance failed",
                )]  # fmt: skip
            devices = sum(d.count for layout in payload.layouts for d in layout.devices)
            changed = tuple(layout.gpu_index for layout in payload.layouts if layout.mig_enabled)
            return [migev.MigLayoutApplied(
                command_id=command_id, config=payload.config, changed_gpus=changed,
                mig_devices=devices,
            )]  # fmt: skip
        return answers(payload, command_id)


@dataclass
class Reconfiguring:
    """A running orchestrator with the MIG kind, and its node agents."""

    bus: InMemoryBus
    stack: Stack
    store: SagaStore[MigSaga]
    agents: MigAgents
    nodes: tuple[str, ...]

    async def relabel(self, node: str, config: str | None) -> None:
        """The node's `nvidia.com/mig.config` is now `config`, as discovery tells it."""
        request = MigConfigRequested(config=config)
        await self.bus.publish(
            new_event(request, node=node, source="/gpuop/discovery-labeler",
                      now=self.stack.clock.now())
        )  # fmt: skip

    async def publish(self, event: Event, node: str) -> None:
        """`event` about `node`, as the orchestrator's own observers publish it."""
        await self.bus.publish(
            new_event(event, node=node, source="/gpuop/upgrade-orchestrator",
                      now=self.stack.clock.now())
        )  # fmt: skip

    async def saga(self, node: str) -> MigSaga | None:
        stored = await self.store.get(node)
        return None if stored is None else stored.saga

    async def started(self, node: str) -> MigSaga:
        async with asyncio.timeout(5):
            while (saga := await self.saga(node)) is None:
                await asyncio.sleep(0.005)
        return saga

    async def settle(self, *, until_ended: tuple[str, ...] = (), quiet: float = 0.15) -> None:
        """Admission passes until the nodes `until_ended` name have ended, then until
        nothing changes for `quiet` seconds."""
        runner = self.stack.runner
        assert runner is not None and self.stack.outbox is not None
        loop = asyncio.get_running_loop()
        calm_from: float | None = None
        async with asyncio.timeout(10):
            while calm_from is None or loop.time() - calm_from < quiet:
                statuses = {n: NodeStatus() for n in self.nodes}
                await runner.admit(statuses, self.stack.clock.now())
                sagas = [await self.saga(node) for node in until_ended]
                ended = all(s is not None and s.state in TERMINAL_STATES for s in sagas)
                if ended and calm_from is None:
                    calm_from = loop.time()
                await asyncio.sleep(0.01)
            await self.stack.outbox.idle()


@asynccontextmanager
async def reconfiguring(
    spec: GPUClusterPolicySpec,
    nodes: tuple[str, ...] = ("gpu-node-1",),
    *,
    agents: MigAgents | None = None,
    kube: Any = None,
) -> AsyncIterator[Reconfiguring]:
    """The runtime with the MIG kind, each node's inventory (four H200s, MIG off) in KV;
    `kube` answers the read of a policy's ConfigMap (namespace `gpuop`)."""
    agents = agents or MigAgents()
    bus = InMemoryBus()
    await bus.start()
    stack = Stack(bus, spec)
    runner = await stack.start()
    inventories = await bus.kv(Buckets.NODES)
    for node in nodes:
        await inventories.put(subjects.encode_node(node), inventory().model_dump_json().encode())
    store = await SagaStore.open(bus, MIG_RECONFIGURATION)
    starter = Starter(runner, store, inventories, kube=kube, namespace="gpuop", clock=stack.clock)
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
        yield Reconfiguring(bus, stack, store, agents, nodes)
    finally:
        await subscription.stop()
        await consumer.stop()
        await stack.stop()
        await bus.close()


def actions_of(stack: Stack, kind: type[Any]) -> list[Any]:
    """The Kubernetes actions of `kind` the fake API server was asked for, in order."""
    return [action for _, action in stack.kube.done if isinstance(action, kind)]


class ConfigMaps:
    """Enough of `gpuop.kube.client.Kube` to read ConfigMaps: `data` by (namespace, name),
    or the error every read raises."""

    def __init__(self, maps: dict[tuple[str, str], dict[str, str]], error: Exception | None = None):
        self.maps = maps
        self.error = error
        self.reads: list[tuple[str, str]] = []
        self.core = self

    def read_namespaced_config_map(self, name: str, namespace: str) -> None:
        raise AssertionError("called through Kube.call")

    async def call(self, method: Any, name: str, namespace: str) -> dict[str, Any]:
        assert method == self.read_namespaced_config_map
        self.reads.append((namespace, name))
        if self.error is not None:
            raise self.error
        return {"data": self.maps[(namespace, name)]}
