"""GPM activity on every backend: nothing on a session's first sample, then GPM's percent and
MiB/s in dcgm-exporter's ratios and bytes per second; NotSupported before Hopper; a sample
per MIG GPU instance; every sample freed when the session closes."""

from __future__ import annotations

from typing import Any

import pynvml as real
import pytest

from gpuop.nvml import errors
from gpuop.nvml.profiling import MIB, Activity, GpmMetric
from gpuop.nvml.protocol import opened
from gpuop.nvml.real import PynvmlBackend
from gpuop.nvml.recorded import RecordedNvml
from gpuop_sim.nvml.simulated import SimNvml
from tests.support.fake_pynvml import FakePynvml, Handle

from .conftest import NVML_JSON

GPM_ANSWERS = {
    GpmMetric.SM_UTIL: 50.0,
    GpmMetric.SM_OCCUPANCY: 25.0,
    GpmMetric.ANY_TENSOR_UTIL: 10.0,
    GpmMetric.DRAM_BW_UTIL: 80.0,
    GpmMetric.PCIE_TX_PER_SEC: 2.0,
    GpmMetric.PCIE_RX_PER_SEC: 3.0,
    GpmMetric.NVLINK_TOTAL_TX_PER_SEC: 100.0,
}
"""What the fake GPM answers; NVLink RX answers NotSupported."""


class FakeGpm:
    """GPM functions on a `FakePynvml`, counting samples taken and freed."""

    def __init__(self, fake: FakePynvml, supported: bool = True) -> None:
        self.allocated = 0
        self.freed = 0
        self.mig_samples: list[int] = []
        fake.define("nvmlGpmQueryDeviceSupport", lambda h: self._support(supported))
        fake.define("nvmlGpmSampleAlloc", self._alloc)
        fake.define("nvmlGpmSampleFree", self._free)
        fake.define("nvmlGpmSampleGet", lambda h, sample: sample)
        fake.define("nvmlGpmMigSampleGet", self._mig_sample)
        fake.define("nvmlGpmMetricsGet", self._metrics)

    def _support(self, supported: bool) -> Any:
        support = real.c_nvmlGpmSupport_t()
        support.isSupportedDevice = int(supported)
        return support

    def _alloc(self) -> Any:
        self.allocated += 1
        return real.c_nvmlGpmSample_t()

    def _free(self, sample: Any) -> None:
        self.freed += 1

    def _mig_sample(self, handle: Handle, gpu_instance_id: int, sample: Any) -> Any:
        self.mig_samples.append(gpu_instance_id)
        return sample

    def _metrics(self, request: Any) -> Any:
        for slot in range(request.numMetrics):
            metric = request.metrics[slot]
            answer = GPM_ANSWERS.get(GpmMetric(metric.metricId))
            metric.nvmlReturn = real.NVML_ERROR_NOT_SUPPORTED if answer is None else 0
            metric.value = answer or 0.0
        return request


def test_the_real_backend_reads_gpm_in_dcgm_units_from_the_second_sample() -> None:
    fake = FakePynvml(NVML_JSON)
    gpm = FakeGpm(fake)
    with opened(PynvmlBackend(fake.module)) as nvml:
        first = nvml.activity(0)
        second = nvml.activity(0)

    assert first == Activity(0, None)
    assert second == Activity(
        index=0,
        gpu_instance_id=None,
        sm_active=0.5,
        sm_occupancy=0.25,
        tensor_active=0.1,
        dram_active=0.8,
        pcie_tx_bytes_per_second=2.0 * MIB,
        pcie_rx_bytes_per_second=3.0 * MIB,
        nvlink_tx_bytes_per_second=100.0 * MIB,
        nvlink_rx_bytes_per_second=None,
    )
    assert gpm.allocated == gpm.freed == 2  # the kept sample is freed at shutdown


def test_the_real_backend_samples_a_mig_gpu_instance_apart_from_its_gpu() -> None:
    fake = FakePynvml(NVML_JSON)
    gpm = FakeGpm(fake)
    with opened(PynvmlBackend(fake.module)) as nvml:
        nvml.activity(0)
        assert nvml.activity(0, 5) == Activity(0, 5)  # its own first sample
        assert nvml.activity(0, 5).sm_active == 0.5

    assert gpm.mig_samples == [5, 5]
    assert gpm.allocated == gpm.freed == 3


def test_the_real_backend_without_gpm_answers_not_supported_and_asks_support_once() -> None:
    fake = FakePynvml(NVML_JSON)
    gpm = FakeGpm(fake, supported=False)
    with opened(PynvmlBackend(fake.module)) as nvml:
        for _ in range(3):
            with pytest.raises(errors.NotSupported):
                nvml.activity(0)

    assert fake.calls.count("nvmlGpmQueryDeviceSupport") == 1
    assert gpm.allocated == 0


def test_a_failed_sample_is_freed_and_raised() -> None:
    fake = FakePynvml(NVML_JSON)
    gpm = FakeGpm(fake)
    fake.fail("nvmlGpmSampleGet", real.NVML_ERROR_GPU_IS_LOST)
    with opened(PynvmlBackend(fake.module)) as nvml, pytest.raises(errors.GpuLost):
        nvml.activity(0)

    assert gpm.allocated == gpm.freed == 1


def test_the_recorded_h200_reads_idle_from_its_second_sample() -> None:
    with opened(RecordedNvml(NVML_JSON)) as nvml:
        first = nvml.activity(0)
        second = nvml.activity(0)
        with pytest.raises(errors.InvalidArgument):
            nvml.activity(0, 1)  # the recording has no MIG

    assert first == Activity(0, None)
    assert (second.sm_active, second.tensor_active, second.dram_active) == (0.0, 0.0, 0.0)
    assert second.pcie_tx_bytes_per_second == 1540 * 1024  # the recorded PCIe TX, KB/s
    assert second.pcie_rx_bytes_per_second is None  # not recorded
    assert second.nvlink_tx_bytes_per_second is None  # no NVLink recorded


def test_the_sim_splits_a_gpus_rates_over_its_gpu_instances_by_slices() -> None:
    sim = SimNvml(8)
    sim.enable_mig(0, ["3g.71gb", "1g.18gb"])
    with opened(sim):
        devices = {d.profile: d.gpu_instance_id for d in sim.mig_devices(0)}
        for key in (None, devices["3g.71gb"], devices["1g.18gb"]):
            assert sim.activity(0, key) == Activity(0, key)
        whole = sim.activity(0)
        big, small = sim.activity(0, devices["3g.71gb"]), sim.activity(0, devices["1g.18gb"])
        with pytest.raises(errors.NotFound):
            sim.activity(0, 99)
        assert sim.activity(0) != Activity(0, None)
    with opened(sim):
        assert sim.activity(0) == Activity(0, None)  # a new session samples anew

    assert whole.pcie_tx_bytes_per_second is not None
    assert big.pcie_tx_bytes_per_second == pytest.approx(whole.pcie_tx_bytes_per_second * 3 / 7)
    assert small.pcie_tx_bytes_per_second == pytest.approx(whole.pcie_tx_bytes_per_second / 7)
    assert whole.nvlink_tx_bytes_per_second is not None  # eight H200s have NVLink
