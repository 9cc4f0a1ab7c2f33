"""Profiling, MIG instances and error counters on the node exporter: dcgm-exporter's
`DCGM_FI_PROF_*` families from NVML's GPM once two samples span an interval, one series per
MIG GPU instance with `GPU_I_PROFILE` and `GPU_I_ID`, the NVLink error counters where the GPU
has NVLink, and none of it where NVML answers NotSupported; scrapes still never call NVML."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from gpuop.nvml import NotSupported, NvmlError, opened
from gpuop.services.telemetry import catalog
from gpuop.services.telemetry.node_exporter import NodeExporter
from gpuop.services.telemetry.pods import DeviceAssignment, InMemoryPodResources, Owner
from gpuop_sim.nvml.simulated import SimNvml
from tests.support.telemetry import (
    NVLINK_ERRORS,
    PROFILING,
    CountingNvml,
    by_gpu,
    scraping,
    series,
)

Exporters = Callable[..., NodeExporter]


async def collected(exporter: NodeExporter, slow_rounds: int = 2) -> bytes:
    for _ in range(slow_rounds):
        await exporter.collector.collect_slow()
    await exporter.collect()
    return exporter.exposition()


async def test_profiling_needs_two_gpm_samples_then_reads_ratios(
    make_exporter: Exporters, sim: SimNvml
) -> None:
    exporter = make_exporter()
    first = await collected(exporter, slow_rounds=1)
    sim.start_process(2, pid=4242, used_memory_bytes=1 << 30)  # some load on GPU 2
    second = await collected(exporter, slow_rounds=1)
    await exporter.session.close()

    for name in PROFILING:
        assert by_gpu(first, name) == {}, name  # one sample spans no interval yet
        assert len(by_gpu(second, name)) == 8, name
    for name in ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE"):
        assert all(0.0 <= value <= 1.0 for value in by_gpu(second, name).values())
    assert "# TYPE DCGM_FI_PROF_SM_ACTIVE gauge\n" in second.decode()


async def test_pcie_rates_come_from_gpm_and_from_the_throughput_query_without_it(
    make_exporter: Exporters, nvml: CountingNvml, sim: SimNvml
) -> None:
    exporter = make_exporter()
    with_gpm = await collected(exporter)
    pcie = sim.pcie_throughput(0).tx_kilobytes_per_second
    await exporter.session.close()
    nvml.fail("activity", NotSupported("no GPM before Hopper"))
    without = await collected(exporter)
    asked = nvml.calls["activity"]
    again = await collected(exporter)
    await exporter.session.close()

    assert pcie is not None
    assert by_gpu(with_gpm, "DCGM_FI_PROF_PCIE_TX_BYTES")["0"] == pytest.approx(pcie * 1024)
    assert by_gpu(without, "DCGM_FI_PROF_PCIE_TX_BYTES")["0"] == pcie * 1024
    for name in PROFILING:
        assert by_gpu(without, name) == {}, name
    assert nvml.calls["activity"] == asked  # a GPU without GPM is not asked again
    assert by_gpu(again, "DCGM_FI_DEV_GPU_TEMP") == by_gpu(without, "DCGM_FI_DEV_GPU_TEMP")


async def test_a_gpm_failure_leaves_the_gpu_out_this_round_only(
    make_exporter: Exporters, nvml: CountingNvml
) -> None:
    exporter = make_exporter()
    await collected(exporter, slow_rounds=1)
    nvml.fail("activity", NvmlError("GPM sample failed"), index=3)
    failed = await collected(exporter, slow_rounds=1)
    nvml.heal()
    healed = await collected(exporter, slow_rounds=1)
    await exporter.session.close()

    assert "3" not in by_gpu(failed, "DCGM_FI_PROF_SM_ACTIVE")
    assert len(by_gpu(failed, "DCGM_FI_PROF_SM_ACTIVE")) == 7
    assert "3" in by_gpu(healed, "DCGM_FI_PROF_SM_ACTIVE")
    assert exporter.metrics.nvml_errors.labels(query="gpm")._value.get() == 1


async def test_each_mig_gpu_instance_has_its_series_with_dcgm_exporters_labels(
    make_exporter: Exporters, sim: SimNvml
) -> None:
    sim.enable_mig(1, ["3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"])
    exporter = make_exporter()
    text = await collected(exporter)
    await exporter.session.close()

    instances = [
        labels for labels, _ in series(text, "DCGM_FI_PROF_SM_ACTIVE") if "GPU_I_ID" in labels
    ]
    assert sorted((i["gpu"], i["GPU_I_PROFILE"]) for i in instances) == [
        ("1", "1g.18gb"),
        ("1", "1g.18gb"),
        ("1", "2g.35gb"),
        ("1", "3g.71gb"),
    ]
    assert len({i["GPU_I_ID"] for i in instances}) == 4
    assert list(instances[0]) == list(catalog.GPU_LABELS)  # GPU_I_* after modelName
    # the GPU's own series stay, and what GPM cannot split per instance is not copied
    assert "1" in by_gpu(text, "DCGM_FI_DEV_GPU_TEMP")
    assert all("GPU_I_ID" not in labels for labels, _ in series(text, "DCGM_FI_DEV_GPU_TEMP"))


async def test_nvlink_error_counters_where_there_is_nvlink_and_no_retired_pages_on_hopper(
    make_exporter: Exporters,
) -> None:
    exporter = make_exporter()
    text = await collected(exporter)
    await exporter.session.close()

    for name in NVLINK_ERRORS:
        assert by_gpu(text, name) == dict.fromkeys(map(str, range(8)), 0), name
        assert f"# TYPE {name} counter\n" in text.decode()
    # the H200 remaps rows instead of retiring pages: NotSupported, left out, not zero
    assert by_gpu(text, "DCGM_FI_DEV_RETIRED_SBE") == {}
    assert by_gpu(text, "DCGM_FI_DEV_RETIRED_DBE") == {}
    assert len(by_gpu(text, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS")) == 8


async def test_scrapes_of_profiled_mig_series_never_call_nvml(
    make_exporter: Exporters, nvml: CountingNvml, sim: SimNvml, registry: CollectorRegistry
) -> None:
    sim.enable_mig(0, ["1g.18gb"] * 7)
    exporter = make_exporter()
    await collected(exporter)
    calls = sum(nvml.calls.values())
    async with scraping(registry, exporter) as scrape:
        bodies = [await scrape() for _ in range(10)]
    after = sum(nvml.calls.values())
    await exporter.session.close()

    assert after == calls
    assert len(series(bodies[-1], "DCGM_FI_PROF_SM_ACTIVE")) == 8 + 7


async def test_a_mig_instance_one_pod_holds_carries_its_pod_labels(
    make_exporter: Exporters, sim: SimNvml
) -> None:
    sim.enable_mig(1, ["3g.71gb", "1g.18gb"])
    with opened(sim):
        devices = {device.profile: device for device in sim.mig_devices(1)}
    big, small = devices["3g.71gb"], devices["1g.18gb"]
    trainer, sharer = Owner("ml", "trainer-0", "main"), Owner("ml", "notebook", "lab")
    kubelet = InMemoryPodResources(
        [
            DeviceAssignment("nvidia.com/mig-3g.71gb", big.uuid, trainer),
            DeviceAssignment("nvidia.com/mig-1g.18gb", f"{small.uuid}::0", trainer),
            DeviceAssignment("nvidia.com/mig-1g.18gb", f"{small.uuid}::1", sharer),
        ]
    )
    exporter = make_exporter(pods=kubelet)
    await exporter.collect()
    await exporter.refresh_pods()
    text = await collected(exporter)
    await exporter.session.close()

    instances = {
        labels["GPU_I_ID"]: labels
        for labels, _ in series(text, "DCGM_FI_PROF_SM_ACTIVE")
        if "GPU_I_ID" in labels
    }
    assert instances[str(big.gpu_instance_id)]["pod"] == "trainer-0"
    assert "pod" not in instances[str(small.gpu_instance_id)]  # time-sliced: shared
    assert all("pod" not in labels for labels, _ in series(text, "DCGM_FI_DEV_GPU_TEMP"))
