"""The node exporter's collections: scrapes read the last render and never NVML, one GPU's
failure leaves the others exported, the slow queries stay on their own loop, NVML that
cannot open keeps the service not ready until it can, and pod labels follow the kubelet."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gpuop.bus import InMemoryBus
from gpuop.events import device, dra, driver, new_event
from gpuop.nvml import DriverNotLoaded, GpuLost, NotInitialized, NvmlError
from gpuop.observability.http import Complete
from gpuop.services.telemetry.config import TelemetryConfig
from gpuop.services.telemetry.node_exporter import NodeExporter
from gpuop.services.telemetry.pods import DeviceAssignment, InMemoryPodResources, Owner
from gpuop.services.telemetry.sessions import Inventory
from gpuop_sim.nvml.modules import NVIDIA, InMemoryModules
from gpuop_sim.nvml.simulated import SimNvml
from tests.support.node_agents import NODE, running
from tests.support.telemetry import (
    QUIET,
    CountingNvml,
    SlowFields,
    by_gpu,
    scraping,
    series,
)
from tests.support.waiting import eventually

Exporters = Callable[..., NodeExporter]
TRAINER = Owner("ml", "trainer-0", "main")


@pytest.fixture
async def scraped(
    make_exporter: Exporters, registry: CollectorRegistry
) -> AsyncIterator[tuple[NodeExporter, Callable[[], Any]]]:
    """An exporter behind the service's HTTP server, and a function that scrapes it."""
    exporter = make_exporter()
    async with scraping(registry, exporter) as scrape:
        yield exporter, scrape
    await exporter.session.close()


async def test_scrapes_serve_the_last_collection_and_never_call_nvml(
    scraped: tuple[NodeExporter, Callable[[], Any]], nvml: CountingNvml
) -> None:
    exporter, scrape = scraped
    await exporter.collector.collect_slow()
    await exporter.collect()
    calls = sum(nvml.calls.values())

    bodies = [await scrape() for _ in range(25)]

    assert sum(nvml.calls.values()) == calls
    assert all(body == bodies[0] for body in bodies)
    assert len(by_gpu(bodies[0], "DCGM_FI_DEV_GPU_TEMP")) == 8
    assert len(by_gpu(bodies[0], "DCGM_FI_PROF_PCIE_TX_BYTES")) == 8
    assert b"gpuop_telemetry_collection_seconds_count" in bodies[0]  # the registry's own series


async def test_scrapes_keep_answering_while_nvml_fails(
    scraped: tuple[NodeExporter, Callable[[], Any]], nvml: CountingNvml
) -> None:
    exporter, scrape = scraped
    await exporter.collect()
    before = await scrape()
    nvml.fail("metrics", NvmlError("driver wedged"))

    assert await scrape() == before


async def test_one_gpu_failing_leaves_the_others_exported(
    make_exporter: Exporters, nvml: CountingNvml, registry: CollectorRegistry
) -> None:
    exporter = make_exporter()
    nvml.fail("metrics", NvmlError("unknown error", code=999), index=3)

    await exporter.collect()

    temperatures = by_gpu(exporter.exposition(), "DCGM_FI_DEV_GPU_TEMP")
    assert sorted(temperatures) == ["0", "1", "2", "4", "5", "6", "7"]
    assert registry.get_sample_value("gpuop_telemetry_nvml_errors_total", {"query": "metrics"}) == 1
    assert registry.get_sample_value("gpuop_telemetry_gpus") == 7
    await exporter.session.close()


async def test_a_slow_query_failing_on_one_gpu_drops_only_that_gpus_slow_series(
    make_exporter: Exporters, nvml: CountingNvml
) -> None:
    exporter = make_exporter()
    nvml.fail("pcie_throughput", GpuLost("fell off the bus"), index=2)
    nvml.fail("field_values", NvmlError("timeout", code=10), index=5)

    await exporter.collector.collect_slow()
    await exporter.collect()

    text = exporter.exposition()
    assert "2" not in by_gpu(text, "DCGM_FI_PROF_PCIE_TX_BYTES")
    assert len(by_gpu(text, "DCGM_FI_PROF_PCIE_TX_BYTES")) == 7
    assert "5" not in by_gpu(text, "DCGM_FI_DEV_MEMORY_TEMP")
    assert len(by_gpu(text, "DCGM_FI_DEV_MEMORY_TEMP")) == 7
    assert len(by_gpu(text, "DCGM_FI_DEV_GPU_TEMP")) == 8
    await exporter.session.close()


async def test_the_slow_queries_run_on_their_own_loop_not_in_a_collection(
    make_exporter: Exporters, nvml: CountingNvml
) -> None:
    exporter = make_exporter()

    for _ in range(5):
        await exporter.collect()

    assert nvml.calls["metrics"] == 5 * 8
    assert nvml.calls["pcie_throughput"] == 0
    assert nvml.calls["field_values"] == 0
    await exporter.session.close()


async def test_a_slow_query_in_flight_never_holds_a_fast_collection_up(
    bus: InMemoryBus, nvml: CountingNvml, registry: CollectorRegistry
) -> None:
    slow = SlowFields(nvml.inner)
    exporter = NodeExporter(bus, "gpu-1", slow, QUIET, registry)
    slow_round = asyncio.create_task(exporter.collector.collect_slow())
    await asyncio.to_thread(slow.entered.wait, 5)

    for _ in range(3):
        await exporter.collect()  # while field values still block in "NVML"

    assert not slow_round.done()
    assert len(by_gpu(exporter.exposition(), "DCGM_FI_DEV_GPU_TEMP")) == 8
    slow.release.set()
    await slow_round
    await exporter.collect()
    assert len(by_gpu(exporter.exposition(), "DCGM_FI_DEV_MEMORY_TEMP")) == 8
    await exporter.session.close()


async def test_nvml_that_cannot_open_keeps_the_exporter_not_ready_until_it_can(
    bus: InMemoryBus, registry: CollectorRegistry
) -> None:
    modules = InMemoryModules()  # no driver loaded
    sim = SimNvml(2, node="gpu-1", module_state=modules, holder_id="telemetry")
    reports: list[tuple[bool, str]] = []
    config = QUIET.model_copy(update={"retry_interval_seconds": 0.02})
    exporter = NodeExporter(
        bus, "gpu-1", sim, config, registry, readiness=lambda *r: reports.append(r)
    )

    async with running(exporter):
        await eventually(lambda: bool(reports))
        assert reports[0][0] is False
        assert "not loaded" in reports[0][1]
        assert exporter.exposition() == b""
        modules.load(NVIDIA, "580.159.04")
        await eventually(lambda: (True, "") in reports)

    assert len(by_gpu(exporter.exposition(), "DCGM_FI_DEV_GPU_TEMP")) == 2
    assert (
        registry.get_sample_value("gpuop_telemetry_nvml_errors_total", {"query": "open"}) or 0
    ) >= 1


async def test_a_session_that_goes_away_is_reopened(
    make_exporter: Exporters, nvml: CountingNvml
) -> None:
    exporter = make_exporter()
    await exporter.collect()
    first = exporter.session.inventory
    nvml.fail("metrics", NotInitialized("the session is gone"))

    await exporter.collect()

    assert exporter.session.inventory is None
    assert exporter.exposition() == b""
    nvml.heal()
    await exporter.collect()
    assert exporter.session.inventory is not None and exporter.session.inventory is not first
    assert nvml.calls["init"] == 2
    await exporter.session.close()


async def test_the_driver_going_away_mid_run_is_retried_without_crashing(
    make_exporter: Exporters, nvml: CountingNvml
) -> None:
    config = QUIET.model_copy(update={"interval_seconds": 0.01, "retry_interval_seconds": 0.01})
    exporter = make_exporter(config)

    async with running(exporter):
        await eventually(lambda: bool(exporter.exposition()))
        nvml.fail("metrics", DriverNotLoaded("unloaded"))
        nvml.fail("init", DriverNotLoaded("unloaded"))
        await eventually(lambda: exporter.exposition() == b"")
        nvml.heal()
        await eventually(lambda: bool(exporter.exposition()))


async def collected_with_pods(
    make_exporter: Exporters,
) -> tuple[InMemoryPodResources, NodeExporter, Inventory]:
    """An exporter asking an in-memory kubelet, after its first collection."""
    kubelet = InMemoryPodResources()
    exporter = make_exporter(pods=kubelet)
    await exporter.collect()
    inventory = exporter.session.inventory
    assert inventory is not None
    return kubelet, exporter, inventory


async def test_pod_labels_follow_the_kubelets_answer(
    make_exporter: Exporters, registry: CollectorRegistry
) -> None:
    kubelet, exporter, inventory = await collected_with_pods(make_exporter)
    kubelet.current = (DeviceAssignment("nvidia.com/gpu", inventory.gpus[4].uuid, TRAINER),)

    await exporter.refresh_pods()
    await exporter.collect()

    owned = [
        labels
        for labels, _ in series(exporter.exposition(), "DCGM_FI_DEV_FB_USED")
        if "pod" in labels
    ]
    assert [(labels["gpu"], labels["pod"]) for labels in owned] == [("4", "trainer-0")]
    assert registry.get_sample_value("gpuop_telemetry_pod_resources_up") == 1

    kubelet.current = ()
    await exporter.refresh_pods()
    await exporter.collect()
    assert all(
        "pod" not in labels for labels, _ in series(exporter.exposition(), "DCGM_FI_DEV_FB_USED")
    )
    await exporter.session.close()


async def test_a_kubelet_that_cannot_be_asked_leaves_gpus_exported_without_pod_labels(
    make_exporter: Exporters, registry: CollectorRegistry
) -> None:
    kubelet = InMemoryPodResources()
    kubelet.unavailable = "no kubelet PodResources socket at /host/var/lib/kubelet/..."
    exporter = make_exporter(pods=kubelet)
    await exporter.collect()

    await exporter.refresh_pods()
    await exporter.collect()

    assert registry.get_sample_value("gpuop_telemetry_pod_resources_up") == 0
    used = series(exporter.exposition(), "DCGM_FI_DEV_FB_USED")
    assert len(used) == 8
    assert all("pod" not in labels for labels, _ in used)
    await exporter.session.close()


async def test_the_kubelet_is_asked_on_its_own_loop_never_per_collection_or_scrape(
    make_exporter: Exporters, registry: CollectorRegistry
) -> None:
    kubelet = InMemoryPodResources()
    exporter = make_exporter(QUIET.model_copy(update={"interval_seconds": 0.01}), pods=kubelet)

    def collections() -> float:
        return (
            registry.get_sample_value("gpuop_telemetry_collection_seconds_count", {"loop": "fast"})
            or 0
        )

    async with running(exporter):
        await eventually(lambda: collections() > 20)
        for _ in range(50):
            exporter.exposition()

    assert kubelet.calls == 1  # the pods interval is an hour


async def test_without_pod_labels_the_kubelet_is_never_asked(
    make_exporter: Exporters, registry: CollectorRegistry
) -> None:
    kubelet = InMemoryPodResources()
    exporter = make_exporter(TelemetryConfig(labels=("gpu", "UUID")), pods=kubelet)

    async with running(exporter):
        await eventually(lambda: bool(exporter.exposition()))

    assert kubelet.calls == 0
    assert registry.get_sample_value("gpuop_telemetry_pod_resources_up") is None


async def test_a_gpu_held_through_a_resource_claim_gets_the_pods_labels(
    make_exporter: Exporters, bus: InMemoryBus
) -> None:
    _, exporter, inventory = await collected_with_pods(make_exporter)
    claim = dra.ClaimRef(namespace="ml", name="trainer-gpu", uid="0000-0001")
    allocated = dra.ClaimAllocated(
        claim=claim,
        devices=(
            dra.AllocatedDevice(
                request="gpu",
                driver=dra.DRIVER,
                pool=NODE,
                device="gpu-6",
                gpu_uuid=inventory.gpus[6].uuid,
            ),
        ),
        pods=(dra.PodRef(namespace="ml", name="claimant", uid="0000-0002"),),
        resource_version="12",
    )

    def owners() -> list[tuple[str, str, str]]:
        return [
            (labels["gpu"], labels["pod"], labels.get("container", ""))
            for labels, _ in series(exporter.exposition(), "DCGM_FI_DEV_FB_USED")
            if "pod" in labels
        ]

    def labelled(expected: list[tuple[str, str, str]]) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            await exporter.refresh_pods()
            await exporter.collect()
            return owners() == expected

        return check

    async with running(exporter):
        await bus.publish(new_event(allocated, node=NODE, source="/gpuop/device-plugin"))
        await eventually(labelled([("6", "claimant", "")]))
        released = dra.ClaimReleased(claim=claim, deleted=True)
        await bus.publish(new_event(released, node=NODE, source="/gpuop/device-plugin"))
        await eventually(labelled([]))


async def test_a_scrape_serves_the_registry_rendered_with_the_collection_and_renders_nothing(
    scraped: tuple[NodeExporter, Callable[[], Any]],
) -> None:
    exporter, scrape = scraped
    await exporter.collect()
    collected = await scrape()
    exporter.metrics.kernel_log_lost.inc(5)  # a registry change between two collections

    assert await scrape() == collected  # served as rendered: the registry is not rendered again
    assert isinstance(exporter.exposition(), Complete)
    assert b"gpuop_telemetry_kernel_log_lost_records" in collected
    assert collected.index(b"gpuop_telemetry_collection_seconds") < collected.index(b"DCGM_")
    await exporter.collect()
    assert b"gpuop_telemetry_kernel_log_lost_records_total 5.0" in await scrape()


async def test_while_paused_a_scrape_renders_the_registry_live(
    scraped: tuple[NodeExporter, Callable[[], Any]],
) -> None:
    exporter, scrape = scraped
    await exporter.collect()
    await exporter.pause(device.PauseOperands(components=(driver.Component.GPU,), reason="upgrade"))

    paused = await scrape()
    exporter.metrics.kernel_log_lost.inc(2)

    assert b"DCGM_" not in paused
    assert b"gpuop_telemetry_paused 1.0" in paused
    assert b"gpuop_telemetry_kernel_log_lost_records_total 2.0" in await scrape()
