"""The device plugin on the bus: its node's health history, config selections and operand
commands in, the pause and resume confirmations and the config in force out.

`run` (the service's entry point, `gpuop run device-plugin --role node`) builds the NVML
backend and `plugins.DevicePlugins` from the settings and the `--config` file, and a
`NodeAgent` that drives them:

    start               the pause state (`gpuop.operands`), the health history and the
                        last config selection (`restoring`) from the log, then
                        `device.plugin-config-applied` for the config in force;
                        when NATS does not answer, read once it does
    device.health-changed   `DevicePlugins.device_health`
    driver.validated    `DevicePlugins.driver_validated`: health back, devices read anew
    PauseOperands       `DevicePlugins.pause`, then `OperandPaused`
    ResumeOperands      `DevicePlugins.resume`, then `OperandResumed`
    device.plugin-config-selected   `DevicePlugins.select`, then
                        `device.plugin-config-applied`: the config in force, and why
    ListGpuHolders      the pods holding the GPUs, from the kubelet's PodResources
                        and the node's ResourceClaims (`holders`): `GpuHoldersListed`,
                        or `GpuHoldersUnknown`
    SetDeviceApi        serve the GPUs through the device plugin API or DRA
                        (`dra.switching`), then `device.api-applied`; also published at
                        start, when the kubelet (re-)registers the DRA plugin, and at stop
    dra.claim-allocated, dra.claim-released   one `ClaimHolders`, followed from the log's
                        start (`gpuop.inventory.claims.follow`): the DRA plugin's claims
                        and the holders of claims
    (MPS daemons)       every start, stop and failure of an MPS control daemon
                        (`mpscontrol`) as `device.mps-daemon-changed`, in order

How a node's label reaches the plugin: the plugin holds no Kubernetes credentials (a node
role), so discovery's cluster role watches the Nodes and publishes
`device.plugin-config-selected` on the node's subject whenever its
`nvidia.com/device-plugin.config` label changes; the plugin switches (re-reading its
`--config` file) and publishes `device.plugin-config-applied`, from which the labeler sets
the node's `nvidia.com/gpu.replicas`, `gpu.sharing-strategy` and `gpu.product` labels.

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
from gpuop.bus import (
    Bus,
    BusError,
    ConsumerSpec,
    Delivery,
    PermanentError,
    Subscription,
    TemporaryError,
    spans,
)
from gpuop.bus.protocol import Handler
from gpuop.events import (
    Envelope,
    Event,
    device,
    device_api_commands,
    driver,
    new_event,
    remediation_commands,
    subjects,
)
from gpuop.events.driver import Component
from gpuop.host.roots import HostRoot
from gpuop.inventory import claims
from gpuop.kubelet import constants
from gpuop.kubelet.allocations import KubeletPodResources, PodResources
from gpuop.nvml import open_backend
from gpuop.runtime import waiting
from gpuop.runtime.services import ServiceContext
from gpuop.services.device_plugin import config, consumers, holders, restoring, selecting
from gpuop.services.device_plugin.config import PluginConfigs
from gpuop.services.device_plugin.dra import serving
from gpuop.services.device_plugin.dra.plugin import DraPlugin
from gpuop.services.device_plugin.dra.switching import REGISTER_WAIT, DeviceApiSwitch
from gpuop.services.device_plugin.metrics import PluginMetrics
from gpuop.services.device_plugin.mpscontrol import MpsControl, MpsSupervisor
from gpuop.services.device_plugin.plugins import DevicePlugins, Reload

log = logging.getLogger(__name__)

NVML_HOLDER = consumers.SERVICE
"""Who the plugin's NVML session holds the simulated `nvidia` module as."""
RETRY_DELAY = 2.0
"""Seconds before a failed handler or subscription is tried again."""


class NodeAgent:
    """Feeds one node's device plugins from the bus, confirms their pauses and reports the
    config in force."""

    def __init__(
        self,
        bus: Bus,
        node: str,
        plugins: DevicePlugins,
        *,
        kubelet: PodResources | None = None,
        dra_plugin: DraPlugin | None = None,
        kubelet_dir: str = serving.KUBELET_DIR,
        retry_delay: float = RETRY_DELAY,
        register_wait: float = REGISTER_WAIT,
    ) -> None:
        self._bus = bus
        self._node = subjects.validate_node_name(node)
        self._plugins = plugins
        self._kubelet = kubelet or KubeletPodResources(
            plugins.root.join(
                f"{kubelet_dir}/{constants.POD_RESOURCES}/{constants.POD_RESOURCES_SOCKET}"
            )
        )
        """Asked which pods hold the GPUs; by default the kubelet's in its root directory
        `kubelet_dir` (relative to the host root)."""
        self._retry_delay = retry_delay
        self._dra = dra_plugin or DraPlugin(
            plugins.root,
            node,
            lambda: plugins.gpu_inventory,
            plugins.health,
            paused=lambda: Component.GPU in plugins.paused,
            kubelet_dir=kubelet_dir,
        )
        """The DRA kubelet plugin, served while the node's GPUs go through DRA."""
        self._device_api = DeviceApiSwitch(plugins, self._dra, register_wait=register_wait)
        self.claims = self._dra.index
        """The node's ResourceClaims holding its GPUs, from the bus: the DRA plugin's too."""
        self._source = f"/gpuop/{consumers.SERVICE}/{node}"
        self._selection_seq = 0
        """Stream sequence of the last config selection taken in."""
        self._reporting = asyncio.Lock()
        """Held while MPS daemon changes are published, so each goes out once, in order."""
        self._selecting = asyncio.Lock()
        """Held from the look at `_selection_seq` to its update: an older selection (read
        from the log by a late restore) never overrides a newer one."""

    async def run(self, stopping: asyncio.Event) -> None:
        """Restore, then serve the kubelet and follow the bus until `stopping` is set."""
        restored = await self.restore()
        subscriptions: list[Subscription] = []
        prefix, retry = self._bus.prefix, self._retry_delay
        wanted: list[tuple[ConsumerSpec, Handler]] = [
            (consumers.node_commands(prefix, self._node, retry_delay=retry), self.on_command),
            (
                consumers.node_own_commands(prefix, self._node, retry_delay=retry),
                self.on_own_command,
            ),
            (consumers.node_health(prefix, self._node, retry_delay=retry), self.on_health),
            (consumers.node_config(prefix, self._node, retry_delay=retry), self.on_config),
        ]
        following = asyncio.create_task(
            claims.follow(self._bus, self._node, self.claims, retry_seconds=retry),
            name="device-plugin-claims",
        )
        try:
            await self._device_api.start()
            async with asyncio.TaskGroup() as group:
                group.create_task(self._plugins.run(stopping), name="device-plugins")
                group.create_task(self._report_api(stopping), name="device-plugin-api-report")
                group.create_task(
                    self._follow(wanted, subscriptions, stopping, restored=restored),
                    name="device-plugin-follow",
                )
                group.create_task(self._report_mps(stopping), name="device-plugin-mps-report")
                group.create_task(
                    self._dra.watch_claims(stopping), name="device-plugin-claims-health"
                )
            await self._drain_mps()
        finally:
            following.cancel()
            await asyncio.gather(following, return_exceptions=True)
            for subscription in subscriptions:
                await subscription.stop()
            await self._stop_dra()
            await self._kubelet.close()

    async def _report_api(self, stopping: asyncio.Event) -> None:
        """Publish what the node serves whenever it changes on its own (start, the kubelet's
        registrations), until `stopping` is set; while the bus does not take it, try again."""
        changes = self._device_api.changes
        while not stopping.is_set():
            await waiting.idle(None, wake=self._device_api.changed, stopping=stopping)
            while changes and not stopping.is_set():
                try:
                    await self._bus.publish(self._envelope(changes[0], cause=None))
                    changes.popleft()
                except BusError as error:
                    log.warning("cannot report the device API yet: %s", error)
                    await waiting.stopped_within(stopping, self._retry_delay)

    async def _stop_dra(self) -> None:
        """Stop the DRA plugin, and say so once (the cluster role stops its slices)."""
        stopped = await self._device_api.stop()
        if stopped is None:
            return
        try:
            await self._bus.publish(self._envelope(stopped, cause=None))
        except BusError as error:
            log.warning("cannot report that the DRA plugin stopped: %s", error)

    async def _report_mps(self, stopping: asyncio.Event) -> None:
        """Publish the MPS daemons' changes as they come, until `stopping` is set; while the
        bus does not take them, try again."""
        changed = self._plugins.mps.changed
        while not stopping.is_set():
            await waiting.idle(None, wake=changed, stopping=stopping)
            while not stopping.is_set():
                try:
                    await self._flush_mps()
                    break
                except BusError as error:
                    log.warning("cannot report the MPS daemons yet: %s", error)
                    await waiting.stopped_within(stopping, self._retry_delay)

    async def _flush_mps(self) -> None:
        """Publish every MPS daemon change not yet published, oldest first; raises `BusError`
        leaving the rest for the next time. Before a pause or resume is confirmed, and
        before a config is reported, so the node's events come in the order things were
        done."""
        changes = self._plugins.mps.changes
        async with self._reporting:
            while changes:
                await self._bus.publish(self._envelope(changes[0], cause=None))
                changes.popleft()

    async def _drain_mps(self) -> None:
        """Publish, once, what the MPS daemons did while the plugin stopped (their quit)."""
        try:
            await self._flush_mps()
        except BusError as error:
            log.warning("cannot report the MPS daemons: %s", error)

    async def restore(self) -> bool:
        """Take in the pause state, health history and config selection the log holds,
        and report the config in force; whether it could."""
        try:
            paused = await operands.from_log(self._bus, self._node)
            history = await restoring.health(self._bus, self._node)
            last = await restoring.selection(self._bus, self._node)
        except BusError as error:
            log.warning("cannot read the node's history yet: %s", error)
            return False
        answer = await self._select(last.requested, last.seq) or self._plugins.selection
        await self._plugins.restore(paused, history)
        if paused:
            log.info("the node's operands are paused (%s)", ", ".join(sorted(paused)))
        try:
            await self._bus.publish(self._envelope(applied(answer), cause=None))
        except BusError as error:
            log.warning("cannot report the config in force yet: %s", error)
            return False
        return True

    async def on_config(self, delivery: Delivery) -> None:
        """A new value of the node's config label: switch, then report the config in
        force. A selection read at start already, or older, is skipped."""
        payload = delivery.payload
        if not isinstance(payload, device.DevicePluginConfigSelected):
            return
        with spans.handling(__name__, delivery):
            answer = await self._select(payload.config, delivery.stream_seq, newer=True)
            if answer is None and delivery.attempt > 1 and self._taken(delivery.stream_seq):
                answer = self._plugins.selection  # taken in, but its report failed
            if answer is not None:
                await self._publish_after_mps(applied(answer), delivery.envelope)

    def _taken(self, seq: int) -> bool:
        return seq == self._selection_seq

    async def _select(
        self, requested: str | None, seq: int, *, newer: bool = False
    ) -> selecting.Selection | None:
        """Switch to the config of the selection at `seq`, unless a later one (or, with
        `newer`, this one) was taken in already; None then."""
        async with self._selecting:
            if seq < self._selection_seq or (newer and seq == self._selection_seq):
                return None
            answer = await self._plugins.select(requested)
            self._selection_seq = seq
            return answer

    async def on_command(self, delivery: Delivery) -> None:
        """`PauseOperands` and `ResumeOperands` for this node's operands, each in its
        `handle <verb>` span (the confirmation is its child)."""
        with spans.handling(__name__, delivery):
            await self._on_command(delivery)

    async def _on_command(self, delivery: Delivery) -> None:
        await operands.handle(self, delivery)

    async def on_own_command(self, delivery: Delivery) -> None:
        """`ListGpuHolders` and `SetDeviceApi`, in their `handle <verb>` spans."""
        with spans.handling(__name__, delivery):
            command = delivery.payload
            if isinstance(command, device_api_commands.SetDeviceApi):
                answer = await self._device_api.apply(command.api)
                answered = answer.model_copy(update={"command_id": delivery.envelope.id})
                await self._publish(answered, delivery.envelope)
                return
            if not isinstance(command, remediation_commands.ListGpuHolders):
                raise PermanentError(f"{delivery.envelope.type} is not a device plugin command")
            if not self.claims.ready.is_set():
                raise TemporaryError(
                    "the node's ResourceClaims are not read from the log yet",
                    delay=self._retry_delay,
                )
            inventory = self._plugins.gpu_inventory
            found = await holders.answer(
                delivery.envelope.id, command, self._kubelet, inventory, self.claims
            )
            await self._publish(found, delivery.envelope)

    service = device.OperandService.DEVICE_PLUGIN

    async def pause(self, command: device.PauseOperands) -> None:
        log.info("pausing %s: %s", ", ".join(command.components), command.reason or "")
        await self._plugins.pause(command.components)
        await self._dra.health_changed()

    async def resume(self, command: device.ResumeOperands) -> None:
        log.info("resuming: %s", command.reason or "")
        await self._plugins.resume()
        await self._dra.health_changed()

    async def confirm(self, confirmation: Event, cause: Envelope) -> None:
        await self._publish_after_mps(confirmation, cause)

    async def on_health(self, delivery: Delivery) -> None:
        """Telemetry's health events and the driver-manager's validations of this node (the
        consumer takes every event of the node; its claims' come through `claims.follow`)."""
        payload = delivery.payload
        if isinstance(payload, device.DeviceHealthChanged):
            await self._plugins.device_health(payload)
        elif isinstance(payload, driver.DriverValidated):
            await self._plugins.driver_validated(payload.component)
        else:
            return
        await self._dra.health_changed()

    async def _publish_after_mps(self, payload: Event, cause: Envelope) -> None:
        """`_publish`, after what the MPS daemons did in the meantime."""
        try:
            await self._flush_mps()
        except BusError as error:
            raise TemporaryError(
                f"cannot report the MPS daemons before answering {cause.type}: {error}",
                delay=self._retry_delay,
            ) from error
        await self._publish(payload, cause)

    def _envelope(self, payload: Event, cause: Envelope | None) -> Envelope:
        return new_event(payload, node=self._node, source=self._source, cause=cause)

    async def _publish(self, payload: Event, cause: Envelope) -> None:
        envelope = self._envelope(payload, cause)
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


def applied(answer: selecting.Selection) -> device.DevicePluginConfigApplied:
    """The event that reports `answer`: the config in force and what it shares."""
    shared = selecting.sharing(answer.config)
    return device.DevicePluginConfigApplied(
        config=answer.name,
        requested=answer.requested,
        outcome=answer.outcome,
        replicas=shared.replicas,
        sharing_strategy=shared.strategy,
        renamed=shared.renamed,
        message=(answer.problem or "")[:2048],
    )


async def run(context: ServiceContext, configs: PluginConfigs) -> None:
    """The node role's entry point: the device plugins of `--node`, until the service stops."""
    settings = context.settings
    node, host_root = settings.require_node(), settings.require_host_root()
    nvml = open_backend(settings.nvml, host_root=host_root, node=node, holder_id=NVML_HOLDER)
    path = settings.config
    reload: Reload | None = None if path is None else (lambda: config.load_configs(path))
    root = HostRoot(host_root)
    # a simulated node's stand-in runs as it is; a real node's program chrooted into its host
    mps = MpsSupervisor(MpsControl(root, chroot=not settings.nvml.startswith("sim:")))
    plugins = DevicePlugins(
        root,
        nvml,
        configs,
        PluginMetrics(context.registry),
        reload=reload,
        readiness=context.set_readiness,
        mps=mps,
    )
    agent = NodeAgent(context.bus, node, plugins, kubelet_dir=configs.kubelet_root_dir)
    await agent.run(context.stopping)
