"""Discovery's node role: takes the node's inventory and tells the cluster when it changed.

`run` (the service's node entry point) builds a `NodeAgent` from the settings. The agent
scans the host root and NVML (`gpuop.inventory.scanning`) at start and every
`scan_interval_seconds` (and at once when a CDI spec or a container runtime's configuration
changes: `watching`), and publishes `hardware.discovered` only when the inventory's
content hash differs from the one it last published for this node. That inventory is kept in
the `gpuop_nodes` KV bucket under the node's key, so a restarted agent does not republish an
unchanged inventory. Every `heartbeat_interval_seconds` it publishes `hardware.heartbeat`;
a boot id that differs from the last inventory's means the node rebooted, and it scans at
once.

It also scans when asked (`RescanHardware`, which publishes even an unchanged inventory)
and after the driver-manager changed the node's loaded driver or its GPUs' MIG layout
(`driver.*` results; the inventory carries each GPU's MIG devices, which the MIG labels
follow). On
`PauseOperands` for the GPU driver it stops touching NVML, reading the host root only, and
confirms with `OperandPaused`; `ResumeOperands` undoes it, confirmed by `OperandResumed`.
A restarted agent learns whether it is paused from the node's last pause or resume command
in the command stream. The service is ready once the first scan succeeded.
"""

from __future__ import annotations

import asyncio
import logging

from pydantic import ValidationError

from gpuop import operands
from gpuop.bus import Buckets, Bus, BusError, Delivery, TemporaryError, spans
from gpuop.events import (
    Envelope,
    Event,
    device,
    driver,
    hardware,
    mig_commands,
    subjects,
)
from gpuop.events.driver import Component
from gpuop.host import system
from gpuop.host.errors import HostError
from gpuop.host.roots import HostRoot
from gpuop.inventory import scanning
from gpuop.nvml import Nvml, NvmlError, open_backend
from gpuop.runtime import waiting
from gpuop.runtime.node_agents import NodeAgentBase
from gpuop.runtime.services import Readiness, ServiceContext
from gpuop.services.discovery import consumers, watching
from gpuop.services.discovery.config import DiscoveryConfig

log = logging.getLogger(__name__)

NVML_HOLDER = "discovery"
"""Who discovery's NVML session holds the simulated `nvidia` module as."""
RESCAN_AFTER: tuple[type[Event], ...] = (
    driver.DriverLoaded,
    driver.DriverUnloaded,
    driver.DriverRolledBack,
    driver.DriverLoadFailed,
    driver.DriverUnloadFailed,
    driver.DriverRollbackFailed,
    mig_commands.MigLayoutApplied,
    mig_commands.MigLayoutFailed,
)
"""Driver-manager results after which the loaded driver (or part of it) or the MIG devices
may have changed."""

ScanErrors = (HostError, NvmlError)


class NodeAgent(NodeAgentBase):
    """Discovery on one node: scans, publishes on change, beats, obeys pause and rescan."""

    def __init__(
        self,
        bus: Bus,
        node: str,
        root: HostRoot,
        nvml: Nvml,
        config: DiscoveryConfig,
        *,
        readiness: Readiness | None = None,
    ) -> None:
        super().__init__(bus, consumers.SERVICE, node, readiness)
        self._root = root
        self._nvml = nvml
        self._config = config
        self._key = subjects.encode_node(node)
        self._lock = asyncio.Lock()
        """Held by every scan and by pause: a pause waits for a scan to let go of NVML."""
        self._wake = asyncio.Event()
        self._published: hardware.HardwareDiscovered | None = None
        self._paused = False
        self._scanned = False

    @property
    def published(self) -> hardware.HardwareDiscovered | None:
        """The inventory last published for this node (by this run or, restored, an earlier one)."""
        return self._published

    @property
    def paused(self) -> bool:
        """Whether NVML is off limits because the GPU driver is about to be reloaded."""
        return self._paused

    async def run(self, stopping: asyncio.Event) -> None:
        """Restore, subscribe, then scan and beat until `stopping` is set."""
        await self.restore()
        async with (
            self._consuming(
                (consumers.node_commands, self.on_command),
                (consumers.node_rescans, self.on_command),
                (consumers.node_driver_results, self.on_driver_event),
                retry_delay=self._config.retry_interval_seconds,
            ),
            asyncio.TaskGroup() as group,
        ):
            group.create_task(self._scan_loop(stopping), name="discovery-scan")
            group.create_task(self._heartbeat_loop(stopping), name="discovery-heartbeat")
            group.create_task(
                watching.ConfigWatch(self._root).run(self._wake, stopping),
                name="discovery-config-watch",
            )

    async def restore(self) -> None:
        """Pick up where an earlier run left off: the inventory it published last, and
        whether the node's operands are paused."""
        entry = await (await self._bus.kv(Buckets.NODES)).get(self._key)
        if entry is not None:
            try:
                self._published = hardware.HardwareDiscovered.model_validate_json(entry.value)
            except ValidationError as error:
                log.warning("ignoring the stored inventory of %s: %s", self._node, error)
        paused = Component.GPU in await operands.from_log(self._bus, self._node)
        self._paused = paused
        if paused:
            log.info("operands of %s are paused: reading the host root only", self._node)

    async def scan(
        self, *, force: bool = False, cause: Envelope | None = None
    ) -> hardware.HardwareDiscovered:
        """Take the inventory and publish it if it changed (or `force`); returns it.

        Raises `HostError` or `NvmlError` when the scan fails, `BusError` when publishing does.
        """
        async with self._lock:
            inventory = await asyncio.to_thread(self._take_inventory)
            if not self._scanned:
                self._scanned = True
                self._readiness(True, "")
            published = self._published
            if force or published is None or published.inventory_hash != inventory.inventory_hash:
                await self._publish_inventory(inventory, cause)
            return inventory

    async def heartbeat(self) -> hardware.HardwareHeartbeat | None:
        """Publish a heartbeat for the last inventory; None before there is one."""
        published = self._published
        if published is None:
            return None
        boot_id = system.boot_id(self._root) or scanning.UNKNOWN_BOOT_ID
        if boot_id != published.boot_id:
            log.info("boot id of %s changed: the node rebooted, scanning now", self._node)
            self._wake.set()
        payload = hardware.HardwareHeartbeat(
            boot_id=boot_id,
            inventory_hash=published.inventory_hash,
            uptime_seconds=system.uptime_seconds(self._root) or 0.0,
            gpu_count=len(published.gpus),
        )
        await self._publish(payload)
        return payload

    async def on_command(self, delivery: Delivery) -> None:
        """`RescanHardware`, `PauseOperands` and `ResumeOperands` for this node, each in its
        `handle <verb>` span (the confirmation is its child)."""
        with spans.handling(__name__, delivery):
            await self._on_command(delivery)

    async def _on_command(self, delivery: Delivery) -> None:
        payload, envelope = delivery.payload, delivery.envelope
        if isinstance(payload, hardware.RescanHardware):
            log.info("rescan asked for: %s", payload.reason or "no reason given")
            await self._scan_for(envelope, force=True)
        else:
            was_paused = self._paused
            resumed = await operands.handle(self, delivery) and not self._paused
            if was_paused and resumed:
                # the driver may have changed meanwhile; the confirmation must not wait for it
                try:
                    await self.scan(cause=envelope)
                except (*ScanErrors, BusError) as error:
                    log.warning("scan after resume failed, the next scan retries: %s", error)
                    self._wake.set()

    service = device.OperandService.DISCOVERY

    async def pause(self, command: device.PauseOperands) -> None:
        async with self._lock:  # a scan in progress finishes and closes NVML first
            self._paused = operands.gpu_paused_after(self._paused, command)

    async def resume(self, command: device.ResumeOperands) -> None:
        async with self._lock:
            self._paused = operands.gpu_paused_after(self._paused, command)

    async def confirm(self, confirmation: Event, cause: Envelope) -> None:
        await self._publish(confirmation, cause=cause)

    async def on_driver_event(self, delivery: Delivery) -> None:
        """Scan after a driver result that may have changed what is loaded."""
        if isinstance(delivery.payload, RESCAN_AFTER):
            await self._scan_for(delivery.envelope, force=False)

    async def _scan_for(self, cause: Envelope, *, force: bool) -> None:
        try:
            await self.scan(force=force, cause=cause)
        except (*ScanErrors, BusError) as error:
            raise TemporaryError(
                f"scan failed: {error}", delay=self._config.retry_interval_seconds
            ) from error

    def _take_inventory(self) -> hardware.HardwareDiscovered:
        if self._paused:
            host_only = scanning.scan(self._root, None)
            return scanning.with_known_gpus(host_only, self._published)
        return scanning.scan(self._root, self._nvml)

    async def _publish_inventory(
        self, inventory: hardware.HardwareDiscovered, cause: Envelope | None
    ) -> None:
        await self._publish(inventory, cause=cause)
        # one writer per key, this node's agent: a plain put is enough
        kv = await self._bus.kv(Buckets.NODES)
        await kv.put(self._key, inventory.model_dump_json().encode())
        self._published = inventory
        log.info(
            "published the inventory of %s: %d GPUs, driver %s, hash %s",
            self._node,
            len(inventory.gpus),
            inventory.driver_version or "not loaded",
            inventory.inventory_hash[:12],
        )

    async def _scan_loop(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            try:
                await self.scan()
                interval = self._config.scan_interval_seconds
            except ScanErrors as error:
                log.warning("scan of %s failed: %s", self._node, error)
                if not self._scanned:
                    self._readiness(False, f"the first scan failed: {error}")
                interval = self._config.retry_interval_seconds
            except BusError as error:
                log.warning("could not publish the inventory, retrying: %s", error)
                interval = self._config.retry_interval_seconds
            await waiting.idle(interval, wake=self._wake, stopping=stopping)

    async def _heartbeat_loop(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            try:
                await self.heartbeat()
            except (HostError, BusError) as error:
                log.warning("heartbeat of %s failed: %s", self._node, error)
            await waiting.stopped_within(stopping, self._config.heartbeat_interval_seconds)


async def run(context: ServiceContext, config: DiscoveryConfig) -> None:
    """The node role's entry point: one `NodeAgent` for `--node`, until the service stops."""
    settings = context.settings
    node, host_root = settings.require_node(), settings.require_host_root()
    nvml = open_backend(settings.nvml, host_root=host_root, node=node, holder_id=NVML_HOLDER)
    agent = NodeAgent(
        context.bus, node, HostRoot(host_root), nvml, config, readiness=context.set_readiness
    )
    await agent.run(context.stopping)
