"""From NVML's readings to health signals: counters rising past a rate, conditions held past
a time, GPUs lost. Called by telemetry's health tracker after every fast collection, with
the latest slow field values; pure apart from the state it keeps per GPU (no I/O, time
passed in), so a test drives it with recorded readings and a made-up clock.

What each signal reads (the thresholds are the catalog's, `gpuop.health.signals`):

    nvlink-errors          the sum of the NVLink CRC flit, CRC data, replay and recovery
                           error totals (`NVML_FI_DEV_NVLINK_*_ERROR_COUNT_TOTAL`)
    pcie-replays           `nvmlDeviceGetPcieReplayCounter`
    clocks-thermal,        `nvmlDeviceGetCurrentClocksEventReasons` has any of the entry's
    clocks-power-brake     bits
    pcie-link-width        current lanes below the maximum
    pcie-link-generation   current generation below the maximum on a GPU that is not idle
    row-remap-pending,     `nvmlDeviceGetRemappedRows`' isPending and failureOccurred
    row-remap-failure
    gpu-lost               a query answered `NVML_ERROR_GPU_IS_LOST` (`errors.GpuLost`)
    gpu-unreachable        a query failed otherwise

A counter fires once when it rises by the entry's `count` within `window_seconds`, and may
fire again only after a window in which it did not (a storm is one signal, not one per
round); a counter that went down (the driver reloaded) starts over. A condition fires once
when it has held for `held_seconds`, and again only after it stopped holding. A value the
GPU does not report (NotSupported: no NVLink, no row remapper) never makes a signal.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpuop.health.signals import Catalog, SignalEntry
from gpuop.health.xids import CatalogError
from gpuop.nvml import ClockEventReason, DeviceMetrics, GpuLost, NvmlError

GPU_LOST = "gpu-lost"
GPU_UNREACHABLE = "gpu-unreachable"

Fields = Mapping[int, int | float]
"""One GPU's latest batched field values, by `nvmlFieldValue` id (NotSupported left out)."""
Condition = Callable[[SignalEntry, DeviceMetrics], str | None]
"""What a condition sees now (its detail for the event), or None when it does not hold."""
Counter = Callable[[SignalEntry, DeviceMetrics, Fields], int | None]
"""A counter's value now; None when the GPU does not report it."""


def _clock_bits(entry: SignalEntry, metrics: DeviceMetrics) -> str | None:
    reasons = metrics.clock_event_reasons
    held = ClockEventReason(0)
    for bit in entry.bits:
        if reasons is not None and reasons & bit:
            held |= ClockEventReason(bit)
    return None if not held else f"clock event reasons {held!r}"


def _link_width(_: SignalEntry, metrics: DeviceMetrics) -> str | None:
    now, most = metrics.pcie_link_width, metrics.pcie_max_link_width
    if now is None or most is None or now >= most:
        return None
    return f"PCIe link x{now} of x{most}"


def _link_generation(_: SignalEntry, metrics: DeviceMetrics) -> str | None:
    now, most = metrics.pcie_link_generation, metrics.pcie_max_link_generation
    idle = metrics.clock_event_reasons is not None and bool(
        metrics.clock_event_reasons & ClockEventReason.GPU_IDLE
    )
    if now is None or most is None or now >= most or idle:
        return None
    return f"PCIe link at generation {now} of {most} while busy"


def _remap_pending(_: SignalEntry, metrics: DeviceMetrics) -> str | None:
    return "a row remap is pending" if metrics.remapped_rows_pending else None


def _remap_failure(_: SignalEntry, metrics: DeviceMetrics) -> str | None:
    return "a row remap failed" if metrics.remapped_rows_failure else None


def _field_sum(entry: SignalEntry, _: DeviceMetrics, fields: Fields) -> int | None:
    present = [fields[f] for f in entry.fields if f in fields]
    return int(sum(present)) if present else None


def _pcie_replays(_: SignalEntry, metrics: DeviceMetrics, __: Fields) -> int | None:
    return metrics.pcie_replay_count


CONDITIONS: Mapping[str, Condition] = {
    "clocks-thermal": _clock_bits,
    "clocks-power-brake": _clock_bits,
    "pcie-link-width": _link_width,
    "pcie-link-generation": _link_generation,
    "row-remap-pending": _remap_pending,
    "row-remap-failure": _remap_failure,
}
COUNTERS: Mapping[str, Counter] = {
    "nvlink-errors": _field_sum,
    "pcie-replays": _pcie_replays,
}


@dataclass(frozen=True, slots=True)
class Detection:
    """A signal seen on one GPU."""

    signal: str
    index: int
    uuid: str
    detail: str
    """What was seen, for operators: `NVLink errors rose by 240 within 60 s`."""


@dataclass
class _Gpu:
    since: dict[str, float] = field(default_factory=dict)
    """When each condition that holds began to."""
    counts: dict[str, deque[tuple[float, int]]] = field(default_factory=dict)
    firing: set[str] = field(default_factory=set)
    """Signals fired and not yet over: never fired twice in one episode."""


class Detector:
    """The signals of one node's GPUs, over successive readings."""

    def __init__(self, catalog: Catalog) -> None:
        self._entries = catalog.signals
        unread = [
            name
            for name, entry in catalog.signals.items()
            if (entry.kind == "condition" and name not in CONDITIONS)
            or (entry.kind == "counter" and name not in COUNTERS)
        ]
        if unread:
            raise CatalogError(f"signals the detector cannot read: {', '.join(unread)}")
        self._gpus: dict[str, _Gpu] = {}

    def active(self, uuid: str) -> frozenset[str]:
        """The signals firing on the GPU now."""
        gpu = self._gpus.get(uuid)
        return frozenset(gpu.firing) if gpu else frozenset()

    def lost(self, index: int, uuid: str, error: NvmlError) -> Detection:
        """The signal a failed query means."""
        signal = GPU_LOST if isinstance(error, GpuLost) else GPU_UNREACHABLE
        return Detection(signal, index, uuid, f"GPU {index} does not answer NVML: {error}")

    def observe(
        self, index: int, uuid: str, metrics: DeviceMetrics, fields: Fields, now: float
    ) -> list[Detection]:
        """The signals that fire with this reading of the GPU (monotonic `now`)."""
        gpu = self._gpus.setdefault(uuid, _Gpu())
        found: list[Detection] = []
        for name, entry in self._entries.items():
            if entry.kind == "condition":
                detail = self._condition(gpu, entry, CONDITIONS[name](entry, metrics), now)
            elif entry.kind == "counter":
                value = COUNTERS[name](entry, metrics, fields)
                detail = self._counter(gpu, entry, value, now)
            else:
                continue
            if detail is not None:
                found.append(Detection(name, index, uuid, detail))
        return found

    def _condition(self, gpu: _Gpu, entry: SignalEntry, seen: str | None, now: float) -> str | None:
        name = entry.signal
        if seen is None:
            gpu.since.pop(name, None)
            gpu.firing.discard(name)
            return None
        since = gpu.since.setdefault(name, now)
        held = entry.held_seconds or 0.0
        if name in gpu.firing or now - since < held:
            return None
        gpu.firing.add(name)
        return f"{seen} for {now - since:.0f} s" if held else seen

    def _counter(self, gpu: _Gpu, entry: SignalEntry, value: int | None, now: float) -> str | None:
        name = entry.signal
        if value is None:
            return None
        history = gpu.counts.setdefault(name, deque())
        if history and value < history[-1][1]:
            history.clear()  # the counters restarted: a driver reload or a reset
        history.append((now, value))
        window = entry.window_seconds or 0.0
        while len(history) > 1 and history[1][0] <= now - window:
            history.popleft()
        rise = value - history[0][1]
        if rise < (entry.count or 1):
            if now - history[0][0] >= window:
                gpu.firing.discard(name)  # a whole window below the rate: the storm is over
            return None
        if name in gpu.firing:
            return None
        gpu.firing.add(name)
        return f"{entry.signal} rose by {rise} within {now - history[0][0]:.0f} s"
