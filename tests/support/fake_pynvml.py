"""A stand-in `pynvml` module that answers from the recorded H200 (nvml.json).

Constants, structures' field names and the exception classes are the real nvidia-ml-py's
(importing it needs no GPU); the functions answer with what the recording captured. A
recorded `null` raises the error the recording lists for it in `errors` (NotSupported for
fan speed, NUMA node, NVLink state, retired pages); a query the recording did not capture
raises NotSupported too, and a function it never needed is simply missing. `FakePynvml.calls`
lists every call by name, so tests can prove which functions the backend used.
"""

from __future__ import annotations

import json
import re
import time
import types
from collections import deque
from pathlib import Path
from typing import Any

import pynvml as real

DEVICE_ANSWERS = {
    "nvmlDeviceGetName": "name",
    "nvmlDeviceGetUUID": "uuid",
    "nvmlDeviceGetSerial": "serial",
    "nvmlDeviceGetMinorNumber": "minor_number",
    "nvmlDeviceGetMigMode": "mig_mode",
    "nvmlDeviceGetMaxMigDeviceCount": "max_mig_device_count",
    "nvmlDeviceGetEccMode": "ecc_mode",
    "nvmlDeviceGetNumaNodeId": "numa_node",
    "nvmlDeviceGetVbiosVersion": "vbios",
    "nvmlDeviceGetInforomImageVersion": "inforom_image",
    "nvmlDeviceGetBoardPartNumber": "board_part_number",
    "nvmlDeviceGetBrand": "brand",
    "nvmlDeviceGetArchitecture": "architecture",
    "nvmlDeviceGetPersistenceMode": "persistence_mode",
    "nvmlDeviceGetComputeMode": "compute_mode",
    "nvmlDeviceGetPowerManagementLimit": "power_limit_mw",
    "nvmlDeviceGetPowerUsage": "power_usage_mw",
    "nvmlDeviceGetTotalEnergyConsumption": "total_energy_mj",
    "nvmlDeviceGetPerformanceState": "performance_state",
    "nvmlDeviceGetCurrentClocksEventReasons": "throttle_reasons",
    "nvmlDeviceGetRetiredPagesPendingStatus": "retired_pages_pending",
    "nvmlDeviceGetFanSpeed": "fan_speed",
    "nvmlDeviceGetPcieReplayCounter": "pcie_replay",
    "nvmlDeviceGetCurrPcieLinkGeneration": "pcie_link_gen",
    "nvmlDeviceGetCurrPcieLinkWidth": "pcie_link_width",
    "nvmlDeviceGetMaxPcieLinkGeneration": "pcie_max_link_gen",
    "nvmlDeviceGetMaxPcieLinkWidth": "pcie_max_link_width",
    "nvmlDeviceGetEncoderUtilization": "encoder_util",
    "nvmlDeviceGetSupportedEventTypes": "supported_event_types",
}
"""pynvml functions of one device handle, and the recording's key for their answer."""
VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


class Handle:
    """A device handle: which GPU of the recording it stands for."""

    def __init__(self, index: int) -> None:
        self.index = index


class FakePynvml:
    """The recording, served as pynvml functions on `module`."""

    def __init__(self, path: Path) -> None:
        self.recording = json.loads(path.read_text())
        self.calls: list[str] = []
        self.events: deque[Any] = deque()
        """Event data `nvmlEventSetWait_v2` hands out before it times out."""
        self.registered: dict[int, int] = {}
        """Event mask registered per device index."""
        self.open_sessions = 0
        self.module = types.ModuleType("pynvml")
        for name, value in vars(real).items():
            if name.startswith(("NVMLError", "c_nvml")) or (
                name.startswith(("NVML_", "nvml")) and isinstance(value, int)
            ):
                setattr(self.module, name, value)
        for function, key in DEVICE_ANSWERS.items():
            self.define(function, self._device_answer(key))
        for function in dir(self):
            if function.startswith("nvml"):
                self.define(function, getattr(self, function))

    def define(self, function: str, answer: Any) -> None:
        """Install (or replace) `pynvml.<function>`, logging each call."""

        def logged(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(function)
            return answer(*args, **kwargs)

        setattr(self.module, function, logged)

    def fail(self, function: str, code: int) -> None:
        """Make `pynvml.<function>` raise NVMLError with `code`."""

        def failing(*_: Any, **__: Any) -> Any:
            raise real.NVMLError(code)

        self.define(function, failing)

    def answer(self, index: int, key: str) -> Any:
        """The recorded answer, raising what the recording says when it has none."""
        device = self.recording["devices"][index]
        value = device.get(key)
        if value is None:
            recorded = self.recording["errors"].get(f"{index}.{key}", "")
            match = re.search(r"\((\d+)\)", recorded)
            raise real.NVMLError(int(match[1]) if match else real.NVML_ERROR_NOT_SUPPORTED)
        return value

    def _device_answer(self, key: str) -> Any:
        def answer(handle: Handle) -> Any:
            value = self.answer(handle.index, key)
            return tuple(value) if isinstance(value, list) else value

        return answer

    # System and session.

    def nvmlInit(self) -> None:
        self.open_sessions += 1

    def nvmlShutdown(self) -> None:
        self.open_sessions -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return str(self.recording["calls"]["driver_version"])

    def nvmlSystemGetNVMLVersion(self) -> str:
        return str(self.recording["calls"]["nvml_version"])

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return int(self.recording["calls"]["cuda_driver_version"])

    def nvmlDeviceGetCount(self) -> int:
        return int(self.recording["calls"]["device_count"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        if not 0 <= index < self.nvmlDeviceGetCount():
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return Handle(index)

    # Device queries whose answer depends on an argument or has a shape.

    def nvmlDeviceGetPciInfo(self, handle: Handle) -> Any:
        return types.SimpleNamespace(**self.answer(handle.index, "pci_info"))

    def nvmlDeviceGetMemoryInfo(self, handle: Handle, version: int | None = None) -> Any:
        key = "memory_info" if not version else "memory_info_v2"
        return types.SimpleNamespace(**self.answer(handle.index, key))

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> Any:
        return types.SimpleNamespace(**self.answer(handle.index, "utilization"))

    def nvmlDeviceGetCudaComputeCapability(self, handle: Handle) -> tuple[int, int]:
        major, minor = self.answer(handle.index, "cuda_compute_capability")
        return major, minor

    def nvmlDeviceGetRemappedRows(self, handle: Handle) -> tuple[int, int, int, int]:
        corrected, uncorrected, pending, failure = self.answer(handle.index, "remapped_rows")
        return corrected, uncorrected, pending, failure

    def nvmlDeviceGetTemperatureV(self, handle: Handle, sensor: int) -> int:
        assert sensor == real.NVML_TEMPERATURE_GPU
        return int(self.answer(handle.index, "temperature_gpu"))

    def nvmlDeviceGetClockInfo(self, handle: Handle, clock: int) -> int:
        key = {real.NVML_CLOCK_SM: "clock_sm_mhz", real.NVML_CLOCK_MEM: "clock_mem_mhz"}
        return int(self.answer(handle.index, key.get(clock, f"clock_{clock}")))

    def nvmlDeviceGetMaxClockInfo(self, handle: Handle, clock: int) -> int:
        key = "max_clock_sm_mhz" if clock == real.NVML_CLOCK_SM else f"max_clock_{clock}"
        return int(self.answer(handle.index, key))

    def nvmlDeviceGetTotalEccErrors(self, handle: Handle, error: int, counter: int) -> int:
        kind = "corrected" if error == real.NVML_MEMORY_ERROR_TYPE_CORRECTED else "uncorrected"
        scope = "volatile" if counter == real.NVML_VOLATILE_ECC else "aggregate"
        return int(self.answer(handle.index, f"ecc_{scope}_{kind}"))

    def nvmlDeviceGetPcieThroughput(self, handle: Handle, counter: int) -> int:
        key = "pcie_tx_kbps" if counter == real.NVML_PCIE_UTIL_TX_BYTES else "pcie_rx_kbps"
        return int(self.answer(handle.index, key))

    def nvmlDeviceGetNvLinkState(self, handle: Handle, link: int) -> int:
        return int(self.answer(handle.index, f"nvlink_state_{link}"))

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Handle) -> list[Any]:
        return [types.SimpleNamespace(**p) for p in self.answer(handle.index, "compute_procs")]

    def nvmlDeviceGetFieldValues(self, handle: Handle, field_ids: list[int]) -> list[Any]:
        recorded = {f["fieldId"]: f for f in self.answer(handle.index, "field_values")}
        answers = []
        for field_id in field_ids:
            f = recorded.get(field_id)
            if f is None:
                f = {"fieldId": field_id, "nvmlReturn": 3, "valueType": 0, "value": 0.0}
            value = types.SimpleNamespace(**{VALUE_MEMBERS[f["valueType"]]: f["value"]})
            answers.append(
                types.SimpleNamespace(
                    fieldId=f["fieldId"],
                    nvmlReturn=f["nvmlReturn"],
                    valueType=f["valueType"],
                    value=value,
                )
            )
        return answers

    # Events: the recording's wait timed out ("no event in 200ms: Timeout").

    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlDeviceRegisterEvents(self, handle: Handle, mask: int, event_set: object) -> None:
        self.registered[handle.index] = mask

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> Any:
        if self.events:
            return self.events.popleft()
        time.sleep(timeout_ms / 1000)
        raise real.NVMLError(real.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, event_set: object) -> None:
        return None
