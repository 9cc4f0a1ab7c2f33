"""What a GPU is doing: the values telemetry exports, fast and slow.

`Nvml.metrics()` returns a `DeviceMetrics` built from the hot queries, each 1 to 7 µs on a
real H200 (the recording's `timing_us`), so a collector can take all of them for eight
GPUs every second. `PcieThroughput` and `FieldValue` come from the two slow queries
(`Nvml.pcie_throughput()` about 21 ms, `Nvml.field_values()` about 3.4 ms): telemetry runs
those on their own slower loop, never on the collection path and never per scrape.

A field is `None` when the GPU answers NotSupported: exporters leave such series out rather
than export zeros, as dcgm-exporter does.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ClockEventReason(enum.IntFlag):
    """Why the clocks are below their maximum (`nvmlClocksEventReason*`)."""

    NONE = 0
    GPU_IDLE = 0x1
    APPLICATIONS_CLOCKS_SETTING = 0x2
    SW_POWER_CAP = 0x4
    HW_SLOWDOWN = 0x8
    SYNC_BOOST = 0x10
    SW_THERMAL_SLOWDOWN = 0x20
    HW_THERMAL_SLOWDOWN = 0x40
    HW_POWER_BRAKE_SLOWDOWN = 0x80
    DISPLAY_CLOCK_SETTING = 0x100


class FieldId(enum.IntEnum):
    """`NVML_FI_DEV_*` ids that gpuop asks `field_values()` for."""

    ECC_SBE_VOL_TOTAL = 3
    """Single-bit (corrected) volatile ECC errors."""
    ECC_DBE_VOL_TOTAL = 4
    """Double-bit (uncorrected) volatile ECC errors."""
    RETIRED_SBE = 29
    """Pages retired after single-bit errors (NotSupported on Ampere on: rows are remapped)."""
    RETIRED_DBE = 30
    """Pages retired after double-bit errors."""
    NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL = 38
    """NVLink flow-control CRC errors, all links (the `NVML_FI_DEV_` prefix left out, as for
    every id here)."""
    NVLINK_CRC_DATA_ERROR_COUNT_TOTAL = 45
    """NVLink data CRC errors, all links."""
    NVLINK_REPLAY_ERROR_COUNT_TOTAL = 52
    """NVLink replays (a packet sent again after a CRC error), all links."""
    NVLINK_RECOVERY_ERROR_COUNT_TOTAL = 59
    """NVLink recoveries (a link retrained after too many errors), all links."""
    NVLINK_BANDWIDTH_C0_TOTAL = 66
    """NVLink counter set 0, all lanes (NotSupported on recent drivers)."""
    MEMORY_TEMP = 82
    """HBM temperature in °C (`DCGM_FI_DEV_MEMORY_TEMP`)."""
    TOTAL_ENERGY_CONSUMPTION = 83
    """Energy since the driver loaded, in mJ."""
    PCIE_REPLAY_COUNTER = 94
    """PCIe replays."""
    NVLINK_THROUGHPUT_DATA_TX = 138
    """NVLink data transmitted, KiB, summed over links (`DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL`)."""
    NVLINK_THROUGHPUT_DATA_RX = 139
    """NVLink data received, KiB, summed over links."""
    POWER_INSTANT = 186
    """Instantaneous board power in mW."""


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """One process with a CUDA context on the GPU."""

    pid: int
    """Process id in the host's PID namespace."""
    used_memory_bytes: int | None
    """Framebuffer the process holds; `None` when the driver does not say (no permission)."""
    gpu_instance_id: int | None
    """MIG GPU instance it runs in; `None` outside MIG."""
    compute_instance_id: int | None
    """MIG compute instance it runs in; `None` outside MIG."""


@dataclass(frozen=True, slots=True)
class DeviceMetrics:
    """One reading of a GPU's fast metrics. `None`: the GPU answers NotSupported."""

    index: int
    """NVML index of the GPU."""
    memory_used_bytes: int | None
    """Framebuffer in use. With `memory_reserved_bytes` known this excludes the reserve;
    without it (drivers that only answer the v1 query) the reserve is counted as used."""
    memory_free_bytes: int | None
    """Framebuffer free."""
    memory_reserved_bytes: int | None
    """Framebuffer the driver reserves (`DCGM_FI_DEV_FB_RESERVED`); v2 memory query only."""
    gpu_utilization_percent: int | None
    """Share of the last sample period a kernel was running."""
    memory_utilization_percent: int | None
    """Share of the last sample period device memory was read or written."""
    encoder_utilization_percent: int | None
    """Video encoder utilisation."""
    temperature_celsius: int | None
    """GPU die temperature."""
    fan_speed_percent: int | None
    """Fan speed; `None` on passively cooled boards such as the H200."""
    power_usage_mw: int | None
    """Board power draw in milliwatts."""
    total_energy_mj: int | None
    """Energy used since the driver loaded, in millijoules; only ever increases."""
    sm_clock_mhz: int | None
    """Current SM clock."""
    memory_clock_mhz: int | None
    """Current memory clock."""
    performance_state: int | None
    """P-state: 0 (P0, fastest) to 15; `None` when unknown."""
    clock_event_reasons: ClockEventReason | None
    """Why clocks are held down right now."""
    ecc_volatile_corrected: int | None
    """Corrected ECC errors since the driver loaded."""
    ecc_volatile_uncorrected: int | None
    """Uncorrected ECC errors since the driver loaded."""
    ecc_aggregate_corrected: int | None
    """Corrected ECC errors over the GPU's life."""
    ecc_aggregate_uncorrected: int | None
    """Uncorrected ECC errors over the GPU's life."""
    remapped_rows_correctable: int | None
    """Rows remapped after correctable errors."""
    remapped_rows_uncorrectable: int | None
    """Rows remapped after uncorrectable errors."""
    remapped_rows_pending: bool | None
    """A remap waits for the next GPU reset."""
    remapped_rows_failure: bool | None
    """A remap failed: the GPU should be replaced."""
    retired_pages_pending: bool | None
    """A page retirement waits for the next reset (pre-Ampere; NotSupported on Hopper)."""
    pcie_replay_count: int | None
    """PCIe replays (link-level retries) since the driver loaded."""
    processes: tuple[ProcessInfo, ...]
    """Processes with a compute context on the GPU (empty when none or not reported)."""
    pcie_link_generation: int | None = None
    """PCIe generation the link runs at now (`nvmlDeviceGetCurrPcieLinkGeneration`)."""
    pcie_link_width: int | None = None
    """PCIe lanes the link runs with now (`nvmlDeviceGetCurrPcieLinkWidth`)."""
    pcie_max_link_generation: int | None = None
    """The highest generation the GPU and the slot both allow
    (`nvmlDeviceGetMaxPcieLinkGeneration`)."""
    pcie_max_link_width: int | None = None
    """The most lanes the link can have (`nvmlDeviceGetMaxPcieLinkWidth`)."""


@dataclass(frozen=True, slots=True)
class PcieThroughput:
    """PCIe traffic over NVML's 20 ms sampling window. A slow query: about 21 ms."""

    index: int
    """NVML index of the GPU."""
    tx_kilobytes_per_second: int | None
    """Transmitted, headers included, in KB/s as NVML reports it."""
    rx_kilobytes_per_second: int | None
    """Received, headers included, in KB/s."""


@dataclass(frozen=True, slots=True)
class FieldValue:
    """One answer of a batched field query. A slow query: about 3.4 ms for 7 fields."""

    field_id: int
    """The `NVML_FI_DEV_*` id asked for (see `FieldId`)."""
    return_code: int
    """NVML's return code for this field: 0 on success, 3 when NotSupported."""
    value: int | float | None
    """The value, in the field's own unit; `None` when `return_code` is not 0."""
