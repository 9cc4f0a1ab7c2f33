"""`RecordedNvml`: the `Nvml` protocol answering from a recorded `nvml.json`.

`--nvml recorded:<file>` runs a service against what a real node answered, with no GPU: the
H200 recording (`gpuop_sim.recordings`, `h200/nvml.json`) is one NVIDIA H200 on driver
580.159.04 (decoded by `recordings.py`, which says how unrecorded values read). The readings
never move, no event ever arrives (a wait times out, as the recorded one did), and there is
no NVLink or MIG. The recording holds no GPM sample: `activity()` answers what the
recorded readings imply for the idle H200 (no SM or tensor activity at 0% utilisation, the
DRAM ratio from the memory utilisation, the PCIe rates from the throughput query).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gpuop.nvml.devices import DeviceInfo
from gpuop.nvml.errors import ERROR_NOT_SUPPORTED, InvalidArgument, NotInitialized
from gpuop.nvml.metrics import DeviceMetrics, FieldValue, PcieThroughput
from gpuop.nvml.mig import MigDevice, MigProfile
from gpuop.nvml.profiling import Activity
from gpuop.nvml.recordings import RecordedDevice, Recording, load_recording
from gpuop.nvml.topology import NvLink, PcieLevel, PeerTopology
from gpuop.nvml.watching import EventWatcher, QueueWatcher, WatcherSet


class RecordedNvml:
    """Answers NVML queries from a recording: static values, no events, no MIG, no NVLink."""

    def __init__(self, path: Path) -> None:
        self.recording = load_recording(path)
        self._open = False
        self._watchers: WatcherSet[QueueWatcher] = WatcherSet()
        self._sampled: set[int] = set()

    def init(self) -> None:
        self._open = True

    def shutdown(self) -> None:
        self._watchers.close_all()
        self._sampled.clear()
        self._open = False

    def driver_version(self) -> str:
        return self._session().driver_version

    def cuda_driver_version(self) -> str:
        return self._session().cuda_driver_version

    def nvml_version(self) -> str:
        return self._session().nvml_version

    def device_count(self) -> int:
        return len(self._session().devices)

    def device_info(self, index: int) -> DeviceInfo:
        return self._device(index).info

    def metrics(self, index: int) -> DeviceMetrics:
        return self._device(index).metrics

    def pcie_throughput(self, index: int) -> PcieThroughput:
        return self._device(index).pcie

    def field_values(self, index: int, field_ids: Sequence[int]) -> tuple[FieldValue, ...]:
        recorded = {value.field_id: value for value in self._device(index).field_values}
        missing = ERROR_NOT_SUPPORTED
        return tuple(recorded.get(f, FieldValue(int(f), missing, None)) for f in field_ids)

    def activity(self, index: int, gpu_instance_id: int | None = None) -> Activity:
        device = self._device(index)
        if gpu_instance_id is not None:
            raise InvalidArgument(f"GPU {index} has no MIG GPU instance {gpu_instance_id}")
        if index not in self._sampled:
            self._sampled.add(index)  # GPM's first sample: no interval yet
            return Activity(index, None)
        return recorded_activity(device.metrics, device.pcie)

    def nvlinks(self, index: int) -> tuple[NvLink, ...]:
        self._device(index)
        return ()

    def topology(self, index: int, peer: int) -> PeerTopology:
        self._device(index)
        self._device(peer)
        if index == peer:
            return PeerTopology(index, peer, PcieLevel.INTERNAL, nvlink=False)
        return PeerTopology(index, peer, None, nvlink=False)

    def mig_profiles(self, index: int) -> tuple[MigProfile, ...]:
        self._device(index)
        return ()

    def mig_devices(self, index: int) -> tuple[MigDevice, ...]:
        self._device(index)
        return ()

    def watch_events(self, indices: Sequence[int] | None = None) -> EventWatcher:
        count = self.device_count()
        chosen = range(count) if indices is None else indices
        for index in chosen:
            self._device(index)
        return self._watchers.add(QueueWatcher(chosen, on_close=self._watchers.discard))

    def _session(self) -> Recording:
        if not self._open:
            raise NotInitialized("the NVML session is not open: call init() first")
        return self.recording

    def _device(self, index: int) -> RecordedDevice:
        devices = self._session().devices
        if not 0 <= index < len(devices):
            raise InvalidArgument(f"no GPU at index {index}: the recording has {len(devices)}")
        return devices[index]


def recorded_activity(metrics: DeviceMetrics, pcie: PcieThroughput) -> Activity:
    """What a recorded GPU's readings say of its GPM activity (see the module docstring)."""
    idle = metrics.gpu_utilization_percent == 0
    memory = metrics.memory_utilization_percent
    tx, rx = pcie.tx_kilobytes_per_second, pcie.rx_kilobytes_per_second
    return Activity(
        index=metrics.index,
        gpu_instance_id=None,
        sm_active=0.0 if idle else None,
        sm_occupancy=0.0 if idle else None,
        tensor_active=0.0 if idle else None,
        dram_active=None if memory is None else memory / 100,
        pcie_tx_bytes_per_second=None if tx is None else tx * 1024.0,
        pcie_rx_bytes_per_second=None if rx is None else rx * 1024.0,
    )
