"""The slow queries of a simulated GPU: batched field values, PCIe throughput, GPM activity.

`SimNvml.field_values()` answers the `FieldId`s telemetry asks for from the GPU's moving
state and counters, and NotSupported (return code 3) for the rest, as the recorded H200
does for `NVLINK_BANDWIDTH_C0_TOTAL`. PCIe throughput rises from the recorded idle traffic
with utilisation. GPM activity (`activity()`) follows utilisation too: a whole GPU's, or a
MIG GPU instance's share of it by its slices. The NVLink error totals telemetry exports
(`FieldId`) read what was put on the GPU (0 until then) where it has NVLink,
NotSupported for retired pages (the H200 remaps rows instead). None draws random numbers,
so reading them never changes the walk.
"""

from __future__ import annotations

from gpuop.nvml.errors import ERROR_NOT_SUPPORTED, SUCCESS
from gpuop.nvml.metrics import FieldId, FieldValue, PcieThroughput
from gpuop.nvml.profiling import Activity
from gpuop_sim.nvml.sim_gpus import SimGpu

IDLE_PCIE_TX_KBPS = 1540
"""The recorded H200's PCIe transmit rate at idle, KB/s."""
IDLE_PCIE_RX_KBPS = 605
"""The recorded H200's PCIe receive rate at idle (nvidia-smi-q.xml), KB/s."""
NVLINK_ERROR_FIELDS = (
    FieldId.NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
    FieldId.NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
    FieldId.NVLINK_REPLAY_ERROR_COUNT_TOTAL,
    FieldId.NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
)
"""The NVLink error totals a GPU with NVLink answers (0 until errors are put on it)."""
HBM_ABOVE_DIE_C = 2
"""How much warmer HBM runs than the die (36 vs 34 °C on the recorded H200)."""


def field_value(gpu: SimGpu, field_id: int, *, nvlink: bool) -> FieldValue:
    """One field of the GPU now."""
    c = gpu.counters
    values: dict[int, int] = {
        FieldId.ECC_SBE_VOL_TOTAL: c.volatile_corrected,
        FieldId.ECC_DBE_VOL_TOTAL: c.volatile_uncorrected,
        FieldId.MEMORY_TEMP: round(gpu.temperature) + HBM_ABOVE_DIE_C,
        FieldId.TOTAL_ENERGY_CONSUMPTION: int(gpu.energy_mj),
        FieldId.PCIE_REPLAY_COUNTER: c.pcie_replays,
        FieldId.POWER_INSTANT: round(gpu.power_mw),
    }
    if nvlink:
        values[FieldId.NVLINK_THROUGHPUT_DATA_TX] = gpu.nvlink_tx_kib
        values[FieldId.NVLINK_THROUGHPUT_DATA_RX] = gpu.nvlink_rx_kib
        for counter in NVLINK_ERROR_FIELDS:
            values[counter] = c.nvlink_errors.get(counter, 0)
    if field_id not in values:
        return FieldValue(field_id, ERROR_NOT_SUPPORTED, None)
    return FieldValue(field_id, SUCCESS, values[field_id])


def pcie_throughput(gpu: SimGpu) -> PcieThroughput:
    """PCIe traffic of the GPU now, KB/s."""
    load = gpu.utilization / 100
    return PcieThroughput(
        index=gpu.info.index,
        tx_kilobytes_per_second=IDLE_PCIE_TX_KBPS + round(load * 8_000_000),
        rx_kilobytes_per_second=IDLE_PCIE_RX_KBPS + round(load * 12_000_000),
    )


def activity(
    gpu: SimGpu, gpu_instance_id: int | None = None, share: float = 1.0, *, nvlink: bool
) -> Activity:
    """GPM activity of the GPU now, or of one GPU instance holding `share` of its slices."""
    load = gpu.utilization / 100
    pcie = pcie_throughput(gpu)
    tx = pcie.tx_kilobytes_per_second or 0
    rx = pcie.rx_kilobytes_per_second or 0
    return Activity(
        index=gpu.info.index,
        gpu_instance_id=gpu_instance_id,
        sm_active=round(load, 4),
        sm_occupancy=round(load * 0.6, 4),
        tensor_active=round(load * 0.4, 4),
        dram_active=round(gpu.memory_utilization / 100, 4),
        pcie_tx_bytes_per_second=tx * 1024.0 * share,
        pcie_rx_bytes_per_second=rx * 1024.0 * share,
        nvlink_tx_bytes_per_second=round(load * 200e9 * share) if nvlink else None,
        nvlink_rx_bytes_per_second=round(load * 200e9 * share) if nvlink else None,
    )
