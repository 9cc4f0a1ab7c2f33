"""Each health signal from its source format to the remediation saga's action: NVML's
answers as pynvml returns them (the recorded H200's, with the fault written in), read by the
pynvml backend, the slow field query and the health tracker, then the event it publishes
handed to the orchestrator's remediation intake."""

from __future__ import annotations

import copy
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from gpuop.bus import InMemoryBus
from gpuop.events.device import DeviceHealthChanged, HealthReason, XidAction
from gpuop.health import detecting, falls, kmsg, signals, xids
from gpuop.nvml import XidEvent, errors
from gpuop.nvml.metrics import FieldId
from gpuop.nvml.protocol import opened
from gpuop.nvml.real import PynvmlBackend
from gpuop.nvml.recorded import RecordedNvml
from gpuop.saga.remediation.kind import calls_for_remediation
from gpuop.services.telemetry.collecting import SLOW_QUERY, FastRound
from gpuop.services.telemetry.marks import REASONS, HealthTracker
from gpuop.services.telemetry.node_exporter import NodeExporter
from gpuop.services.telemetry.sessions import Inventory
from gpuop_sim import recordings
from gpuop_sim.nvml.simulated import SimNvml
from tests.support.fake_pynvml import FakePynvml
from tests.support.node_agents import running, wait_for
from tests.support.remediations import remediating
from tests.support.sagas import policy
from tests.support.telemetry import uuid_of
from tests.support.waiting import eventually

NODE = "gpu-node-1"
NVML_JSON = recordings.H200_NVML
Device = dict[str, Any]


def _fields(**values: int) -> Callable[[Device], None]:
    """NVML field values as `nvmlDeviceGetFieldValues` returns them (valueType 3: ull)."""

    def edit(device: Device) -> None:
        answers = [f for f in device["field_values"] if str(f["fieldId"]) not in values]
        for field_id, value in values.items():
            answers.append(
                {"fieldId": int(field_id), "nvmlReturn": 0, "valueType": 3, "value": value}
            )
        device["field_values"] = answers

    return edit


def _answer(key: str, value: Any) -> Callable[[Device], None]:
    def edit(device: Device) -> None:
        device[key] = value

    return edit


class Node:
    """The recorded H200 behind the pynvml backend, its answers changed between rounds."""

    def __init__(self) -> None:
        self.fake = FakePynvml(NVML_JSON)
        self.original = copy.deepcopy(self.fake.recording)
        self.tracker = HealthTracker(())
        self.nvml = PynvmlBackend(self.fake.module)
        self.session: Inventory | None = None

    def round(self, now: float, *edits: Callable[[Device], None]) -> list[DeviceHealthChanged]:
        """One fast collection (and the slow field query before it) at monotonic `now`."""
        device = copy.deepcopy(self.original["devices"][0])
        for edit in edits:
            edit(device)
        self.fake.recording["devices"][0] = device
        with opened(self.nvml) as nvml:
            if self.session is None:  # the inventory read when the session first opened
                self.session = Inventory("580.159.04", (nvml.device_info(0),), ())
            session = self.session
            failures: dict[int, errors.NvmlError] = {}
            metrics = {}
            fields = {}
            try:
                metrics[0] = nvml.metrics(0)
                answers = nvml.field_values(0, SLOW_QUERY)
                fields[0] = {a.field_id: a.value for a in answers if a.value is not None}
            except errors.NvmlError as error:
                failures[0] = error
        collected = FastRound(session, b"", metrics, failures, 0.0)
        return self.tracker.on_round(session, collected, fields=fields, now=now)


async def saga_action(event: DeviceHealthChanged) -> XidAction | None:
    """What the orchestrator's remediation does with the event: the action of the saga it
    starts, or None when it starts none."""
    async with remediating(policy()) as harness:
        await harness.publish(event, NODE, source="/gpuop/telemetry")
        if not calls_for_remediation(event):
            await harness.settle()
            assert await harness.saga(NODE) is None
            return None
        return (await harness.started(NODE)).action


NVLINK_QUIET = _fields(**{"38": 0, "45": 0, "52": 0, "59": 0})
NVLINK_STORM = _fields(**{"38": 90, "45": 10, "52": 40, "59": 2})
"""CRC flit, CRC data, replay and recovery totals: 142 errors."""


@pytest.mark.parametrize(
    ("signal", "faulty", "hold", "reason", "action"),
    [
        ("nvlink-errors", [NVLINK_STORM], 0.0, HealthReason.NVLINK, XidAction.RESET_GPU),
        ("clocks-thermal", [_answer("throttle_reasons", 0x40)], 300.0, HealthReason.CLOCKS,
         XidAction.MARK),
        ("clocks-power-brake", [_answer("throttle_reasons", 0x80)], 300.0,
         HealthReason.CLOCKS, XidAction.MARK),
        ("pcie-replays", [_answer("pcie_replay", 250)], 0.0, HealthReason.PCIE,
         XidAction.MARK),
        ("pcie-link-width", [_answer("pcie_link_width", 8), _answer("pcie_max_link_width", 16)],
         60.0, HealthReason.PCIE, XidAction.DRAIN_AND_REPLACE),
        ("pcie-link-generation",
         [_answer("pcie_link_gen", 3), _answer("pcie_max_link_gen", 5),
          _answer("throttle_reasons", 0)], 60.0, HealthReason.PCIE, XidAction.MARK),
        ("row-remap-pending", [_answer("remapped_rows", [0, 1, 1, 0])], 30.0,
         HealthReason.ROW_REMAP, XidAction.RESET_GPU),
        ("row-remap-failure", [_answer("remapped_rows", [0, 4, 0, 1])], 0.0,
         HealthReason.ROW_REMAP, XidAction.DRAIN_AND_REPLACE),
    ],
)  # fmt: skip
async def test_each_nvml_signal_reaches_the_saga_with_the_catalogs_action(
    signal: str,
    faulty: list[Callable[[Device], None]],
    hold: float,
    reason: HealthReason,
    action: XidAction,
) -> None:
    node = Node()
    quiet = [NVLINK_QUIET] if signal == "nvlink-errors" else []
    assert node.round(0.0, *quiet) == []  # the recorded H200 as it was: healthy
    if hold:  # a condition fires once it held that long, not before
        assert node.round(1.0, *faulty) == [], "fired before its threshold"
    [event] = node.round(1.0 + hold, *faulty)

    assert (event.signal, event.reason, event.action, event.healthy) == (
        signal, reason, action, False,
    )  # fmt: skip
    assert signals.packaged().for_signal(signal).why in event.message
    assert node.round(2.0 + hold, *faulty) == []  # one storm, one event
    saga = await saga_action(event)
    assert saga == (action if action.rank >= XidAction.RESET_GPU.rank else None)


def test_a_counter_below_the_rate_never_fires() -> None:
    node = Node()
    node.round(0.0, NVLINK_QUIET)
    slow = [_fields(**{"38": 50}), _fields(**{"38": 99}), _fields(**{"38": 148})]
    assert [node.round(60.0 * (i + 1), edit) for i, edit in enumerate(slow)] == [[], [], []]


def test_a_mark_lifts_with_its_condition_and_a_reset_mark_does_not() -> None:
    node = Node()
    hot = _answer("throttle_reasons", 0x20)
    node.round(0.0, hot)
    [marked] = node.round(300.0, hot)
    [recovered] = node.round(301.0)
    assert (marked.action, recovered.healthy, recovered.action) == (
        XidAction.MARK, True, XidAction.NONE,
    )  # fmt: skip

    failed = _answer("remapped_rows", [0, 4, 0, 1])
    [replace] = node.round(400.0, failed)
    assert replace.action is XidAction.DRAIN_AND_REPLACE
    assert node.round(401.0, failed) == []  # the same session, still failed: no news


def test_a_weaker_signal_never_lowers_a_gpu_that_asks_for_more() -> None:
    node = Node()
    [replace] = node.round(0.0, _answer("remapped_rows", [0, 4, 0, 1]))
    hot = _answer("throttle_reasons", 0x40)
    node.round(1.0, _answer("remapped_rows", [0, 4, 0, 1]), hot)
    assert node.round(400.0, _answer("remapped_rows", [0, 4, 0, 1]), hot) == []
    assert node.tracker.actions() == {replace.gpu_uuid: XidAction.DRAIN_AND_REPLACE}


def test_an_idle_gpu_at_a_lower_pcie_generation_is_not_a_signal() -> None:
    node = Node()
    idle = [_answer("pcie_link_gen", 1), _answer("pcie_max_link_gen", 5)]
    node.round(0.0, *idle)  # the recorded H200 is idle: throttle_reasons 0x1
    assert node.round(600.0, *idle) == []


def test_a_gpu_without_nvlink_or_a_maximum_makes_no_signal_from_them() -> None:
    node = Node()  # the recorded H200: no NVLink field answers, no maximum link recorded
    node.round(0.0, _answer("pcie_link_width", 4))
    assert node.round(600.0, _answer("pcie_link_width", 4)) == []


async def test_a_gpu_lost_from_the_bus_asks_for_a_reboot() -> None:
    node = Node()
    node.round(0.0)
    node.fake.fail("nvmlDeviceGetMemoryInfo", 15)  # NVML_ERROR_GPU_IS_LOST
    node.fake.fail("nvmlDeviceGetMemoryInfo_v2", 15)
    [lost] = node.round(1.0)

    assert (lost.signal, lost.reason, lost.action) == (
        "gpu-lost", HealthReason.UNREACHABLE, XidAction.REBOOT,
    )  # fmt: skip
    assert await saga_action(lost) is XidAction.REBOOT


def test_the_catalog_refuses_a_signal_without_its_threshold() -> None:
    text = (resources.files("gpuop.health") / "signals.json").read_text()
    broken = text.replace('"held_seconds": 300,', "", 1)
    with pytest.raises(xids.CatalogError, match=r"clocks-thermal.*held_seconds"):
        signals.parse(broken, xid_catalog=xids.packaged())


def test_every_catalog_signal_has_a_reason_and_a_reader() -> None:

    catalog = signals.packaged()
    assert set(catalog.signals) | {signals.XID} == set(REASONS)
    detecting.Detector(catalog)  # refuses a counter or condition it cannot read


async def test_a_kernel_log_xid_79_and_nvmls_gpu_lost_are_one_event_asking_for_a_reboot() -> None:
    node = Node()
    node.round(0.0)
    assert node.session is not None
    [gpu] = node.session.gpus
    bus = kmsg.pci_key(gpu.pci_bus_id)
    line = f"3,1877,9413355120,-;NVRM: Xid (PCI:{bus}): 79, pid=2231, name=python3, GPU has fallen off the bus.\n"  # noqa: E501
    fault = kmsg.parse_fault(kmsg.parse_record(line.encode()))
    assert fault is not None and fault.pci == bus
    xid = XidEvent(gpu.index, gpu.uuid, fault.xid, fault.gpu_instance, fault.compute_instance)
    from_log = node.tracker.on_event(xid, node.session, None)

    assert from_log is not None
    assert (from_log.signal, from_log.xid, from_log.action) == ("xid", 79, XidAction.REBOOT)
    node.fake.fail("nvmlDeviceGetMemoryInfo", 15)  # then NVML: NVML_ERROR_GPU_IS_LOST
    assert node.round(1.0) == []  # the same fault from the second source: no second event
    assert await saga_action(from_log) is XidAction.REBOOT


def test_a_storm_is_one_detection_until_a_whole_window_below_the_rate() -> None:
    detector = detecting.Detector(signals.packaged())
    metrics = RecordedNvml(NVML_JSON)
    with opened(metrics) as nvml:
        reading = nvml.metrics(0)
    totals = {52: 0}
    seen = []
    for now, total in [(0, 0), (1, 150), (2, 150), (30, 200), (95, 210), (160, 400)]:
        totals[52] = total
        found = detector.observe(0, "GPU-x", reading, totals, float(now))
        seen.append([d.signal for d in found if d.signal == "nvlink-errors"])
    assert seen == [[], ["nvlink-errors"], [], [], [], ["nvlink-errors"]]


async def test_a_simulated_nvlink_storm_is_one_reset_event_from_the_node_exporter(
    bus: InMemoryBus, make_exporter: Callable[..., NodeExporter], sim: SimNvml
) -> None:
    exporter = make_exporter()
    replays = FieldId.NVLINK_REPLAY_ERROR_COUNT_TOTAL
    async with running(exporter):
        await eventually(lambda: bool(exporter.exposition()))
        await exporter.collector.collect_slow()  # the quiet totals: 0 on every link
        await exporter.collect()
        assert exporter.collector.slow_fields[6][replays] == 0

        sim.inject_nvlink_errors(6, {replays: 180, FieldId.NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: 20})
        await exporter.collector.collect_slow()
        await exporter.collect()
        await exporter.collect()  # the storm goes on: still one event

        [(_, event)] = await wait_for(bus, DeviceHealthChanged, 1)
    assert (event.gpu_uuid, event.signal, event.reason, event.action) == (
        uuid_of(6), "nvlink-errors", HealthReason.NVLINK, XidAction.RESET_GPU,
    )  # fmt: skip
    assert "nvlink-errors rose by 200" in event.message


def test_a_fall_counts_as_again_only_in_a_later_boot_and_a_bad_file_as_a_first(
    tmp_path: Path,
) -> None:
    boot = ["boot-a"]
    kept = falls.Falls(tmp_path / "falls.json", lambda: boot[0])
    assert not kept.again("GPU-1")
    assert not kept.again("GPU-1"), "the same boot: the same fall"
    boot[0] = "boot-b"
    assert not kept.again("GPU-2")
    assert kept.again("GPU-1")
    assert not falls.Falls(tmp_path / "falls.json", lambda: None).again("GPU-1")
    (tmp_path / "falls.json").write_text("[not json")
    assert not kept.again("GPU-1")


async def test_a_gpu_fallen_off_the_bus_again_after_the_reboot_is_handed_over_for_new_hardware(
    tmp_path: Path,
) -> None:
    boot = ["boot-a"]
    node = Node()
    node.tracker = HealthTracker((), fallen=falls.Falls(tmp_path / "falls.json", lambda: boot[0]))
    node.round(0.0)
    assert node.session is not None
    [gpu] = node.session.gpus
    line = f"3,9,9000,-;NVRM: Xid (PCI:{kmsg.pci_key(gpu.pci_bus_id)}): 79, GPU has fallen off the bus.\n"  # noqa: E501
    fault = kmsg.parse_fault(kmsg.parse_record(line))
    assert fault is not None
    xid = XidEvent(gpu.index, gpu.uuid, fault.xid, None, None)

    first = node.tracker.on_event(xid, node.session, None)
    boot[0] = "boot-b"  # rebooted: telemetry starts afresh, the host remembers
    node.tracker = HealthTracker((), fallen=falls.Falls(tmp_path / "falls.json", lambda: boot[0]))
    again = node.tracker.on_event(xid, node.session, None)

    assert first is not None and again is not None
    assert (first.signal, first.action) == ("xid", XidAction.REBOOT)
    assert (again.signal, again.xid, again.action) == (
        "gpu-lost-again", 79, XidAction.DRAIN_AND_REPLACE,
    )  # fmt: skip
    assert "again after a reboot" in again.message
    assert await saga_action(again) is XidAction.DRAIN_AND_REPLACE
