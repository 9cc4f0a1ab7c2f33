"""Recorded NVML answers: decoding an `nvml.json` like the recorded H200's.

`RecordedNvml` serves a decoded recording as a backend, and the simulation (`gpuop_sim`,
whose `recordings` hold the H200's) seeds its GPUs from one.

Values are exactly the recording's. What the recording did not capture, or captured as
NotSupported (its `errors` section lists fan speed, NUMA node, NVLink state and retired
pages on the H200), decodes as `None`, as from a GPU that answers NotSupported. The H200
recording's memory query was v1, so its `memory_reserved_bytes` is `None` and its
`memory_used_bytes` includes the driver's reserve.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuop.nvml.devices import ARCHITECTURES, BRANDS, COMPUTE_MODES, DeviceInfo, cuda_version
from gpuop.nvml.metrics import (
    ClockEventReason,
    DeviceMetrics,
    FieldValue,
    PcieThroughput,
    ProcessInfo,
)
from gpuop.nvml.watching import instance_id


@dataclass(frozen=True, slots=True)
class RecordedDevice:
    """Everything one GPU answered when it was recorded."""

    info: DeviceInfo
    metrics: DeviceMetrics
    pcie: PcieThroughput
    field_values: tuple[FieldValue, ...]


@dataclass(frozen=True, slots=True)
class Recording:
    """A recorded `nvml.json`, decoded."""

    driver_version: str
    nvml_version: str
    cuda_driver_version: str
    """`major.minor`, decoded from NVML's integer (13000 is `13.0`)."""
    devices: tuple[RecordedDevice, ...]


def load_recording(path: Path) -> Recording:
    """Decode the recorded `nvml.json` at `path`."""
    source = path.read_text()
    try:
        document = json.loads(source)
        calls = document["calls"]
        devices = tuple(
            _device(index, answers) for index, answers in enumerate(document["devices"])
        )
        return Recording(
            driver_version=str(calls["driver_version"]),
            nvml_version=str(calls["nvml_version"]),
            cuda_driver_version=cuda_version(int(calls["cuda_driver_version"])),
            devices=devices,
        )
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ValueError(f"{path}: not a usable NVML recording: {exc!r}") from exc


def _device(index: int, answers: dict[str, Any]) -> RecordedDevice:
    pci = answers["pci_info"]
    memory = answers["memory_info"]
    mig = answers.get("mig_mode")
    ecc = answers.get("ecc_mode")
    persistence = answers.get("persistence_mode")
    info = DeviceInfo(
        index=index,
        uuid=str(answers["uuid"]),
        name=str(answers["name"]),
        serial=_str(answers.get("serial")),
        pci_bus_id=str(pci["busId"]),
        pci_device_id=int(pci["pciDeviceId"]),
        pci_subsystem_id=int(pci["pciSubSystemId"]),
        minor_number=int(answers["minor_number"]),
        memory_total_bytes=int(memory["total"]),
        compute_capability_major=int(answers["cuda_compute_capability"][0]),
        compute_capability_minor=int(answers["cuda_compute_capability"][1]),
        architecture=ARCHITECTURES.get(_code(answers.get("architecture"), -1)),
        brand=BRANDS.get(_code(answers.get("brand"), -1)),
        mig_mode_current=None if mig is None else bool(mig[0]),
        mig_mode_pending=None if mig is None else bool(mig[1]),
        max_mig_devices=_int(answers.get("max_mig_device_count")),
        numa_node=_int(answers.get("numa_node")),
        vbios_version=_str(answers.get("vbios")),
        inforom_image_version=_str(answers.get("inforom_image")),
        board_part_number=_str(answers.get("board_part_number")),
        persistence_mode=None if persistence is None else bool(persistence),
        compute_mode=COMPUTE_MODES.get(_code(answers.get("compute_mode"), -1)),
        ecc_enabled=None if ecc is None else bool(ecc[0]),
        power_limit_mw=_int(answers.get("power_limit_mw")),
        max_sm_clock_mhz=_int(answers.get("max_clock_sm_mhz")),
    )
    utilization = answers.get("utilization") or {}
    encoder = answers.get("encoder_util")
    rows = answers.get("remapped_rows")
    reasons = answers.get("throttle_reasons")
    retired = answers.get("retired_pages_pending")
    metrics = DeviceMetrics(
        index=index,
        memory_used_bytes=_int(memory.get("used")),
        memory_free_bytes=_int(memory.get("free")),
        memory_reserved_bytes=_int(memory.get("reserved")),
        gpu_utilization_percent=_int(utilization.get("gpu")),
        memory_utilization_percent=_int(utilization.get("memory")),
        encoder_utilization_percent=None if encoder is None else int(encoder[0]),
        temperature_celsius=_int(answers.get("temperature_gpu")),
        fan_speed_percent=_int(answers.get("fan_speed")),
        power_usage_mw=_int(answers.get("power_usage_mw")),
        total_energy_mj=_int(answers.get("total_energy_mj")),
        sm_clock_mhz=_int(answers.get("clock_sm_mhz")),
        memory_clock_mhz=_int(answers.get("clock_mem_mhz")),
        performance_state=_int(answers.get("performance_state")),
        clock_event_reasons=None if reasons is None else ClockEventReason(int(reasons)),
        ecc_volatile_corrected=_int(answers.get("ecc_volatile_corrected")),
        ecc_volatile_uncorrected=_int(answers.get("ecc_volatile_uncorrected")),
        ecc_aggregate_corrected=_int(answers.get("ecc_aggregate_corrected")),
        ecc_aggregate_uncorrected=_int(answers.get("ecc_aggregate_uncorrected")),
        remapped_rows_correctable=None if rows is None else int(rows[0]),
        remapped_rows_uncorrectable=None if rows is None else int(rows[1]),
        remapped_rows_pending=None if rows is None else bool(rows[2]),
        remapped_rows_failure=None if rows is None else bool(rows[3]),
        retired_pages_pending=None if retired is None else bool(retired),
        pcie_replay_count=_int(answers.get("pcie_replay")),
        processes=tuple(_process(p) for p in answers.get("compute_procs") or ()),
        pcie_link_generation=_int(answers.get("pcie_link_gen")),
        pcie_link_width=_int(answers.get("pcie_link_width")),
        pcie_max_link_generation=_int(answers.get("pcie_max_link_gen")),
        pcie_max_link_width=_int(answers.get("pcie_max_link_width")),
    )
    pcie = PcieThroughput(
        index=index,
        tx_kilobytes_per_second=_int(answers.get("pcie_tx_kbps")),
        rx_kilobytes_per_second=_int(answers.get("pcie_rx_kbps")),
    )
    fields = tuple(_field(f) for f in answers.get("field_values") or ())
    return RecordedDevice(info=info, metrics=metrics, pcie=pcie, field_values=fields)


def _process(answer: dict[str, Any]) -> ProcessInfo:
    return ProcessInfo(
        pid=int(answer["pid"]),
        used_memory_bytes=_int(answer.get("usedGpuMemory")),
        gpu_instance_id=instance_id(_code(answer.get("gpuInstanceId"), 0xFFFFFFFF)),
        compute_instance_id=instance_id(_code(answer.get("computeInstanceId"), 0xFFFFFFFF)),
    )


def _field(answer: dict[str, Any]) -> FieldValue:
    code = int(answer["nvmlReturn"])
    raw = answer.get("value")
    if code != 0 or raw is None:
        return FieldValue(int(answer["fieldId"]), code, None)
    value: int | float = float(raw) if int(answer.get("valueType", 0)) == 0 else int(raw)
    return FieldValue(int(answer["fieldId"]), code, value)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _code(value: Any, absent: int) -> int:
    """An NVML enum answer as a lookup key; `absent` (matching nothing) when not recorded."""
    return absent if value is None else int(value)


def _str(value: Any) -> str | None:
    return None if value is None else str(value)
