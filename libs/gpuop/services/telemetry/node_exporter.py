"""Telemetry's node role: dcgm-exporter's metrics for the node's GPUs, and their health events.

`run` (the service's node entry point) builds a `NodeExporter` and points the service's
`/metrics` at its pre-rendered exposition. The exporter runs its loops over one NVML
session (`sessions`):

- fast: every `interval_seconds`, read every GPU's hot queries and render (`collecting`);
- slow: every `slow_interval_seconds`, PCIe throughput and field values, in their own thread;
- pods: every `pods_interval_seconds`, PodResources `List` and the node's ResourceClaims
  (followed from the bus, `gpuop.inventory.claims`), and the pods' uids when the `pod_uid`
  label is on (`pod_uids`); labels change only when the answer does (`pods`);
- events: NVML's XID and ECC events, turned into `device.health-changed` (`health`), and
  an outbox that publishes them, keeping them while NATS is unreachable;
- kernel log: every `kernel_log_interval_seconds`, the XIDs of the host's `/dev/kmsg`
  (`kernel_log`), acted on as NVML's; an XID both sources report is acted on once.

On `PauseOperands` for the GPU driver it waits for the running queries, closes NVML (the
event watcher with it), serves no GPU series and confirms with `OperandPaused`;
`ResumeOperands` lets the next collection reopen NVML, confirmed by `OperandResumed`. A
restarted exporter learns whether it is paused from the node's stored commands. The
service is ready once the first collection succeeded (or it starts paused).
"""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import CollectorRegistry

from gpuop import operands
from gpuop.bus import Bus, Delivery, spans
from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.events import Envelope, Event, device
from gpuop.events.driver import Component
from gpuop.health import falls
from gpuop.host.roots import HostRoot
from gpuop.inventory import claims
from gpuop.nvml import DeviceEvent, Nvml, NvmlError, XidEvent, open_backend
from gpuop.runtime import waiting
from gpuop.runtime.node_agents import NodeAgentBase
from gpuop.runtime.services import Readiness, ServiceContext
from gpuop.services.telemetry import catalog, consumers, health, pods
from gpuop.services.telemetry.collecting import Collector
from gpuop.services.telemetry.config import TelemetryConfig
from gpuop.services.telemetry.health import Outbox, XidHistory
from gpuop.services.telemetry.instruments import ExporterMetrics
from gpuop.services.telemetry.kernel_log import KernelLog, SeenFaults
from gpuop.services.telemetry.kubelet_pods import KubeletPodResources
from gpuop.services.telemetry.marks import HealthTracker
from gpuop.services.telemetry.pod_uids import PodUids
from gpuop.services.telemetry.sessions import Inventory, NvmlSession, SessionClosed

log = logging.getLogger(__name__)

NVML_HOLDER = "telemetry"
"""Who telemetry's NVML session holds the simulated `nvidia` module as."""


class NodeExporter(NodeAgentBase):
    """Telemetry on one node; see the module docstring."""

    def __init__(
        self,
        bus: Bus,
        node: str,
        nvml: Nvml,
        config: TelemetryConfig,
        registry: CollectorRegistry,
        *,
        pod_resources: pods.PodResourcesSource | None = None,
        pod_uids: PodUids | None = None,
        kernel_log: KernelLog | None = None,
        fallen: falls.Falls | None = None,
        readiness: Readiness | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        super().__init__(bus, consumers.SERVICE, node, readiness)
        self._config = config
        self._clock = clock
        maps_pods = pod_resources is not None and config.maps_pods
        self.metrics = ExporterMetrics(registry, maps_pods=maps_pods)
        self.session = NvmlSession(nvml)
        self.collector = Collector(self.session, config, node, self.metrics, registry)
        self.xids = XidHistory()
        self.health = HealthTracker(config.ignored_xids, fallen=fallen)
        self.kernel_log = kernel_log
        self.seen_xids = SeenFaults()
        self._known: Inventory | None = None
        """The last inventory an NVML session read: the kernel log's faults are matched to
        GPUs by it while NVML no longer opens."""
        self.outbox = Outbox(bus, node, self._source, self.metrics)
        self._attributor = None
        if pod_resources is not None and self.metrics.pod_resources_up is not None:
            up = self.metrics.pod_resources_up
            self._attributor = pods.Attributor(
                pod_resources, config.resource_names, up, claims.ClaimHolders(), pod_uids
            )
        self._collecting = asyncio.Lock()
        """One fast collection at a time, so an older render never replaces a newer one."""
        self._wake_fast = asyncio.Event()
        self._wake_slow = asyncio.Event()
        self._wake_outbox = asyncio.Event()
        self._paused = False
        self._ready = False
        self._failing: str | None = None
        """Why NVML failed last, logged once per failure rather than once per collection."""

    @property
    def paused(self) -> bool:
        """Whether NVML is closed because the GPU driver is about to be reloaded."""
        return self._paused

    def exposition(self) -> bytes:
        """What `/metrics` serves: the last collection's render, the registry's included."""
        return self.collector.rendered

    async def run(self, stopping: asyncio.Event) -> None:
        """Restore, subscribe, then collect and watch until `stopping` is set."""
        await self.restore()
        retry = self._config.retry_interval_seconds
        subscription = await self._bus.consume(
            consumers.node_commands(self._bus.prefix, self._node, retry_delay=retry),
            self.on_command,
        )
        try:
            async with asyncio.TaskGroup() as group:
                loops = [
                    group.create_task(self._fast_loop(), name="telemetry-fast"),
                    group.create_task(self._slow_loop(), name="telemetry-slow"),
                    group.create_task(self._events_loop(), name="telemetry-events"),
                    group.create_task(self._outbox_loop(), name="telemetry-outbox"),
                ]
                if self._attributor is not None:
                    loops.append(group.create_task(self._pods_loop(), name="telemetry-pods"))
                if self._attributor is not None and self._attributor.claims is not None:
                    follow = claims.follow(
                        self._bus, self._node, self._attributor.claims, retry_seconds=retry
                    )
                    loops.append(group.create_task(follow, name="telemetry-claims"))
                if self.kernel_log is not None:
                    loops.append(group.create_task(self._kernel_log_loop(), name="telemetry-kmsg"))
                await stopping.wait()
                for loop in loops:
                    loop.cancel()
        finally:
            await subscription.stop()
            await self.session.close()
            if self._attributor is not None:
                await self._attributor.source.close()
            await self.outbox.flush()

    async def restore(self) -> None:
        """Learn from the node's stored commands whether the operands are paused."""
        if Component.GPU in await operands.from_log(self._bus, self._node):
            log.info("operands of %s are paused: NVML stays closed", self._node)
            await self._pause()
            self._became_ready()

    async def collect(self) -> None:
        """One fast collection; NVML failures are logged, and the session reopened."""
        async with self._collecting:
            try:
                collected = await self.collector.collect(
                    self.xids.snapshot(self._clock.monotonic())
                )
            except SessionClosed:
                return
            except NvmlError as error:
                await self._nvml_failed(error)
                return
        if self._failing is not None:
            log.info("NVML answers again")
            self._failing = None
        self._became_ready()
        changes = self.health.on_round(
            collected.inventory,
            collected,
            fields=self.collector.slow_fields,
            now=self._clock.monotonic(),
        )
        for change in changes:
            self.outbox.add(change)
            self._wake_outbox.set()

    async def refresh_pods(self) -> None:
        """Ask the kubelet who holds which GPU; re-render at once when that changed."""
        inventory = self.session.inventory
        if self._attributor is None or inventory is None:
            return
        attribution = await self._attributor.refresh(inventory)
        if attribution is not None and self.collector.attribute(attribution):
            self._wake_fast.set()

    async def on_command(self, delivery: Delivery) -> None:
        """`PauseOperands` and `ResumeOperands` for this node's operands, each in its
        `handle <verb>` span (the confirmation is its child)."""
        with spans.handling(__name__, delivery):
            await operands.handle(self, delivery)

    service = device.OperandService.TELEMETRY

    async def pause(self, command: device.PauseOperands) -> None:
        if operands.gpu_paused_after(self._paused, command) and not self._paused:
            log.info("pausing: closing NVML for a driver reload (%s)", command.reason)
            await self._pause()

    async def resume(self, command: device.ResumeOperands) -> None:
        if self._paused:
            log.info("resuming: NVML may open again (%s)", command.reason)
            self._paused = False
            await self.session.resume()
            self.metrics.paused.set(0)
            self._wake_fast.set()
            self._wake_slow.set()

    async def confirm(self, confirmation: Event, cause: Envelope) -> None:
        await self._publish(confirmation, cause=cause)

    async def on_device_event(self, event: DeviceEvent, inventory: Inventory) -> None:
        """An XID or ECC event: count it, collect at once so the metrics show it, and tell
        the cluster when the GPU's health changed."""
        self._known = inventory
        if isinstance(event, XidEvent):
            if not self._first(event, "nvml"):
                return
            self.xids.record(event.index, event.xid, self._clock.monotonic())
        await self._health_changed(event, inventory)

    def _first(self, event: XidEvent, source: str) -> bool:
        """Whether `event` is news from either source; counted by source and outcome."""
        first = self.seen_xids.first(event.uuid, event.xid, self._clock.monotonic())
        outcome = "acted" if first else "duplicate"
        self.metrics.xid_sources.labels(source=source, outcome=outcome).inc()
        return first

    async def read_kernel_log(self) -> None:
        """One read of the kernel log: each new XID acted on as NVML's would be."""
        assert self.kernel_log is not None
        inventory = self.session.inventory or self._known
        try:
            found = await asyncio.to_thread(self.kernel_log.poll, inventory)
        except OSError as error:
            reason = f"kernel log unreadable: {error}"
            if reason != self._failing:
                log.warning("%s; NVML's events still count", reason)
                self._failing = reason
            return
        self.metrics.kernel_log_lost.inc(found.lost)
        if found.unknown_gpus:
            self.metrics.xid_sources.labels(source="kernel-log", outcome="unknown-gpu").inc(
                found.unknown_gpus
            )
        for event in found.events:
            if inventory is not None and self._first(event, "kernel-log"):
                self.xids.record(event.index, event.xid, self._clock.monotonic())
                await self._health_changed(event, inventory)

    async def _health_changed(self, event: DeviceEvent, inventory: Inventory) -> None:
        await self.collect()
        change = self.health.on_event(event, inventory, self.collector.last)
        if change is not None:
            self.outbox.add(change)
            self._wake_outbox.set()

    async def _pause(self) -> None:
        self._paused = True
        async with self._collecting:
            await self.session.pause()
            self.collector.forget()
        self.metrics.paused.set(1)
        self.metrics.gpus.set(0)

    async def _nvml_failed(self, error: NvmlError) -> None:
        self.metrics.nvml_failed("open" if self.session.inventory is None else "metrics")
        reason = f"NVML failed: {error}"
        if reason != self._failing:
            log.warning("%s; retrying every %gs", reason, self._config.retry_interval_seconds)
            self._failing = reason
        if not self._ready:
            self._readiness(False, reason)
        await self.session.close()
        self.collector.forget()

    def _became_ready(self) -> None:
        if not self._ready:
            self._ready = True
            self._readiness(True, "")

    async def _fast_loop(self) -> None:
        while True:
            await self.collect()
            failing = self._failing is not None
            config = self._config
            await waiting.idle(
                config.retry_interval_seconds if failing else config.interval_seconds,
                wake=self._wake_fast,
            )

    async def _slow_loop(self) -> None:
        while True:
            try:
                await self.collector.collect_slow()
            except SessionClosed:
                pass
            except NvmlError as error:  # the fast loop reopens the session
                log.debug("slow queries failed: %s", error)
            await waiting.idle(self._config.slow_interval_seconds, wake=self._wake_slow)

    async def _pods_loop(self) -> None:
        while True:
            await self.session.opened()
            await self.refresh_pods()
            await asyncio.sleep(self._config.pods_interval_seconds)

    async def _events_loop(self) -> None:
        await health.watch(
            self.session,
            self.on_device_event,
            self.metrics,
            retry_seconds=self._config.retry_interval_seconds,
        )

    async def _kernel_log_loop(self) -> None:
        while True:
            await self.read_kernel_log()
            await asyncio.sleep(self._config.kernel_log_interval_seconds)

    async def _outbox_loop(self) -> None:
        while True:
            flushed = await self.outbox.flush()
            await waiting.idle(
                None if flushed else self._config.retry_interval_seconds, wake=self._wake_outbox
            )


async def run(context: ServiceContext, config: TelemetryConfig) -> None:
    """The node role's entry point: one `NodeExporter` for `--node`, until the service stops."""
    settings = context.settings
    node = settings.require_node()
    nvml = open_backend(
        settings.nvml, host_root=settings.host_root, node=node, holder_id=NVML_HOLDER
    )
    pod_resources = KubeletPodResources(config.socket_under(settings.host_root))
    exporter = NodeExporter(
        context.bus,
        node,
        nvml,
        config,
        context.registry,
        pod_resources=pod_resources,
        pod_uids=PodUids(settings.host_root) if catalog.POD_UID in config.labels else None,
        kernel_log=KernelLog(settings.host_root) if config.kernel_log else None,
        fallen=falls.at(HostRoot(settings.host_root)),
        readiness=context.set_readiness,
    )
    context.exposition = exporter.exposition
    await exporter.run(context.stopping)
