"""One simulated GPU node for the device plugin: a host root with its simulated kernel and
NVML, the simulated kubelet on real unix sockets, and the plugin fed from a bus, all in
this process, so a test acts as telemetry, the driver-manager and the orchestrator would."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from prometheus_client import CollectorRegistry

from gpuop.bus import Bus, InMemoryBus
from gpuop.events import (
    Command,
    Envelope,
    Event,
    decode,
    device,
    driver,
    ids,
    new_command,
    new_event,
)
from gpuop.host.roots import HostRoot
from gpuop.kubelet import constants
from gpuop.kubelet.deviceplugin.v1beta1 import api_pb2
from gpuop.nvml import Nvml
from gpuop.services.device_plugin.agent import NVML_HOLDER, NodeAgent
from gpuop.services.device_plugin.config import DevicePluginConfig, PluginConfigs
from gpuop.services.device_plugin.metrics import PluginMetrics
from gpuop.services.device_plugin.mpscontrol import MpsControl, MpsSupervisor
from gpuop.services.device_plugin.plugins import DevicePlugins, Reload
from gpuop_sim.cluster import hosts
from gpuop_sim.cluster.kubelet_grpc import KubeletGrpc
from gpuop_sim.host.simkernel import SimKernel
from gpuop_sim.nvml.modules import HostRootModules
from gpuop_sim.nvml.simulated import SimNvml

NODE = "gpu-1.example.com"
E = TypeVar("E", bound=Event)
GPU = "nvidia.com/gpu"


def healthy(count: int) -> Callable[[tuple[api_pb2.Device, ...]], bool]:
    """A device list of `count` devices, all Healthy."""
    return lambda devices: (
        len(devices) == count and all(d.health == constants.HEALTHY for d in devices)
    )


def unhealthy(*ids: str) -> Callable[[tuple[api_pb2.Device, ...]], bool]:
    """A device list where exactly `ids` are Unhealthy."""
    return lambda devices: (
        bool(devices) and {d.ID for d in devices if d.health == constants.UNHEALTHY} == set(ids)
    )


@dataclass
class Node:
    """The simulated node and what runs on it."""

    root: HostRoot
    kernel: SimKernel
    kubelet: KubeletGrpc
    bus: Bus
    plugins: DevicePlugins
    readiness: list[tuple[bool, str]] = field(default_factory=list)

    async def publish(self, payload: Event) -> Envelope:
        """Publish an event about this node, as telemetry or the driver-manager would."""
        envelope = new_event(payload, node=NODE, source="/test")
        await self.bus.publish(envelope)
        return envelope

    async def command(self, payload: Command, step: str) -> Envelope:
        """Send a command to this node's operands, as the orchestrator would."""
        envelope = new_command(payload, node=NODE, source="/test", id=ids.step("saga-1", step, 1))
        await self.bus.publish(envelope)
        return envelope

    async def xid(self, gpu_uuid: str, xid: int) -> Envelope:
        return await self.publish(
            device.DeviceHealthChanged(
                gpu_uuid=gpu_uuid, healthy=False, reason=device.HealthReason.XID, xid=xid
            )
        )

    async def validated(self) -> Envelope:
        return await self.publish(
            driver.DriverValidated(
                command_id="validate-1",
                component=driver.Component.GPU,
                version="580.159.04",
                devices=8,
            )
        )

    async def wait_readiness(self, ready: bool, reason: str = "") -> None:
        """Wait until readiness was last reported as `ready`, for a reason containing
        `reason`."""
        async with asyncio.timeout(10):
            while not self.readiness or not (
                self.readiness[-1][0] is ready and reason in self.readiness[-1][1]
            ):
                await asyncio.sleep(0.02)

    async def confirmations(self, kind: type[E], count: int = 1) -> list[E]:
        """Wait for `count` events of `kind` on the bus; all of them."""
        async with asyncio.timeout(10):
            while True:
                found = [
                    payload
                    async for stored in self.bus.read(f"{self.bus.prefix}.evt.>")
                    if isinstance(payload := decode(stored.data)[1], kind)
                ]
                if len(found) >= count:
                    return found
                await asyncio.sleep(0.02)


def build_host(path: Path, gpus: int) -> HostRoot:
    return hosts.build_host_root(path, NODE, gpus)


def sim_mps(root: HostRoot) -> MpsSupervisor:
    """The node's MPS daemons as `--nvml sim:<gpus>` runs them: the host root's stand-in
    `nvidia-cuda-mps-control`, run without chroot; checked and restarted quickly."""
    return MpsSupervisor(
        MpsControl(root, chroot=False), check_interval=0.1, backoff_initial=0.1, backoff_max=0.4
    )


def sim_nvml(root: HostRoot, gpus: int) -> SimNvml:
    """The node's NVML, as `--nvml sim:<gpus>` makes it: its driver the simulated kernel's."""
    return SimNvml(gpus, node=NODE, module_state=HostRootModules(root.path), holder_id=NVML_HOLDER)


@asynccontextmanager
async def running_node(
    root: HostRoot,
    *,
    gpus: int = 8,
    config: DevicePluginConfig | PluginConfigs | None = None,
    reload: Reload | None = None,
    bus: Bus | None = None,
    nvml: Nvml | None = None,
    start_kubelet: bool = True,
    registry: CollectorRegistry | None = None,
    mps: MpsSupervisor | None = None,
) -> AsyncIterator[Node]:
    """The plugin and the kubelet running on `root`; stopped and cleaned on the way out."""
    own_bus = bus is None
    if bus is None:
        bus = InMemoryBus()
        await bus.start()
    kubelet = KubeletGrpc.under(root.path)
    readiness: list[tuple[bool, str]] = []
    plugins = DevicePlugins(
        root,
        nvml or sim_nvml(root, gpus),
        config or DevicePluginConfig(),
        PluginMetrics(registry or CollectorRegistry()),
        reload=reload,
        readiness=lambda ready, reason: readiness.append((ready, reason)),
        retry_interval=0.2,
        register_timeout=1.0,
        register_retry=0.2,
        mps=mps or sim_mps(root),
    )
    node = Node(root, SimKernel(root), kubelet, bus, plugins, readiness)
    stopping = asyncio.Event()
    if start_kubelet:
        await kubelet.start()
    # the kubelet's root from the config, as the service's entry point takes it
    configs = config if isinstance(config, PluginConfigs) else PluginConfigs.single(plugins.config)
    agent = NodeAgent(bus, NODE, plugins, kubelet_dir=configs.kubelet_root_dir, retry_delay=0.2)
    task = asyncio.create_task(agent.run(stopping))
    try:
        yield node
    finally:
        stopping.set()
        await asyncio.wait_for(task, 10)
        await kubelet.stop()
        if own_bus:
            await bus.close()
