"""Collection: NVML readings in, pre-rendered Prometheus text out, off the scrape path.

The node exporter runs two loops over one `Collector`. The fast one (`collect()`, every
`interval_seconds`) reads every GPU's hot queries, microseconds each, then renders the whole
exposition once; scrapes serve `rendered` as it is until the next. The slow one
(`collect_slow()`, every `slow_interval_seconds`) runs the two blocking queries, PCIe
throughput (about 21 ms a GPU) and batched field values (about 3.4 ms), and takes a GPM
sample of every GPU and MIG GPU instance (`Nvml.activity()`, the profiling metrics over the
slow interval), in its own thread, and the next fast round renders what it found; it never
holds a fast round up. A GPU without GPM (NotSupported) is not asked again in the session.

Each fast round ends with one render of the process's registry (the exporter's own metrics,
the bus's, the process collector's) put before the GPU series, marked `Complete`: a scrape
serves those bytes as they are, renders nothing and takes no lock the collector holds, so
its cost does not grow with the registry and no collection can stretch it. The registry's
values are as old as the last collection, as the GPU series are.

A GPU whose query fails is left out of that round, the others are not: its failure is
counted and returned to the caller (the health tracker turns a lost GPU into an event). Only
errors that mean the session itself is gone (`SESSION_ERRORS`) end a round early, and the
exporter reopens NVML. Each round runs in a worker thread, which times its own CPU use.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

from gpuop.health import signals
from gpuop.nvml import (
    DeviceMetrics,
    DriverUnavailable,
    NotInitialized,
    NotSupported,
    Nvml,
    NvmlError,
    PcieThroughput,
)
from gpuop.nvml.profiling import Activity
from gpuop.observability.http import Complete
from gpuop.services.telemetry import catalog, exposition
from gpuop.services.telemetry.catalog import Reading
from gpuop.services.telemetry.config import TelemetryConfig
from gpuop.services.telemetry.exposition import GpuLabels
from gpuop.services.telemetry.instruments import ExporterMetrics
from gpuop.services.telemetry.pods import Attribution, InstanceKey
from gpuop.services.telemetry.sessions import Inventory, NvmlSession

log = logging.getLogger(__name__)

SLOW_QUERY = tuple(dict.fromkeys((*catalog.SLOW_FIELDS, *signals.packaged().fields())))
"""The fields one batched query asks for: the exported ones, and those the health catalog's
signals read (`gpuop.health.signals`)."""
SESSION_ERRORS = (NotInitialized, DriverUnavailable)
"""Failures that mean the NVML session is gone, not one GPU: the session is reopened."""


@dataclass(frozen=True, slots=True)
class SlowReading:
    """The slow queries' answers for one GPU."""

    pcie: PcieThroughput | None
    fields: Mapping[int, int | float]
    activity: Activity | None = None
    """GPM's answer for the whole GPU; None where it has no GPM."""
    instances: Mapping[int, Activity] = field(default_factory=dict)
    """GPM's answers for its MIG GPU instances, by `GPU_I_ID`."""


@dataclass(frozen=True, slots=True)
class XidSnapshot:
    """The XIDs seen so far, as the health tracker tells the renderer."""

    last: Mapping[int, int] = field(default_factory=dict)
    """Last XID by GPU index; GPUs without one read 0."""
    window_counts: Mapping[int, Mapping[int, int]] = field(default_factory=dict)
    """XIDs of the last 5 minutes, counted by GPU index then XID."""


@dataclass(frozen=True, slots=True)
class FastRound:
    """What one fast collection found."""

    inventory: Inventory
    """The session it ran in."""
    rendered: bytes
    metrics: Mapping[int, DeviceMetrics]
    """The GPUs that answered."""
    failures: Mapping[int, NvmlError]
    """The GPUs that did not, and why."""
    cpu_seconds: float


class Collector:
    """The collections of one node and the exposition they render."""

    def __init__(
        self,
        session: NvmlSession,
        config: TelemetryConfig,
        node: str,
        metrics: ExporterMetrics,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._session = session
        self._registry = registry
        """The process's registry, rendered with each collection; None: the server does."""
        self._config = config
        self._node = node
        self._metrics = metrics
        self._enabled = frozenset(config.metrics if config.metrics is not None else catalog.NAMES)
        self._attribution: Attribution = {}
        self._labels: dict[int, GpuLabels] = {}
        self._instance_labels: dict[InstanceKey, GpuLabels] = {}
        self._without_gpm: set[int] = set()
        """GPUs that answered GPM NotSupported in the session `_gpm_session` read."""
        self._gpm_session: Inventory | None = None
        self._labelled: Inventory | None = None
        """The inventory `_labels` were built for; another one rebuilds them."""
        self._slow: Mapping[int, SlowReading] = {}
        self.rendered = b""
        """The exposition every scrape serves until the next fast collection."""
        self.last: FastRound | None = None
        """The last fast collection."""

    def exposition(self) -> bytes:
        """The scrape path: the bytes of the last collection (`Complete` once the registry
        is rendered with them), and nothing else."""
        return self.rendered

    @property
    def slow_fields(self) -> dict[int, Mapping[int, int | float]]:
        """The latest slow round's field values, by GPU index (the health signals read them)."""
        return {index: reading.fields for index, reading in self._slow.items()}

    def attribute(self, attribution: Attribution) -> bool:
        """Take the pod attribution; returns whether it changed (the labels then do)."""
        if attribution == self._attribution:
            return False
        self._attribution = attribution
        self._labelled = None
        return True

    def forget(self) -> None:
        """Drop every reading and the exposition (NVML is closed for a pause)."""
        self.rendered = b""
        self._slow = {}
        self._labelled = None
        self.last = None

    async def collect(self, xids: XidSnapshot) -> FastRound:
        """One fast collection and render. Raises `SessionClosed` while paused, and
        `NvmlError` when the session could not open or is gone."""
        started = time.monotonic()
        async with self._session.use() as inventory:
            labels = self._labels_for(inventory)
            # without a watcher no XID is known, not even "none yet": no XID series then
            watched = xids if self._session.watcher is not None else None
            collected = await asyncio.to_thread(
                self._fast_round, self._session.nvml, inventory, labels, self._slow, watched
            )
            # kept while still a user of the session, so a close that follows forgets it
            self.rendered = collected.rendered
            self.last = collected
            self._metrics.collected(
                "fast", seconds=time.monotonic() - started, cpu_seconds=collected.cpu_seconds
            )
            self._metrics.last_collection.set(time.time())
            self._metrics.gpus.set(len(collected.metrics))
            self._metrics.nvml_failed("metrics", len(collected.failures))
            if self._registry is not None:
                self.rendered = await asyncio.to_thread(self._complete, collected.rendered)
        return collected

    def _complete(self, rendered: bytes) -> Complete:
        """The registry's render, then `rendered`; its CPU counts as the fast loop's."""
        assert self._registry is not None
        cpu = time.thread_time()
        complete = Complete(generate_latest(self._registry) + rendered)
        self._metrics.collector_cpu_seconds.labels(loop="fast").inc(time.thread_time() - cpu)
        return complete

    async def collect_slow(self) -> None:
        """One round of the slow queries, kept for the next fast collection to render."""
        started = time.monotonic()
        async with self._session.use() as inventory:
            if self._gpm_session is not inventory:  # another session: ask every GPU again
                self._without_gpm = set()
                self._gpm_session = inventory
            found, cpu_seconds = await asyncio.to_thread(
                self._slow_round, self._session.nvml, inventory
            )
            self._slow = found
        self._metrics.collected("slow", seconds=time.monotonic() - started, cpu_seconds=cpu_seconds)

    def _labels_for(self, inventory: Inventory) -> dict[int, GpuLabels]:
        if self._labelled is not inventory:
            self._labels = exposition.label_sets(
                inventory.gpus,
                node=self._node,
                driver_version=inventory.driver_version,
                attribution=self._attribution,
                allowed=self._config.labels,
            )
            self._instance_labels = exposition.instance_label_sets(
                inventory.gpus,
                inventory.migs,
                node=self._node,
                driver_version=inventory.driver_version,
                attribution=self._attribution,
                allowed=self._config.labels,
            )
            self._labelled = inventory
        return self._labels

    def _fast_round(
        self,
        nvml: Nvml,
        inventory: Inventory,
        labels: Mapping[int, GpuLabels],
        slow: Mapping[int, SlowReading],
        xids: XidSnapshot | None,
    ) -> FastRound:
        cpu = time.thread_time()
        gpus = inventory.gpus
        answered: dict[int, DeviceMetrics] = {}
        failures: dict[int, NvmlError] = {}
        for gpu in gpus:
            try:
                answered[gpu.index] = nvml.metrics(gpu.index)
            except SESSION_ERRORS:
                raise
            except NvmlError as error:
                failures[gpu.index] = error
        readings = {}
        for gpu in gpus:
            found = slow.get(gpu.index)
            readings[gpu.index] = Reading(
                fast=answered.get(gpu.index),
                pcie=found.pcie if found else None,
                fields=found.fields if found else {},
                last_xid=xids.last.get(gpu.index, 0) if xids else None,
                activity=found.activity if found else None,
            )
        instances = [
            (labelled, Reading(fast=None, activity=slow[index].instances.get(instance_id)))
            for (index, instance_id), labelled in self._instance_labels.items()
            if index in slow
        ]
        counts = xids.window_counts if xids else {}
        rendered = exposition.render(
            readings, labels, xid_counts=counts, enabled=self._enabled, instances=instances
        )
        return FastRound(inventory, rendered, answered, failures, time.thread_time() - cpu)

    def _slow_round(self, nvml: Nvml, inventory: Inventory) -> tuple[dict[int, SlowReading], float]:
        cpu = time.thread_time()
        found: dict[int, SlowReading] = {}
        for gpu in inventory.gpus:
            pcie: PcieThroughput | None = None
            fields: dict[int, int | float] = {}
            try:
                pcie = nvml.pcie_throughput(gpu.index)
            except SESSION_ERRORS:
                raise
            except NvmlError as error:
                self._metrics.nvml_failed("pcie")
                log.debug("PCIe throughput of GPU %d failed: %s", gpu.index, error)
            try:
                answers = nvml.field_values(gpu.index, SLOW_QUERY)
            except SESSION_ERRORS:
                raise
            except NvmlError as error:
                self._metrics.nvml_failed("fields")
                log.debug("field values of GPU %d failed: %s", gpu.index, error)
            else:
                fields = {a.field_id: a.value for a in answers if a.value is not None}
            instance_ids = sorted(
                {m.gpu_instance_id for m in inventory.migs if m.parent_index == gpu.index}
            )
            activity, instances = self._activity(nvml, gpu.index, instance_ids)
            found[gpu.index] = SlowReading(pcie, fields, activity, instances)
        return found, time.thread_time() - cpu

    def _activity(
        self, nvml: Nvml, index: int, instance_ids: Sequence[int]
    ) -> tuple[Activity | None, dict[int, Activity]]:
        """GPM's answers for the GPU and its GPU instances; a GPU without GPM is skipped."""
        if index in self._without_gpm:
            return None, {}
        instances: dict[int, Activity] = {}
        try:
            activity = nvml.activity(index)
            for instance_id in instance_ids:
                instances[instance_id] = nvml.activity(index, instance_id)
        except SESSION_ERRORS:
            raise
        except NotSupported:
            self._without_gpm.add(index)
            return None, {}
        except NvmlError as error:
            self._metrics.nvml_failed("gpm")
            log.debug("GPM of GPU %d failed: %s", index, error)
            return None, {}
        return activity, instances
