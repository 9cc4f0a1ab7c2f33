"""Collection: NVML readings in, pre-rendered Prometheus text out, off the scrape path.

The node exporter runs two loops over one `Collector`. The fast one (`collect()`, every
`interval_seconds`) reads every GPU's hot queries, microseconds each, then renders the whole
exposition once; scrapes serve `rendered` as it is until the next. The slow one
(`collect_slow()`, every `slow_interval_seconds`) runs the two blocking queries, PCIe
throughput (about 21 ms a GPU) and batched field values (about 3.4 ms), in its own thread,
and the next fast round renders what it found; it never holds a fast round up.

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

from gpuop.health import signals
from gpuop.nvml import (
    DeviceInfo,
    DeviceMetrics,
    DriverUnavailable,
    NotInitialized,
    Nvml,
    NvmlError,
    PcieThroughput,
)
from gpuop.services.telemetry import catalog, exposition
from gpuop.services.telemetry.catalog import Reading
from gpuop.services.telemetry.config import TelemetryConfig
from gpuop.services.telemetry.exposition import GpuLabels
from gpuop.services.telemetry.instruments import ExporterMetrics
from gpuop.services.telemetry.pods import Attribution
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
    ) -> None:
        self._session = session
        self._config = config
        self._node = node
        self._metrics = metrics
        self._enabled = frozenset(config.metrics if config.metrics is not None else catalog.NAMES)
        self._attribution: Attribution = {}
        self._labels: dict[int, GpuLabels] = {}
        self._labelled: Inventory | None = None
        """The inventory `_labels` were built for; another one rebuilds them."""
        self._slow: Mapping[int, SlowReading] = {}
        self.rendered = b""
        """The exposition every scrape serves until the next fast collection."""
        self.last: FastRound | None = None
        """The last fast collection."""

    def exposition(self) -> bytes:
        """The scrape path: the bytes of the last collection, and nothing else."""
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
        return collected

    async def collect_slow(self) -> None:
        """One round of the slow queries, kept for the next fast collection to render."""
        started = time.monotonic()
        async with self._session.use() as inventory:
            found, cpu_seconds = await asyncio.to_thread(
                self._slow_round, self._session.nvml, inventory.gpus
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
            )
        counts = xids.window_counts if xids else {}
        rendered = exposition.render(readings, labels, xid_counts=counts, enabled=self._enabled)
        return FastRound(inventory, rendered, answered, failures, time.thread_time() - cpu)

    def _slow_round(
        self, nvml: Nvml, gpus: Sequence[DeviceInfo]
    ) -> tuple[dict[int, SlowReading], float]:
        cpu = time.thread_time()
        found: dict[int, SlowReading] = {}
        for gpu in gpus:
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
            found[gpu.index] = SlowReading(pcie, fields)
        return found, time.thread_time() - cpu
