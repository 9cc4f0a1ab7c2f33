"""The orchestrator's runtime with the MIG reconfiguration kind, on an InMemoryBus: the
intake consumer feeding the runner, node agents answering every command at once (the
GPUs' holders, the apply, or its failure), and the label's requests put on the bus as
discovery's cluster role publishes them. `Reconfiguring` drives it: `relabel` sets a
node's `nvidia.com/mig.config`, `settle` runs admission passes until the sagas rest.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from gpuop.bus import Buckets, InMemoryBus
from gpuop.events import Event, new_event, subjects
from gpuop.events import driver as dm
from gpuop.events import mig_commands as migev
from gpuop.events import remediation_commands as remedies
from gpuop.events.fields import NamespacedName
from gpuop.events.mig_requests import MigConfigRequested
from gpuop.policy import GPUClusterPolicySpec
from gpuop.services.upgrade_orchestrator.kinds import KindRunner
from gpuop.services.upgrade_orchestrator.migs import MIG_RECONFIGURATION, Starter
from gpuop.services.upgrade_orchestrator.running import Runner
from gpuop.services.upgrade_orchestrator.store import SagaStore
from tests.support.mig_sagas import POD_A, inventory
from tests.support.orchestrator import KindHarness, Stack, actions_of, answers, running_kind


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
class Reconfiguring(KindHarness):
    """A running orchestrator with the MIG kind, and its node agents."""

    agents: MigAgents = field(default_factory=MigAgents)

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

    async def reconfigurations(bus: InMemoryBus, stack: Stack, runner: Runner) -> KindRunner[Any]:
        inventories = await bus.kv(Buckets.NODES)
        for node in nodes:
            body = inventory().model_dump_json().encode()
            await inventories.put(subjects.encode_node(node), body)
        store = await SagaStore.open(bus, MIG_RECONFIGURATION)
        return Starter(
            runner, store, inventories, kube=kube, namespace="gpuop", clock=stack.clock
        ).runner()

    def answer(node: str, payload: object, command_id: str) -> list[Event]:
        return agents.answer(payload, command_id)

    async with running_kind(spec, reconfigurations, answer) as (bus, stack, store):
        yield Reconfiguring(bus, stack, store, nodes, agents)


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


__all__ = ["ConfigMaps", "MigAgents", "Reconfiguring", "actions_of", "reconfiguring"]
