"""What the GPU's units were busy with: NVML's GPU Performance Monitoring (GPM), Hopper on.

`Nvml.activity()` returns an `Activity` of one GPU, or of one MIG GPU instance, over the
time since the previous call for the same one in the session: GPM compares two samples of
the GPU's counters, so the first call of a session (or after a GPU instance appeared) has
no interval and every value is None. GPUs before Hopper answer NotSupported, as NVML does
(`nvmlGpmQueryDeviceSupport`); telemetry then keeps its PCIe rates from the blocking
throughput query and exports no other profiling metric for that GPU.

The values are in dcgm-exporter's units: ratios 0 to 1 for the `DCGM_FI_PROF_*` activity
fields (GPM reports percent) and bytes per second for the PCIe and NVLink rates (GPM
reports MiB/s). The NVLink error and retired-page counters telemetry exports are field
values (`gpuop.nvml.metrics.FieldId`), read by the batched field query.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

MIB = 1024 * 1024


class GpmMetric(enum.IntEnum):
    """`NVML_GPM_METRIC_*` ids `activity()` asks for."""

    SM_UTIL = 2
    """Percent of SMs with at least one warp (`DCGM_FI_PROF_SM_ACTIVE`)."""
    SM_OCCUPANCY = 3
    """Percent of the SMs' warp slots in use (`DCGM_FI_PROF_SM_OCCUPANCY`)."""
    ANY_TENSOR_UTIL = 5
    """Percent of cycles any tensor pipe was active (`DCGM_FI_PROF_PIPE_TENSOR_ACTIVE`)."""
    DRAM_BW_UTIL = 10
    """Percent of the memory bandwidth in use (`DCGM_FI_PROF_DRAM_ACTIVE`)."""
    PCIE_TX_PER_SEC = 20
    """PCIe traffic from the GPU, MiB/s."""
    PCIE_RX_PER_SEC = 21
    """PCIe traffic to the GPU, MiB/s."""
    NVLINK_TOTAL_RX_PER_SEC = 60
    """NVLink traffic received over all links, MiB/s."""
    NVLINK_TOTAL_TX_PER_SEC = 61
    """NVLink traffic sent over all links, MiB/s."""


@dataclass(frozen=True, slots=True)
class Activity:
    """GPM's answers for one GPU or GPU instance over one interval; None: not measured
    (no interval yet, or this metric NotSupported on the GPU)."""

    index: int
    """NVML index of the GPU."""
    gpu_instance_id: int | None
    """The MIG GPU instance measured; None for the whole GPU."""
    sm_active: float | None = None
    """Ratio of cycles an SM had at least one warp assigned."""
    sm_occupancy: float | None = None
    """Ratio of warps resident on the SMs to their maximum."""
    tensor_active: float | None = None
    """Ratio of cycles a tensor pipe was active."""
    dram_active: float | None = None
    """Ratio of cycles the memory interface was sending or receiving."""
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    nvlink_tx_bytes_per_second: float | None = None
    nvlink_rx_bytes_per_second: float | None = None


RATIOS = {
    "sm_active": GpmMetric.SM_UTIL,
    "sm_occupancy": GpmMetric.SM_OCCUPANCY,
    "tensor_active": GpmMetric.ANY_TENSOR_UTIL,
    "dram_active": GpmMetric.DRAM_BW_UTIL,
}
"""`Activity` ratios and the GPM percentages they come from."""
RATES = {
    "pcie_tx_bytes_per_second": GpmMetric.PCIE_TX_PER_SEC,
    "pcie_rx_bytes_per_second": GpmMetric.PCIE_RX_PER_SEC,
    "nvlink_tx_bytes_per_second": GpmMetric.NVLINK_TOTAL_TX_PER_SEC,
    "nvlink_rx_bytes_per_second": GpmMetric.NVLINK_TOTAL_RX_PER_SEC,
}
"""`Activity` rates and the GPM MiB/s they come from."""


def from_gpm(index: int, gpu_instance_id: int | None, values: dict[int, float]) -> Activity:
    """An `Activity` from GPM's values by `GpmMetric` (percent and MiB/s), missing ones None."""
    measured: dict[str, float | None] = {
        attribute: None if metric not in values else values[metric] / 100
        for attribute, metric in RATIOS.items()
    }
    measured |= {
        attribute: None if metric not in values else values[metric] * MIB
        for attribute, metric in RATES.items()
    }
    return Activity(index, gpu_instance_id, **measured)
