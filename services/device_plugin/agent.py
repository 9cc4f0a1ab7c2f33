"""The device plugin on the bus: its node's health history and operand commands in, the
pause and resume confirmations out.

`run` (the service's entry point, `gpuop run device-plugin --role node`) builds the NVML
backend and `plugins.DevicePlugins` from the settings and the `--config` file, and a
`NodeAgent` that drives them:

    start               the pause state (`gpuop.operands`) and the health history
                        (`restoring`) from the log;
                        when NATS does not answer, read once it does
    device.health-changed   `DevicePlugins.device_health`
    driver.validated    `DevicePlugins.driver_validated`: health back, devices read anew
    PauseOperands       `DevicePlugins.pause`, then `OperandPaused`
    ResumeOperands      `DevicePlugins.resume`, then `OperandResumed`

The kubelet side never waits for the bus. If NATS stops answering while the agent starts,
the plugin serves from a clean state and subscribes once NATS answers again; when NATS goes
away later, the consumers wait and the plugin keeps advertising the last known health. A
confirmation that cannot be published makes the command come again (pausing twice is
harmless).
"""

from __future__ import annotations

import asyncio
import logging

from gpuop import operands
from gpuop.bus import Bus, BusError, ConsumerSpec, Delivery, Subscription, TemporaryError, spans
from gpuop.bus.protocol import Handler
from gpuop.events import Envelope, Event, device, driver, new_event, subjects
from gpuop.host.roots import HostRoot
from gpuop.nvml import open_backend
from gpuop.runtime import waiting
from gpuop.runtime.services import ServiceContext
from gpuop.services.device_plugin import consumers, restoring
from gpuop.services.device_plugin.config import DevicePluginConfig
from gpuop.services.device_plugin.metrics import PluginMetrics
from gpuop.services.device_plugin.plugins import DevicePlugins

log = logging.getLogger(__name__)

NVML_HOLDER = consumers.SERVICE
"""Who the plugin's NVML session holds the simulated `nvidia` module as."""
RETRY_DELAY = 2.0
"""Seconds before a failed handler or subscription is tried again."""


class NodeAgent:
    """Feeds one node's device plugins from the bus and confirms their pauses."""

    def __init__(
        self, bus: Bus, node: str, plugins: DevicePlugins, *, retry_delay: float = RETRY_DELAY
    ) -> None:
        self._bus = bus
        self._node = subjects.validate_node_name(node)
        self._plugins = plugins
        self._retry_delay = retry_delay
        self._source = f"/gpuop/{consumers.SERVICE}/{node}"

    async def run(self, stopping: asyncio.Event) -> None:
        """Restore, then serve the kubelet and follow the bus until `stopping` is set."""
        restored = await self.restore()
        subscriptions: list[Subscription] = []
        prefix, retry = self._bus.prefix, self._retry_delay
        wanted: list[tuple[ConsumerSpec, Handler]] = [
            (consumers.node_commands(prefix, self._node, retry_delay=retry), self.on_command),
            (consumers.node_health(prefix, self._node, retry_delay=retry), self.on_health),
        ]
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._plugins.run(stopping), name="device-plugins")
                group.create_task(
                    self._follow(wanted, subscriptions, stopping, restored=restored),
                    name="device-plugin-follow",
                )
        finally:
            for subscription in subscriptions:
                await subscription.stop()

    async def restore(self) -> bool:
        """Take in the pause state and health history the log holds; whether it could."""
        try:
            paused = await operands.from_log(self._bus, self._node)
            history = await restoring.health(self._bus, self._node)
        except BusError as error:
            log.warning("cannot read the node's history yet: %s", error)
            return False
        await self._plugins.restore(paused, history)
        if paused:
            log.info("the node's operands are paused (%s)", ", ".join(sorted(paused)))
        return True

    async def on_command(self, delivery: Delivery) -> None:
        """`PauseOperands` and `ResumeOperands` for this node's operands, each in its
        `handle <verb>` span (the confirmation is its child)."""
        with spans.handling(__name__, delivery):
            await self._on_command(delivery)

    async def _on_command(self, delivery: Delivery) -> None:
        await operands.handle(self, delivery)

    service = device.OperandService.DEVICE_PLUGIN

    async def pause(self, command: device.PauseOperands) -> None:
        log.info("pausing %s: %s", ", ".join(command.components), command.reason or "")
        await self._plugins.pause(command.components)

    async def resume(self, command: device.ResumeOperands) -> None:
        log.info("resuming: %s", command.reason or "")
        await self._plugins.resume()

    async def confirm(self, confirmation: Event, cause: Envelope) -> None:
        await self._publish(confirmation, cause)

    async def on_health(self, delivery: Delivery) -> None:
        """Telemetry's health events and the driver-manager's validations of this node."""
        payload = delivery.payload
        if isinstance(payload, device.DeviceHealthChanged):
            await self._plugins.device_health(payload)
        elif isinstance(payload, driver.DriverValidated):
            await self._plugins.driver_validated(payload.component)

    async def _publish(self, payload: Event, cause: Envelope) -> None:
        envelope = new_event(payload, node=self._node, source=self._source, cause=cause)
        try:
            await self._bus.publish(envelope)
        except BusError as error:
            raise TemporaryError(
                f"cannot confirm {cause.type}: {error}", delay=self._retry_delay
            ) from error

    async def _follow(
        self,
        wanted: list[tuple[ConsumerSpec, Handler]],
        subscriptions: list[Subscription],
        stopping: asyncio.Event,
        *,
        restored: bool,
    ) -> None:
        """Start every consumer, then read the history the start could not; retrying
        while the bus does not answer."""
        for spec, handler in wanted:
            while not stopping.is_set():
                try:
                    subscriptions.append(await self._bus.consume(spec, handler))
                    break
                except BusError as error:
                    log.warning("cannot subscribe %s yet, retrying: %s", spec.durable, error)
                    await waiting.stopped_within(stopping, self._retry_delay)
        while not restored and not stopping.is_set():
            restored = await self.restore()
            if not restored:
                await waiting.stopped_within(stopping, self._retry_delay)


async def run(context: ServiceContext, config: DevicePluginConfig) -> None:
    """The node role's entry point: the device plugins of `--node`, until the service stops."""
    settings = context.settings
    node, host_root = settings.require_node(), settings.require_host_root()
    nvml = open_backend(settings.nvml, host_root=host_root, node=node, holder_id=NVML_HOLDER)
    plugins = DevicePlugins(
        HostRoot(host_root),
        nvml,
        config,
        PluginMetrics(context.registry),
        readiness=context.set_readiness,
    )
    await NodeAgent(context.bus, node, plugins).run(context.stopping)
