"""The rendered exposition: dcgm-exporter's names, types and labels, series left out for what
a GPU cannot measure, pod labels only where one container holds the GPU, and allowlists."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuop.nvml import DeviceInfo, FieldId, PcieThroughput, RecordedNvml, inventory
from gpuop.services.telemetry import catalog, exposition
from gpuop.services.telemetry.catalog import Reading
from gpuop.services.telemetry.pods import Owner
from gpuop_sim import recordings
from gpuop_sim.nvml.simulated import SimNvml
from tests.support.node_agents import NODE
from tests.support.telemetry import by_gpu, series

TRAINER = Owner(namespace="ml", pod="trainer-0", container="main")
SHARER = Owner(namespace="ml", pod="notebook", container="lab")
EVERYTHING = catalog.NAMES


def render_sim(
    gpus: int = 2,
    *,
    attribution: dict[int, tuple[Owner, ...]] | None = None,
    allowed: tuple[str, ...] = catalog.LABELS,
    enabled: frozenset[str] = EVERYTHING,
    slow: bool = True,
) -> bytes:
    sim = SimNvml(gpus, node=NODE)
    sim.init()
    infos = inventory(sim)
    readings = {
        gpu.index: Reading(
            fast=sim.metrics(gpu.index),
            pcie=sim.pcie_throughput(gpu.index) if slow else None,
            fields={
                v.field_id: v.value
                for v in sim.field_values(gpu.index, catalog.SLOW_FIELDS)
                if v.value is not None
            }
            if slow
            else {},
            last_xid=0,
        )
        for gpu in infos
    }
    labels = exposition.label_sets(
        infos,
        node=NODE,
        driver_version=sim.driver_version(),
        attribution=attribution or {},
        allowed=allowed,
    )
    return exposition.render(readings, labels, xid_counts={}, enabled=enabled)


def test_every_series_has_dcgm_exporters_labels_in_its_order() -> None:
    text = render_sim()

    [(labels, _), _] = series(text, "DCGM_FI_DEV_GPU_TEMP")
    assert list(labels) == [name for name in catalog.GPU_LABELS if not name.startswith("GPU_I_")]
    assert labels["gpu"] == "0"
    assert labels["UUID"].startswith("GPU-")
    assert labels["device"] == "nvidia0"
    assert labels["modelName"] == "NVIDIA H200"
    assert labels["Hostname"] == NODE
    assert labels["DCGM_FI_DRIVER_VERSION"] == "580.159.04"
    assert labels["pci_bus_id"].startswith("00000000:")


def test_types_and_names_are_dcgm_exporters_counters_without_total() -> None:
    families = {f.name: f for f in text_string_to_metric_families(render_sim().decode())}

    assert families["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].type == "counter"
    assert families["DCGM_FI_DEV_GPU_TEMP"].type == "gauge"
    text = render_sim().decode()
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n" in text
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total" not in text
    assert "# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter\n" in text


def test_values_are_converted_to_dcgm_units() -> None:
    sim = SimNvml(1, node=NODE)
    sim.init()
    fast = sim.metrics(0)
    text = render_sim(1)

    assert fast.power_usage_mw is not None and fast.memory_used_bytes is not None
    assert by_gpu(text, "DCGM_FI_DEV_POWER_USAGE")["0"] == pytest.approx(fast.power_usage_mw / 1000)
    assert by_gpu(text, "DCGM_FI_DEV_FB_USED")["0"] == fast.memory_used_bytes // (1024 * 1024)
    pcie = sim.pcie_throughput(0)
    assert pcie.tx_kilobytes_per_second is not None
    assert by_gpu(text, "DCGM_FI_PROF_PCIE_TX_BYTES")["0"] == pcie.tx_kilobytes_per_second * 1024


def test_what_the_recorded_h200_answers_not_supported_is_left_out_not_zero() -> None:
    recorded = RecordedNvml(recordings.H200_NVML)
    recorded.init()
    [gpu] = inventory(recorded)
    fields = recorded.field_values(0, catalog.SLOW_FIELDS)
    reading = Reading(
        fast=recorded.metrics(0),
        pcie=recorded.pcie_throughput(0),
        fields={v.field_id: v.value for v in fields if v.value is not None},
    )
    labels = exposition.label_sets(
        [gpu], node=NODE, driver_version="580.159.04", attribution={}, allowed=catalog.LABELS
    )

    text = exposition.render({0: reading}, labels, xid_counts={}, enabled=EVERYTHING).decode()

    for absent in (
        "DCGM_FI_DEV_FAN_SPEED",  # passively cooled
        "DCGM_FI_DEV_RETIRED_PENDING",  # NotSupported on Hopper
        "DCGM_FI_DEV_FB_RESERVED",  # the recording's memory query was v1
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",  # one GPU, no NVLink
        "DCGM_FI_DEV_XID_ERRORS",  # not watching
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",  # no profiling through NVML
    ):
        assert absent not in text
    assert "DCGM_FI_DEV_GPU_TEMP{" in text
    assert "DCGM_FI_DEV_MEMORY_TEMP{" in text


def test_a_gpu_whose_fast_queries_failed_keeps_only_its_slow_and_xid_series() -> None:
    sim = SimNvml(2, node=NODE)
    sim.init()
    infos = inventory(sim)
    labels = exposition.label_sets(
        infos, node=NODE, driver_version="580.159.04", attribution={}, allowed=catalog.LABELS
    )
    readings = {
        0: Reading(fast=sim.metrics(0), last_xid=0),
        1: Reading(fast=None, pcie=PcieThroughput(1, 10, 20), last_xid=79),
    }

    text = exposition.render(readings, labels, xid_counts={}, enabled=EVERYTHING)

    assert set(by_gpu(text, "DCGM_FI_DEV_GPU_TEMP")) == {"0"}
    assert by_gpu(text, "DCGM_FI_DEV_XID_ERRORS") == {"0": 0, "1": 79}
    assert set(by_gpu(text, "DCGM_FI_PROF_PCIE_TX_BYTES")) == {"1"}


def test_a_gpu_one_container_holds_carries_its_pod_labels() -> None:
    text = render_sim(attribution={1: (TRAINER,)})

    used = {labels["gpu"]: labels for labels, _ in series(text, "DCGM_FI_DEV_FB_USED")}
    assert (used["1"]["pod"], used["1"]["namespace"], used["1"]["container"]) == (
        "trainer-0",
        "ml",
        "main",
    )
    assert "pod" not in used["0"]


def test_a_shared_gpu_is_not_copied_per_pod_and_lists_who_shares_it() -> None:
    text = render_sim(attribution={0: (SHARER, TRAINER)})

    used = series(text, "DCGM_FI_DEV_FB_USED")
    assert len(used) == 2  # one series per GPU, not one per pod
    assert all("pod" not in labels for labels, _ in used)
    info = series(text, "gpuop_telemetry_gpu_pod_info")
    assert sorted((labels["gpu"], labels["pod"]) for labels, _ in info) == [
        ("0", "notebook"),
        ("0", "trainer-0"),
    ]


def test_the_label_allowlist_drops_labels_from_every_series() -> None:
    text = render_sim(attribution={0: (TRAINER,)}, allowed=("UUID", "gpu", "pod"))

    for labels, _ in series(text, "DCGM_FI_DEV_GPU_TEMP"):
        assert set(labels) <= {"UUID", "gpu", "pod"}
    [labels] = [labels for labels, _ in series(text, "DCGM_FI_DEV_GPU_TEMP") if "pod" in labels]
    assert labels == {"gpu": "0", "UUID": labels["UUID"], "pod": "trainer-0"}


def test_the_metric_allowlist_exports_only_what_it_names() -> None:
    text = render_sim(enabled=frozenset({"DCGM_FI_DEV_GPU_TEMP"})).decode()

    names = {line.split("{")[0] for line in text.splitlines() if not line.startswith("#")}
    assert names == {"DCGM_FI_DEV_GPU_TEMP"}


def test_label_values_are_escaped() -> None:
    sim = SimNvml(1, node=NODE)
    sim.init()
    [gpu] = inventory(sim)
    odd: DeviceInfo = dataclasses.replace(gpu, name='H200 "SXM"\\x\nnew')
    labels = exposition.label_sets(
        [odd], node=NODE, driver_version="1", attribution={}, allowed=catalog.LABELS
    )

    text = exposition.render(
        {0: Reading(fast=sim.metrics(0))}, labels, xid_counts={}, enabled=EVERYTHING
    )

    [(parsed, _)] = series(text, "DCGM_FI_DEV_GPU_TEMP")
    assert parsed["modelName"] == 'H200 "SXM"\\x\nnew'


def test_xid_counts_carry_the_xid_label() -> None:
    sim = SimNvml(2, node=NODE)
    sim.init()
    infos = inventory(sim)
    labels = exposition.label_sets(
        infos, node=NODE, driver_version="1", attribution={}, allowed=catalog.LABELS
    )
    readings = {gpu.index: Reading(fast=sim.metrics(gpu.index)) for gpu in infos}

    text = exposition.render(readings, labels, xid_counts={1: {48: 2, 79: 1}}, enabled=EVERYTHING)

    counts = series(text, "DCGM_EXP_XID_ERRORS_COUNT")
    assert sorted((labels["gpu"], labels["xid"], value) for labels, value in counts) == [
        ("1", "48", 2),
        ("1", "79", 1),
    ]


def test_slow_fields_render_only_once_the_slow_loop_answered() -> None:
    without = render_sim(slow=False).decode()
    with_slow = render_sim(slow=True).decode()

    assert "DCGM_FI_DEV_MEMORY_TEMP" not in without
    assert "DCGM_FI_PROF_PCIE_RX_BYTES" not in without
    assert "DCGM_FI_DEV_MEMORY_TEMP" in with_slow
    assert FieldId.NVLINK_THROUGHPUT_DATA_TX in catalog.SLOW_FIELDS
    assert "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" in with_slow  # 8-way HGX wiring, 2 GPUs too
