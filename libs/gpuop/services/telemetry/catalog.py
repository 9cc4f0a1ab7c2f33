"""The GPU metrics telemetry exports: dcgm-exporter's names, types, help and labels, each
with the NVML answer it comes from (dcgm-exporter's default metric set and labels, its
profiling set, and the NVLink, retired-page and row-remap counters it offers).

`exposition` renders a `Reading` of every GPU, and of every MIG GPU instance, with this
table once per collection. A metric whose source the GPU answers NotSupported is left out
for that GPU, never exported as zero. The `DCGM_FI_PROF_*` activity fields come from NVML's
GPM (`nvml.profiling`, Hopper on) and are absent on GPUs without it, as dcgm-exporter leaves
them out where profiling is unavailable; the PCIe rates then come from NVML's blocking
throughput query, which the slow loop runs. A MIG GPU instance's series carry
dcgm-exporter's `GPU_I_PROFILE` and `GPU_I_ID` labels and what GPM measures of it alone.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpuop.nvml import DeviceMetrics, FieldId, PcieThroughput
from gpuop.nvml.devices import MIB
from gpuop.nvml.profiling import Activity

GPU_LABELS = (
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "GPU_I_PROFILE",
    "GPU_I_ID",
    "Hostname",
    "DCGM_FI_DRIVER_VERSION",
)
"""Labels of every GPU series, in dcgm-exporter's order; `GPU_I_*` on a MIG GPU instance's
series only."""
INSTANCE_LABELS = ("GPU_I_PROFILE", "GPU_I_ID")
POD_LABELS = ("pod", "namespace", "container")
"""Labels of a GPU's series while one container holds it."""
POD_UID = "pod_uid"
"""The holding pod's uid: off by default, as in dcgm-exporter (`--kubernetes-enable-pod-uid`)."""
LABELS = GPU_LABELS + POD_LABELS
"""The labels series carry by default."""
KNOWN_LABELS = (*LABELS, POD_UID)
"""Every label a configuration may name."""
KIB = 1024
"""NVML's PCIe throughput and NVLink counters count in KiB."""


class Kind(enum.StrEnum):
    """Prometheus metric type, as dcgm-exporter declares it."""

    GAUGE = "gauge"
    COUNTER = "counter"


@dataclass(frozen=True, slots=True)
class Reading:
    """What telemetry knows of one GPU at one collection."""

    fast: DeviceMetrics | None
    """The fast queries; None when they failed this time."""
    pcie: PcieThroughput | None = None
    """The slow loop's last PCIe rates; None before it ran or when it failed."""
    fields: Mapping[int, int | float] = field(default_factory=dict)
    """The slow loop's last field values that NVML answered, by `FieldId`."""
    last_xid: int | None = None
    """The last XID since telemetry started watching (0: none yet); None when not watching."""
    activity: Activity | None = None
    """The slow loop's last GPM answer; None before it ran or where the GPU has no GPM."""


Value = int | float | None


@dataclass(frozen=True, slots=True)
class Metric:
    """One exported metric family."""

    name: str
    kind: Kind
    help: str
    read: Callable[[Reading], Value]
    """Its value for one GPU; None leaves the GPU's series out."""


def _fast(read: Callable[[DeviceMetrics], Value]) -> Callable[[Reading], Value]:
    return lambda reading: None if reading.fast is None else read(reading.fast)


def _mib(value: int | None) -> int | None:
    return None if value is None else value // MIB


def _watts(milliwatts: int | float | None) -> float | None:
    return None if milliwatts is None else milliwatts / 1000


def _flag(value: bool | None) -> int | None:
    return None if value is None else int(value)


def _field(field_id: int) -> Callable[[Reading], Value]:
    return lambda reading: reading.fields.get(field_id)


def _nvlink_total(reading: Reading) -> Value:
    tx = reading.fields.get(FieldId.NVLINK_THROUGHPUT_DATA_TX)
    rx = reading.fields.get(FieldId.NVLINK_THROUGHPUT_DATA_RX)
    return None if tx is None or rx is None else tx + rx


def _activity(attribute: str) -> Callable[[Reading], Value]:
    def read(reading: Reading) -> Value:
        value: Value = None if reading.activity is None else getattr(reading.activity, attribute)
        return value

    return read


def _pcie(direction: str) -> Callable[[Reading], Value]:
    def read(reading: Reading) -> Value:
        if reading.activity is not None:  # GPM's rate, where the GPU has GPM
            rate = _activity(f"pcie_{direction}_bytes_per_second")(reading)
            if rate is not None:
                return rate
        pcie = reading.pcie
        kib = None if pcie is None else getattr(pcie, f"{direction}_kilobytes_per_second")
        return None if kib is None else kib * KIB

    return read


G, C = Kind.GAUGE, Kind.COUNTER

ERROR_COUNTERS = {
    FieldId.RETIRED_SBE: "Total number of retired pages due to single-bit errors.",
    FieldId.RETIRED_DBE: "Total number of retired pages due to double-bit errors.",
    FieldId.NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: ("Total number of NVLink flow-control CRC errors."),
    FieldId.NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: "Total number of NVLink data CRC errors.",
    FieldId.NVLINK_REPLAY_ERROR_COUNT_TOTAL: "Total number of NVLink retries.",
    FieldId.NVLINK_RECOVERY_ERROR_COUNT_TOTAL: "Total number of NVLink recovery errors.",
}
"""The field-value error counters, each exported as `DCGM_FI_DEV_<its name>`, with its help."""
ACTIVITY = (
    (
        "DCGM_FI_PROF_SM_ACTIVE",
        "sm_active",
        "The ratio of cycles an SM has at least 1 warp assigned.",
    ),
    (
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "sm_occupancy",
        "The ratio of number of warps resident on an SM.",
    ),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "tensor_active",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
    ),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "dram_active",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
    ),
    (
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "nvlink_tx_bytes_per_second",
        "The rate of data transmitted over NVLink, headers included (bytes/s).",
    ),
    (
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "nvlink_rx_bytes_per_second",
        "The rate of data received over NVLink, headers included (bytes/s).",
    ),
)
"""The GPM families but PCIe's: name, `Activity` attribute, help."""

METRICS: tuple[Metric, ...] = (
    Metric("DCGM_FI_DEV_SM_CLOCK", G, "SM clock frequency (in MHz).",
           _fast(lambda m: m.sm_clock_mhz)),
    Metric("DCGM_FI_DEV_MEM_CLOCK", G, "Memory clock frequency (in MHz).",
           _fast(lambda m: m.memory_clock_mhz)),
    Metric("DCGM_FI_DEV_MEMORY_TEMP", G, "Memory temperature (in C).",
           _field(FieldId.MEMORY_TEMP)),
    Metric("DCGM_FI_DEV_GPU_TEMP", G, "GPU temperature (in C).",
           _fast(lambda m: m.temperature_celsius)),
    Metric("DCGM_FI_DEV_POWER_USAGE", G, "Power draw (in W).",
           _fast(lambda m: _watts(m.power_usage_mw))),
    Metric("DCGM_FI_DEV_POWER_USAGE_INSTANT", G, "Current instantaneous power usage (in W).",
           lambda r: _watts(r.fields.get(FieldId.POWER_INSTANT))),
    Metric("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", C,
           "Total energy consumption since boot (in mJ).",
           _fast(lambda m: m.total_energy_mj)),
    Metric("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", C, "Total number of PCIe retries.",
           _fast(lambda m: m.pcie_replay_count)),
    Metric("DCGM_FI_DEV_GPU_UTIL", G, "GPU utilization (in %).",
           _fast(lambda m: m.gpu_utilization_percent)),
    Metric("DCGM_FI_DEV_MEM_COPY_UTIL", G, "Memory utilization (in %).",
           _fast(lambda m: m.memory_utilization_percent)),
    Metric("DCGM_FI_DEV_ENC_UTIL", G, "Encoder utilization (in %).",
           _fast(lambda m: m.encoder_utilization_percent)),
    Metric("DCGM_FI_DEV_XID_ERRORS", G, "Value of the last XID error encountered.",
           lambda r: r.last_xid),
    Metric("DCGM_FI_DEV_FB_FREE", G, "Framebuffer memory free (in MiB).",
           _fast(lambda m: _mib(m.memory_free_bytes))),
    Metric("DCGM_FI_DEV_FB_USED", G, "Framebuffer memory used (in MiB).",
           _fast(lambda m: _mib(m.memory_used_bytes))),
    Metric("DCGM_FI_DEV_FB_RESERVED", G, "Framebuffer memory reserved (in MiB).",
           _fast(lambda m: _mib(m.memory_reserved_bytes))),
    Metric("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", C,
           "Total number of NVLink bandwidth counters for all lanes.",
           _nvlink_total),
    Metric("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", C,
           "Number of remapped rows for uncorrectable errors.",
           _fast(lambda m: m.remapped_rows_uncorrectable)),
    Metric("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", C,
           "Number of remapped rows for correctable errors.",
           _fast(lambda m: m.remapped_rows_correctable)),
    Metric("DCGM_FI_DEV_ROW_REMAP_FAILURE", G, "Whether remapping of rows has failed.",
           _fast(lambda m: _flag(m.remapped_rows_failure))),
    Metric("DCGM_FI_DEV_ROW_REMAP_PENDING", G, "Whether remapping of rows is pending.",
           _fast(lambda m: _flag(m.remapped_rows_pending))),
    Metric("DCGM_FI_DEV_RETIRED_PENDING", C, "Total number of pages pending retirement.",
           _fast(lambda m: _flag(m.retired_pages_pending))),
    Metric("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", C, "Total number of single-bit volatile ECC errors.",
           _fast(lambda m: m.ecc_volatile_corrected)),
    Metric("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", C, "Total number of double-bit volatile ECC errors.",
           _fast(lambda m: m.ecc_volatile_uncorrected)),
    Metric("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", C,
           "Total number of single-bit persistent ECC errors.",
           _fast(lambda m: m.ecc_aggregate_corrected)),
    Metric("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", C,
           "Total number of double-bit persistent ECC errors.",
           _fast(lambda m: m.ecc_aggregate_uncorrected)),
    Metric("DCGM_FI_DEV_FAN_SPEED", G, "Fan speed (in %).",
           _fast(lambda m: m.fan_speed_percent)),
    Metric("DCGM_FI_DEV_PSTATE", G, "Performance state (P-State) 0-15; 0 is the fastest.",
           _fast(lambda m: m.performance_state)),
    Metric("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", G,
           "Current clock event (throttle) reasons, NVML's bit mask.",
           _fast(lambda m: None if m.clock_event_reasons is None else int(m.clock_event_reasons))),
    Metric("DCGM_FI_PROF_PCIE_TX_BYTES", G,
           "The rate of data transmitted over the PCIe bus, headers included (bytes/s).",
           _pcie("tx")),
    Metric("DCGM_FI_PROF_PCIE_RX_BYTES", G,
           "The rate of data received over the PCIe bus, headers included (bytes/s).",
           _pcie("rx")),
    *(Metric(f"DCGM_FI_DEV_{counter.name}", C, text, _field(counter))
      for counter, text in ERROR_COUNTERS.items()),
    *(Metric(name, G, text, _activity(attribute)) for name, attribute, text in ACTIVITY),
)  # fmt: skip
"""Every per-GPU metric, in the order rendered."""

XID_COUNT = Metric(
    "DCGM_EXP_XID_ERRORS_COUNT",
    G,
    "Count of XID errors within the last 5 minutes, by XID.",
    lambda r: None,  # rendered from the XID history, one series per XID seen
)
POD_INFO = Metric(
    "gpuop_telemetry_gpu_pod_info",
    G,
    "1 for each container the kubelet gave the GPU (several when time-sliced).",
    lambda r: None,  # rendered from the pod attribution, one series per container
)
NAMES = frozenset(m.name for m in (*METRICS, XID_COUNT, POD_INFO))
"""Every name `TelemetryConfig.metrics` may list."""
SLOW_FIELDS = (
    FieldId.MEMORY_TEMP,
    FieldId.POWER_INSTANT,
    FieldId.NVLINK_THROUGHPUT_DATA_TX,
    FieldId.NVLINK_THROUGHPUT_DATA_RX,
    *ERROR_COUNTERS,
)
"""What the slow loop asks `field_values()` for: what no fast query answers."""
