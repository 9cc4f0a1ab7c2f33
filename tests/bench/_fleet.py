"""The soak benchmark's emulated nodes: what the node agents of most of the cluster would put
on the bus, from one process (`tests/bench/soak.py` starts it; it is no benchmark itself).

Run as `python -m tests.bench._fleet CONFIG.json` from the repository root; the file is a
`FleetConfig`. For every emulated node it does what discovery's node role, the
driver-manager and the operands do there, at once and always successfully:

- publishes the node's inventory (`hardware.discovered`, also put in KV `gpuop_nodes`) at
  start, after each driver unload and load, and on `RescanHardware`; the inventory is one
  real scan of a simulated host root, with the node's own GPU UUIDs, boot id and driver;
- publishes a `hardware.heartbeat` every `heartbeat_seconds`, the nodes spread over it;
- answers every driver-manager command with its success (`DriverStaged`, `DriverUnloaded`,
  `DriverInstalled`, `DriverLoaded`, `DriverValidated`, `DriverRolledBack`) and every
  `PauseOperands`/`ResumeOperands` with each operand's confirmation.

Device health events (`device.health-changed`, as telemetry publishes for XIDs and ECC
errors) go out for every node of the cluster, the real sample nodes too (whose device
plugins consume them): `health_events_per_second` GPUs turn unhealthy, alternately by XID
and by ECC error, and each recovers `recover_after` events later.

Commands to the sample nodes, where real agents run, are left to them. Prints `ready` once
every inventory is published; stops on SIGTERM.
"""

from __future__ import annotations

import asyncio
import random
import signal
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel

from gpuop.bus import Buckets, Bus, ConsumerSpec, Delivery, KeyValue, NatsBus
from gpuop.events import Event, device, driver, hardware, new_event, subjects
from gpuop.inventory import scanning
from gpuop_sim.cluster.hosts import build_host_root
from gpuop_sim.nvml.sim_gpus import gpu_uuid
from gpuop_sim.nvml.simulated import SimNvml

ROOT = Path(__file__).resolve().parents[2]

SOURCE = "/gpuop/soak-fleet"
DURABLE = "soak-fleet"
CRITICAL_XID = 79
"""GPU has fallen off the bus: an XID the device plugin does not ignore."""


class FleetNode(BaseModel):
    """One emulated node, as the simulated cluster has it."""

    name: str
    boot_id: str
    product_name: str


class FleetConfig(BaseModel):
    """What `soak.py` writes for the fleet."""

    nats_url: str
    work: Path
    """A directory the fleet may write (its template host root)."""
    gpus: int
    driver_version: str
    """The driver every emulated node runs at start."""
    emulated: list[FleetNode]
    sample_nodes: list[str]
    """Nodes with real agents: health events only."""
    heartbeat_seconds: float
    health_events_per_second: float
    recover_after: int


@dataclass
class NodeState:
    """What one emulated node runs, and the inventory it last published."""

    node: FleetNode
    template: hardware.HardwareDiscovered
    driver_version: str | None
    inventory: hardware.HardwareDiscovered = field(init=False)

    def __post_init__(self) -> None:
        self.inventory = self.take_inventory()

    def take_inventory(self) -> hardware.HardwareDiscovered:
        """The template inventory as this node's: its GPUs, boot id and driver."""
        gpus = tuple(
            gpu.model_copy(update={"uuid": gpu_uuid(self.node.name, gpu.index)})
            for gpu in self.template.gpus
        )
        modules = self.template.modules_loaded
        if self.driver_version is None:
            modules = tuple(name for name in modules if not name.startswith("nvidia"))
        return scanning.hashed(
            self.template.model_copy(
                update={
                    "gpus": gpus,
                    "boot_id": self.node.boot_id,
                    "product_name": self.node.product_name,
                    "driver_version": self.driver_version,
                    "cuda_driver_version": (
                        self.template.cuda_driver_version if self.driver_version else None
                    ),
                    "modules_loaded": modules,
                }
            )
        )


class Fleet:
    """Every emulated node's agents on one bus connection."""

    def __init__(self, config: FleetConfig, bus: Bus, template: hardware.HardwareDiscovered):
        self._config = config
        self._bus = bus
        self._nodes = {
            node.name: NodeState(node, template, config.driver_version) for node in config.emulated
        }
        self._inventories: KeyValue | None = None
        self._random = random.Random(7)

    async def start(self) -> None:
        self._inventories = await self._bus.kv(Buckets.NODES)
        for state in self._nodes.values():
            await self._publish_inventory(state)

    async def run(self, stopping: asyncio.Event) -> None:
        commands = await self._bus.consume(
            ConsumerSpec(
                durable=DURABLE,
                subjects=(subjects.stream_filter(subjects.Kind.COMMAND, prefix=self._bus.prefix),),
                max_deliver=20,
            ),
            self.on_command,
        )
        try:
            async with asyncio.TaskGroup() as group:
                beats = group.create_task(self._heartbeats())
                health = group.create_task(self._health_events())
                await stopping.wait()
                beats.cancel()
                health.cancel()
        finally:
            await commands.stop()

    async def on_command(self, delivery: Delivery) -> None:
        state = self._nodes.get(delivery.envelope.node)
        if state is None:
            return  # a sample node: its real agents answer
        payload, cause = delivery.payload, delivery.envelope
        for event in self.answers(state, payload, cause.id):
            await self._publish(event, state.node.name, cause_id=cause.id)
        if isinstance(payload, driver.UnloadDriver | driver.LoadDriver | driver.RollbackDriver):
            # as discovery rescans after the driver-manager's result
            state.inventory = state.take_inventory()
            await self._publish_inventory(state)
        elif isinstance(payload, hardware.RescanHardware):
            await self._publish_inventory(state)

    def answers(self, state: NodeState, payload: object, command_id: str) -> list[Event]:
        """What healthy agents report once `payload` is done; moves the node's driver."""
        if isinstance(payload, device.PauseOperands | device.ResumeOperands):
            confirm = (
                device.OperandPaused
                if isinstance(payload, device.PauseOperands)
                else device.OperandResumed
            )
            return [confirm(command_id=command_id, service=s) for s in device.OperandService]
        if not isinstance(payload, driver.UnloadDriver | driver.StageDriver | driver.InstallDriver
                          | driver.LoadDriver | driver.ValidateDriver
                          | driver.RollbackDriver):  # fmt: skip
            return []
        was, component = state.driver_version, payload.component
        if isinstance(payload, driver.StageDriver):
            moved_to = was
            result: Event = driver.DriverStaged(
                command_id=command_id, component=component, version=payload.version
            )
        elif isinstance(payload, driver.UnloadDriver):
            moved_to = None
            result = driver.DriverUnloaded(command_id=command_id, component=component, version=was)
        elif isinstance(payload, driver.InstallDriver):
            moved_to = was
            result = driver.DriverInstalled(
                command_id=command_id, component=component, version=payload.version
            )
        elif isinstance(payload, driver.LoadDriver):
            moved_to = payload.version
            result = driver.DriverLoaded(
                command_id=command_id, component=component, version=payload.version
            )
        elif isinstance(payload, driver.ValidateDriver):
            moved_to = was
            result = driver.DriverValidated(
                command_id=command_id, component=component, version=payload.version,
                devices=len(state.inventory.gpus),
            )  # fmt: skip
        else:
            moved_to = payload.version
            result = driver.DriverRolledBack(
                command_id=command_id,
                component=component,
                version=payload.version,
                from_version=was,
            )
        if component is driver.Component.GPU:
            state.driver_version = moved_to
        return [result]

    async def _publish_inventory(self, state: NodeState) -> None:
        assert self._inventories is not None
        inventory = state.inventory
        await self._publish(inventory, state.node.name)
        key = subjects.encode_node(state.node.name)
        await self._inventories.put(key, inventory.model_dump_json().encode())

    async def _publish(self, payload: Event, node: str, *, cause_id: str | None = None) -> None:
        await self._bus.publish(new_event(payload, node=node, source=SOURCE, causationid=cause_id))

    async def _heartbeats(self) -> None:
        states = list(self._nodes.values())
        pause = self._config.heartbeat_seconds / max(len(states), 1)
        started = asyncio.get_running_loop().time()
        while True:
            for state in states:
                beat = hardware.HardwareHeartbeat(
                    boot_id=state.node.boot_id,
                    inventory_hash=state.inventory.inventory_hash,
                    uptime_seconds=asyncio.get_running_loop().time() - started,
                    gpu_count=len(state.inventory.gpus),
                )
                await self._publish(beat, state.node.name)
                await asyncio.sleep(pause)

    async def _health_events(self) -> None:
        nodes = [*self._nodes, *self._config.sample_nodes]
        unhealthy: deque[tuple[str, str]] = deque()
        reasons = (device.HealthReason.XID, device.HealthReason.ECC)
        count = 0
        while True:
            await asyncio.sleep(1.0 / self._config.health_events_per_second)
            node = self._random.choice(nodes)
            uuid = gpu_uuid(node, self._random.randrange(self._config.gpus))
            if (node, uuid) in unhealthy:
                continue
            reason = reasons[count % len(reasons)]
            count += 1
            await self._publish(
                device.DeviceHealthChanged(
                    gpu_uuid=uuid, healthy=False, reason=reason,
                    xid=CRITICAL_XID if reason is device.HealthReason.XID else None,
                    ecc_volatile_uncorrected=1 if reason is device.HealthReason.ECC else None,
                    message="soak benchmark",
                ),
                node,
            )  # fmt: skip
            unhealthy.append((node, uuid))
            if len(unhealthy) > self._config.recover_after:
                node, uuid = unhealthy.popleft()
                recovered = device.DeviceHealthChanged(
                    gpu_uuid=uuid, healthy=True, reason=device.HealthReason.RECOVERED
                )
                await self._publish(recovered, node)


def template_inventory(config: FleetConfig) -> hardware.HardwareDiscovered:
    """One real scan of a simulated host root, the base of every emulated node's inventory."""
    name = "soak-fleet-template"
    root = build_host_root(config.work / name, name, config.gpus, gpu_version=config.driver_version)
    nvml = SimNvml(config.gpus, node=name, driver_version=config.driver_version)
    return scanning.scan(root, nvml)


async def main(config: FleetConfig) -> None:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    bus = NatsBus(config.nats_url, name="soak-fleet")
    await bus.start()
    try:
        fleet = Fleet(config, bus, template_inventory(config))
        await fleet.start()
        print("ready", flush=True)
        await fleet.run(stopping)
    finally:
        await bus.close()


if __name__ == "__main__":
    asyncio.run(main(FleetConfig.model_validate_json(Path(sys.argv[1]).read_text())))
