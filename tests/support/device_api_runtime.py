"""The orchestrator's runtime with the device-API switch kind, on an InMemoryBus: the
intake consumer feeding the runner, a fake device plugin per node answering `SetDeviceApi`
(serving what it was asked, or refusing it as a kubelet that will not register the plugin),
the node watch's observations, and a device plugin reporting what it serves on its own.
`Switching` drives it: `observe` publishes a node's `NodeObserved`, `reports` the plugin's
own `DeviceApiApplied`, `settle` runs admission passes until the sagas rest.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from gpuop.bus import InMemoryBus
from gpuop.events import Event, kube, new_event
from gpuop.events.device_api_commands import DeviceApi, DeviceApiApplied, SetDeviceApi
from gpuop.policy import GPUClusterPolicySpec
from gpuop.services.upgrade_orchestrator.device_apis import DEVICE_API_SWITCH, Starter
from gpuop.services.upgrade_orchestrator.kinds import KindRunner
from gpuop.services.upgrade_orchestrator.running import Runner
from gpuop.services.upgrade_orchestrator.store import SagaStore
from tests.support.orchestrator import KindHarness, Stack, actions_of, answers, running_kind


@dataclass
class DevicePlugins:
    """How the fake device plugins answer `SetDeviceApi`: serving what they are asked,
    except an API in `refuse` (the kubelet does not register the plugin)."""

    refuse: frozenset[DeviceApi] = frozenset()
    asked: list[tuple[str, DeviceApi]] = field(default_factory=list)

    def answer(self, node: str, payload: object, command_id: str) -> list[Event]:
        if isinstance(payload, SetDeviceApi):
            self.asked.append((node, payload.api))
            if payload.api in self.refuse:
                message = "kubelet: plugin registration refused"
                return [DeviceApiApplied(
                    api=payload.api, serving=False, command_id=command_id, message=message
                )]  # fmt: skip
            return [DeviceApiApplied(api=payload.api, serving=True, command_id=command_id)]
        return answers(payload, command_id)


@dataclass
class Switching(KindHarness):
    """A running orchestrator with the device-API kind, and its device plugins."""

    plugins: DevicePlugins = field(default_factory=DevicePlugins)

    async def publish(self, event: Event, node: str, source: str) -> None:
        await self.bus.publish(new_event(event, node=node, source=source,
                                         now=self.stack.clock.now()))  # fmt: skip

    async def observe(self, node: str, unschedulable: bool = False) -> None:
        """The node watch saw `node` (a change, or its periodic resync)."""
        observed = kube.NodeObserved(ready=True, unschedulable=unschedulable)
        await self.publish(observed, node, "/gpuop/upgrade-orchestrator")

    async def reports(self, node: str, api: DeviceApi, serving: bool = True) -> None:
        """The node's device plugin says on its own what it serves (its start)."""
        await self.publish(DeviceApiApplied(api=api, serving=serving), node, "/gpuop/device-plugin")


@asynccontextmanager
async def switching(
    spec: GPUClusterPolicySpec,
    nodes: tuple[str, ...] = ("gpu-node-1",),
    *,
    plugins: DevicePlugins | None = None,
    labels: Mapping[str, Mapping[str, str]] | None = None,
) -> AsyncIterator[Switching]:
    """The runtime with the device-API kind; `labels` are the nodes' as the watch saw them."""
    plugins = plugins or DevicePlugins()
    known = dict(labels or {})

    async def switches(bus: InMemoryBus, stack: Stack, runner: Runner) -> KindRunner[Any]:
        store = await SagaStore.open(bus, DEVICE_API_SWITCH)
        labelled = Starter(runner, store, labels=lambda n: known.get(n, {}), clock=stack.clock)
        return labelled.runner()

    running = running_kind(spec, switches, plugins.answer, source="/gpuop/device-plugin")
    async with running as (bus, stack, store):
        yield Switching(bus, stack, store, nodes, plugins)


__all__ = ["DevicePlugins", "Switching", "actions_of", "switching"]
