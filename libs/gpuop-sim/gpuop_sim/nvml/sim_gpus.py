"""One simulated GPU for `SimNvml`: who it is, and values that move like a real one's.

Identity derives from the node name and index alone, so every process that simulates the
same node agrees on it: a `GPU-` UUID, a bus id in NVML's `00000000:XX:00.0` form, minor
number = index, a 13-digit serial. Everything else starts from the recorded H200.

Values advance in fixed one-second steps of simulated time read from an injected clock, each
step drawing from the GPU's own seeded generator, so a given seed and clock give the same
readings however often they are read. A load level changes now and then; utilisation
follows it, power follows utilisation, temperature follows power with a lag, memory in use
follows load; energy integrates power and only grows. Bounds: utilisation 0 to 100 %,
power between 90 % of the recorded idle draw and the power limit, temperature 25 to 90 °C,
memory used between 0 and the framebuffer less the driver's reserve.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field, replace

from gpuop.nvml.devices import MIB, DeviceInfo
from gpuop.nvml.metrics import ClockEventReason, DeviceMetrics, ProcessInfo

STEP_SECONDS = 1.0
"""Simulated time per random-walk step."""
MAX_STEPS = 3600
"""Steps taken at most per reading; a longer gap only accrues energy at the current draw."""
LOAD_LEVELS = (0.0, 0.0, 10.0, 35.0, 60.0, 85.0, 100.0)
"""Workload levels (% utilisation) a GPU drifts between; idle is twice as likely."""
MIN_TEMPERATURE_C = 25.0
MAX_TEMPERATURE_C = 90.0
IDLE_SM_CLOCK_MHZ = 345
"""The recorded H200's SM clock at idle."""


def _board(board: int) -> str:
    return f"/board-{board}" if board else ""


def gpu_uuid(node: str, index: int, board: int = 0) -> str:
    """`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, fixed by node name and index (and the
    boards put in that slot since the first, `sim_replacements`)."""
    d = hashlib.sha256(f"gpuop-sim/{node}/{index}{_board(board)}".encode()).hexdigest()
    return f"GPU-{d[:8]}-{d[8:12]}-{d[12:16]}-{d[16:20]}-{d[20:32]}"


def serial_number(node: str, index: int, board: int = 0) -> str:
    """A 13-digit board serial, fixed by node name and index (and board, as the UUID)."""
    d = hashlib.sha256(f"gpuop-sim-serial/{node}/{index}{_board(board)}".encode()).hexdigest()
    return f"{int(d[:16], 16) % 10**13:013d}"


def bus_id(index: int, gpus: int) -> str:
    """NVML's bus id for GPU `index` of `gpus`: buses spread over 0x10-0xEF, so GPUs of the
    first half sit below 0x80 (the first CPU socket's root complex) and the rest above."""
    return f"00000000:{0x10 + index * (0xE0 // gpus):02X}:00.0"


def pcie_root(index: int, gpus: int) -> str:
    """The PCIe root complex above GPU `index` of `gpus`, as sysfs names it: each GPU behind
    a root port of its own host bridge, one bus below its own (`pci0000:0f` above
    `0000:10:00.0`), as on HGX machines."""
    bus = 0x10 + index * (0xE0 // gpus)
    return f"pci0000:{bus - 1:02x}"


def numa_node(index: int, gpus: int) -> int:
    """The first half of the GPUs on NUMA node 0, the rest on node 1."""
    return index * 2 // gpus if gpus > 1 else 0


def identity(template: DeviceInfo, node: str, index: int, gpus: int) -> DeviceInfo:
    """The recorded GPU's inventory, made GPU `index` of a `gpus`-GPU node: its own ids,
    bus address and NUMA node, MIG off, no fabric clique; the rest as recorded."""
    return replace(
        template,
        index=index,
        uuid=gpu_uuid(node, index),
        serial=serial_number(node, index),
        pci_bus_id=bus_id(index, gpus),
        minor_number=index,
        mig_mode_current=False,
        mig_mode_pending=False,
        max_mig_devices=0,
        numa_node=numa_node(index, gpus),
        fabric_clique=None,
    )


@dataclass
class Counters:
    """Error counters; `volatile_*` and `pcie_replays` reset when the driver reloads."""

    volatile_corrected: int = 0
    volatile_uncorrected: int = 0
    aggregate_corrected: int = 0
    aggregate_uncorrected: int = 0
    remapped_correctable: int = 0
    remapped_uncorrectable: int = 0
    remap_pending: bool = False
    pcie_replays: int = 0
    processes: dict[int, int] = field(default_factory=dict)
    """Used framebuffer by PID of the simulated compute processes."""
    nvlink_errors: dict[int, int] = field(default_factory=dict)
    """NVLink error totals by `FieldId` (CRC flit, CRC data, replay, recovery); they reset
    with the driver, as a GPU reset clears them."""
    remap_failure: bool = False
    """The GPU ran out of spare rows: a reset does not clear it (new hardware does)."""
    pcie_link: tuple[int, int] | None = None
    """(generation, width) the link trained at instead of its maximum; None: at its maximum.
    A driver reload retrains it (a degraded link comes back degraded unless cleared)."""
    clock_events: ClockEventReason = ClockEventReason.NONE
    """Reasons put on the GPU from outside (a hot aisle, a power brake), beside its own."""


class SimGpu:
    """The moving state of one simulated GPU."""

    def __init__(
        self, info: DeviceInfo, base: DeviceMetrics, rng: random.Random, now: float
    ) -> None:
        self.info = info
        self.base = base
        self.counters = Counters()
        self._rng = rng
        self._last = now
        self._load = 0.0
        self.utilization = float(base.gpu_utilization_percent or 0)
        self.memory_utilization = float(base.memory_utilization_percent or 0)
        self.power_mw = float(base.power_usage_mw or 75_000)
        self.temperature = float(base.temperature_celsius or 34)
        self.energy_mj = float(base.total_energy_mj or 0)
        self.workload_bytes = 0.0
        self.nvlink_tx_kib = 0
        self.nvlink_rx_kib = 0
        self.idle_power_mw = self.power_mw
        self.limit_mw = float(info.power_limit_mw or 700_000)
        # The recorded H200 ran its link at its maximum (nvidia-smi: gen 5 of 5, x16 of x16).
        self.max_link_generation = base.pcie_link_generation or 5
        self.max_link_width = base.pcie_link_width or 16
        # With nothing running, the v1 "used" the recording holds is the driver's reserve.
        self.reserved_bytes = int(base.memory_used_bytes or 0)

    def advance(self, now: float) -> None:
        """Move the values on to `now` in whole steps; a partial step waits for later."""
        steps = int((now - self._last) // STEP_SECONDS)
        if steps <= 0:
            return
        for _ in range(min(steps, MAX_STEPS)):
            self._step()
        self.energy_mj += self.power_mw * STEP_SECONDS * max(steps - MAX_STEPS, 0)
        self._last += steps * STEP_SECONDS

    def driver_reloaded(self) -> None:
        """What a driver reload clears: volatile counters, energy, pending remaps (applied
        by the GPU reset that comes with it), processes."""
        c = self.counters
        c.volatile_corrected = c.volatile_uncorrected = c.pcie_replays = 0
        c.remap_pending = False
        c.nvlink_errors.clear()
        c.processes.clear()
        self.energy_mj = 0.0

    def metrics(self) -> DeviceMetrics:
        c = self.counters
        capacity = self.info.memory_total_bytes - self.reserved_bytes
        used = min(int(self.workload_bytes) + sum(c.processes.values()), capacity)
        busy = self.utilization >= 1.0
        capped = self.power_mw >= 0.95 * self.limit_mw
        if not busy:
            reasons = ClockEventReason.GPU_IDLE
        else:
            reasons = ClockEventReason.SW_POWER_CAP if capped else ClockEventReason.NONE
        reasons |= c.clock_events
        max_clock = self.info.max_sm_clock_mhz or IDLE_SM_CLOCK_MHZ
        generation, width = c.pcie_link or (self.max_link_generation, self.max_link_width)
        return DeviceMetrics(
            index=self.info.index,
            memory_used_bytes=used,
            memory_free_bytes=capacity - used,
            memory_reserved_bytes=self.reserved_bytes,
            gpu_utilization_percent=round(self.utilization),
            memory_utilization_percent=round(self.memory_utilization),
            encoder_utilization_percent=self.base.encoder_utilization_percent,
            temperature_celsius=round(self.temperature),
            fan_speed_percent=self.base.fan_speed_percent,
            power_usage_mw=round(self.power_mw),
            total_energy_mj=int(self.energy_mj),
            sm_clock_mhz=(max_clock - 225 if capped else max_clock) if busy else IDLE_SM_CLOCK_MHZ,
            memory_clock_mhz=self.base.memory_clock_mhz,
            performance_state=self.base.performance_state,
            clock_event_reasons=reasons,
            ecc_volatile_corrected=c.volatile_corrected,
            ecc_volatile_uncorrected=c.volatile_uncorrected,
            ecc_aggregate_corrected=c.aggregate_corrected,
            ecc_aggregate_uncorrected=c.aggregate_uncorrected,
            remapped_rows_correctable=c.remapped_correctable,
            remapped_rows_uncorrectable=c.remapped_uncorrectable,
            remapped_rows_pending=c.remap_pending,
            remapped_rows_failure=c.remap_failure,
            retired_pages_pending=self.base.retired_pages_pending,
            pcie_replay_count=c.pcie_replays,
            processes=tuple(
                ProcessInfo(pid, used_bytes, None, None)
                for pid, used_bytes in sorted(c.processes.items())
            ),
            pcie_link_generation=generation,
            pcie_link_width=width,
            pcie_max_link_generation=self.max_link_generation,
            pcie_max_link_width=self.max_link_width,
        )

    def _step(self) -> None:
        rng = self._rng
        if rng.random() < 0.05:
            self._load = rng.choice(LOAD_LEVELS)
        self.utilization = _clamp(
            self.utilization + (self._load - self.utilization) * 0.35 + rng.gauss(0, 3), 0, 100
        )
        self.memory_utilization = _clamp(self.utilization * 0.6 + rng.gauss(0, 2), 0, 100)
        target_mw = self.idle_power_mw + (0.92 * self.limit_mw - self.idle_power_mw) * (
            self.utilization / 100
        )
        self.power_mw = _clamp(
            self.power_mw + (target_mw - self.power_mw) * 0.5 + rng.gauss(0, 3_000),
            0.9 * self.idle_power_mw,
            self.limit_mw,
        )
        target_c = 30.0 + self.power_mw / 1000 * 0.07
        self.temperature = _clamp(
            self.temperature + (target_c - self.temperature) * 0.2 + rng.gauss(0, 0.3),
            MIN_TEMPERATURE_C,
            MAX_TEMPERATURE_C,
        )
        room = self.info.memory_total_bytes - self.reserved_bytes
        room -= sum(self.counters.processes.values())
        target_bytes = self._load / 100 * 0.85 * room
        self.workload_bytes = _clamp(
            self.workload_bytes
            + (target_bytes - self.workload_bytes) * 0.3
            + rng.gauss(0, 256 * MIB),
            0,
            max(room, 0),
        )
        self.energy_mj += self.power_mw * STEP_SECONDS
        # NVLink traffic in KiB, roughly in step with load (900 GB/s at full tilt).
        self.nvlink_tx_kib += int(self.utilization / 100 * 400_000_000 * STEP_SECONDS)
        self.nvlink_rx_kib += int(self.utilization / 100 * 380_000_000 * STEP_SECONDS)


def _clamp(value: float, low: float, high: float) -> float:
    return min(max(value, low), high)
