"""Health events: an injected XID or uncorrectable ECC error becomes `device.health-changed`
and shows in the metrics; application XIDs and corrected errors only count; a GPU that stops
answering is unreachable until it answers; events wait out a bus outage."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry

from gpuop.bus import BusError, InMemoryBus, PublishAck
from gpuop.events import Envelope, device, driver
from gpuop.events.device import DeviceHealthChanged, HealthReason, XidAction
from gpuop.nvml import GpuLost
from gpuop.services.telemetry.node_exporter import NodeExporter
from gpuop_sim.nvml.simulated import SimNvml
from tests.support.node_agents import NODE, published, running, send_command, wait_for
from tests.support.telemetry import QUIET, CountingNvml, by_gpu, series, uuid_of
from tests.support.waiting import eventually

Exporters = Callable[..., NodeExporter]


async def test_an_injected_xid_is_a_health_event_and_shows_in_the_xid_metric(
    bus: InMemoryBus, make_exporter: Exporters, sim: SimNvml, registry: CollectorRegistry
) -> None:
    exporter = make_exporter()
    async with running(exporter):
        await eventually(lambda: bool(exporter.exposition()))
        assert set(by_gpu(exporter.exposition(), "DCGM_FI_DEV_XID_ERRORS").values()) == {0}

        sim.inject_xid(5, 48)

        [(envelope, event)] = await wait_for(bus, DeviceHealthChanged, 1)
        await eventually(lambda: by_gpu(exporter.exposition(), "DCGM_FI_DEV_XID_ERRORS")["5"] == 48)

    uuid = uuid_of(5)
    assert (event.gpu_uuid, event.healthy, event.reason, event.xid, event.action) == (
        uuid,
        False,
        HealthReason.XID,
        48,
        XidAction.RESET_GPU,
    )
    assert event.message == "XID 48 (Double-bit ECC error) on GPU 5: reset-gpu"
    assert envelope.node == NODE
    assert envelope.source == f"/gpuop/telemetry/{NODE}"
    [(labels, count)] = series(exporter.exposition(), "DCGM_EXP_XID_ERRORS_COUNT")
    assert (labels["gpu"], labels["xid"], count) == ("5", "48", 1)
    assert registry.get_sample_value("gpuop_telemetry_health_events_total", {"reason": "xid"}) == 1


async def test_an_application_xid_counts_in_the_metrics_but_changes_no_health(
    bus: InMemoryBus, make_exporter: Exporters, sim: SimNvml
) -> None:
    exporter = make_exporter()
    async with running(exporter):
        await eventually(lambda: bool(exporter.exposition()))

        sim.inject_xid(1, 13)  # an illegal memory access in someone's kernel

        await eventually(lambda: by_gpu(exporter.exposition(), "DCGM_FI_DEV_XID_ERRORS")["1"] == 13)
        assert await published(bus, DeviceHealthChanged) == []
        assert exporter.health.unhealthy() == {}


async def test_an_uncorrectable_ecc_error_is_a_health_event_with_the_new_counts(
    bus: InMemoryBus, make_exporter: Exporters, sim: SimNvml
) -> None:
    exporter = make_exporter()
    async with running(exporter):
        await eventually(lambda: bool(exporter.exposition()))

        sim.inject_ecc(2, volatile_corrected=3)
        sim.inject_ecc(2, volatile_uncorrected=1)

        [(_, event)] = await wait_for(bus, DeviceHealthChanged, 1)
        await eventually(
            lambda: by_gpu(exporter.exposition(), "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")["2"] == 1
        )

    assert (event.reason, event.healthy, event.action) == (
        HealthReason.ECC,
        False,
        XidAction.RESET_GPU,
    )
    assert event.ecc_volatile_uncorrected == 1
    assert event.ecc_aggregate_uncorrected == 1
    assert by_gpu(exporter.exposition(), "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL")["2"] == 3
    assert by_gpu(exporter.exposition(), "DCGM_FI_DEV_ROW_REMAP_PENDING")["2"] == 1


async def test_a_gpu_that_stops_answering_is_unreachable_until_it_answers_again(
    bus: InMemoryBus, make_exporter: Exporters, sim: SimNvml, nvml: CountingNvml
) -> None:
    exporter = make_exporter()
    await exporter.collect()
    nvml.fail("metrics", GpuLost("GPU 6 has fallen off the bus"), index=6)

    await exporter.collect()
    await exporter.collect()  # still lost: no second event
    nvml.heal()
    await exporter.collect()
    await exporter.outbox.flush()

    events = [event for _, event in await published(bus, DeviceHealthChanged)]
    uuid = uuid_of(6)
    assert [(e.gpu_uuid, e.healthy, e.reason, e.action) for e in events] == [
        (uuid, False, HealthReason.UNREACHABLE, XidAction.REBOOT),
        (uuid, True, HealthReason.RECOVERED, XidAction.NONE),
    ]
    assert "fallen off the bus" in events[0].message
    await exporter.session.close()


async def test_an_xid_mark_holds_until_the_driver_reload_a_pause_and_resume_bring(
    bus: InMemoryBus, make_exporter: Exporters, sim: SimNvml
) -> None:
    exporter = make_exporter()
    async with running(exporter):
        await eventually(lambda: bool(exporter.exposition()))
        sim.inject_xid(0, 79)
        await wait_for(bus, DeviceHealthChanged, 1)
        await exporter.collect()
        assert len(await published(bus, DeviceHealthChanged)) == 1  # still unhealthy

        pause = device.PauseOperands(components=(driver.Component.GPU,))
        await send_command(bus, pause, id="pause-1")
        await wait_for(bus, device.OperandPaused, 1)
        await send_command(bus, device.ResumeOperands(), id="resume-1")
        await wait_for(bus, device.OperandResumed, 1)

        events = await wait_for(bus, DeviceHealthChanged, 2)

    recovered = events[1][1]
    assert (recovered.gpu_uuid, recovered.healthy, recovered.reason) == (
        uuid_of(0),
        True,
        HealthReason.RECOVERED,
    )


class FlakyBus:
    """The in-memory bus, whose publishes fail while `down`."""

    def __init__(self, inner: InMemoryBus) -> None:
        self.inner = inner
        self.down = False

    async def publish(self, envelope: Envelope) -> PublishAck:
        if self.down:
            raise BusError("nats: no servers available for connection")
        return await self.inner.publish(envelope)

    async def publish_batch(self, envelopes: Sequence[Envelope]) -> list[PublishAck]:
        return [await self.publish(e) for e in envelopes]

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


async def test_health_events_wait_out_a_bus_outage_and_go_out_in_order(
    bus: InMemoryBus, nvml: CountingNvml, sim: SimNvml, registry: CollectorRegistry
) -> None:
    flaky = FlakyBus(bus)
    config = QUIET.model_copy(update={"retry_interval_seconds": 0.02})
    exporter = NodeExporter(flaky, NODE, nvml, config, registry)  # type: ignore[arg-type]
    async with running(exporter):
        await eventually(lambda: bool(exporter.exposition()))
        flaky.down = True
        sim.inject_xid(3, 48)
        sim.inject_xid(4, 79)
        await eventually(lambda: exporter.outbox.pending == 2)
        assert registry.get_sample_value("gpuop_telemetry_health_events_pending") == 2
        assert len(by_gpu(exporter.exposition(), "DCGM_FI_DEV_GPU_TEMP")) == 8  # still exporting

        flaky.down = False
        events = await wait_for(bus, DeviceHealthChanged, 2)

    assert [event.xid for _, event in events] == [48, 79]
    assert exporter.outbox.pending == 0
