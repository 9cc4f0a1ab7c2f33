"""`PynvmlBackend`: the `Nvml` protocol on nvidia-ml-py, for real GPU nodes.

Built by `backends.open_backend("real")` in the node services. Every pynvml call goes
through `binding.Binding`, which maps NVML's return codes to `errors.py`; a query the GPU
answers NotSupported becomes `None` in the returned dataclass. NVML's deprecated
calls are avoided: temperature through `nvmlDeviceGetTemperatureV`,
clock reasons through `nvmlDeviceGetCurrentClocksEventReasons`, memory through the v2 query
(falling back to v1 on drivers that predate it, which leaves `memory_reserved_bytes` empty).
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import uuid
from collections.abc import Sequence
from typing import Any

from gpuop.nvml import real_mig, real_topology
from gpuop.nvml.binding import Binding, load_pynvml, text
from gpuop.nvml.devices import ARCHITECTURES, BRANDS, COMPUTE_MODES, DeviceInfo, cuda_version
from gpuop.nvml.errors import (
    FunctionNotFound,
    InvalidArgument,
    NotInitialized,
    NotSupported,
    NvmlError,
)
from gpuop.nvml.metrics import (
    ClockEventReason,
    DeviceMetrics,
    FieldValue,
    PcieThroughput,
    ProcessInfo,
)
from gpuop.nvml.mig import GpuInstance, MigDevice, MigModeState, MigProfile, Placement
from gpuop.nvml.profiling import Activity
from gpuop.nvml.real_gpm import GpmSampler
from gpuop.nvml.real_watching import PynvmlEventWatcher
from gpuop.nvml.topology import NvLink, PeerTopology
from gpuop.nvml.watching import EventWatcher, WatcherSet, instance_id

UNKNOWN_PSTATE = 32
"""`NVML_PSTATE_UNKNOWN`."""
FIELD_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
"""`c_nvmlValue_t` members by `NVML_VALUE_TYPE_*` (0 double, 1 unsigned int, ...)."""


class PynvmlBackend:
    """NVML through nvidia-ml-py; `module` replaces `pynvml` (tests pass a fake)."""

    def __init__(self, module: Any | None = None) -> None:
        self._nvml = Binding(module if module is not None else load_pynvml())
        self._handles: list[Any] | None = None
        self._uuids: dict[str, int] = {}
        self._watchers: WatcherSet[PynvmlEventWatcher] = WatcherSet()
        self._memory_v2 = True
        self._gpm = GpmSampler(self._nvml)
        self._lock = threading.Lock()

    def init(self) -> None:
        with self._lock:
            if self._handles is not None:
                return
            nvml = self._nvml
            nvml.call("nvmlInit")
            try:
                count = int(nvml.call("nvmlDeviceGetCount"))
                handles = [nvml.call("nvmlDeviceGetHandleByIndex", i) for i in range(count)]
                uuids = {text(nvml.call("nvmlDeviceGetUUID", h)): i for i, h in enumerate(handles)}
            except NvmlError:
                with contextlib.suppress(NvmlError):
                    nvml.call("nvmlShutdown")
                raise
            self._handles, self._uuids = handles, uuids

    def shutdown(self) -> None:
        self._watchers.close_all()
        with self._lock:
            if self._handles is None:
                return
            self._handles = None
            self._gpm.free()
            self._nvml.call("nvmlShutdown")

    def driver_version(self) -> str:
        self._session()
        return text(self._nvml.call("nvmlSystemGetDriverVersion"))

    def cuda_driver_version(self) -> str:
        self._session()
        return cuda_version(int(self._nvml.call("nvmlSystemGetCudaDriverVersion")))

    def nvml_version(self) -> str:
        self._session()
        return text(self._nvml.call("nvmlSystemGetNVMLVersion"))

    def device_count(self) -> int:
        return len(self._session())

    def device_info(self, index: int) -> DeviceInfo:
        h, nvml = self._handle(index), self._nvml
        pci = nvml.call("nvmlDeviceGetPciInfo", h)
        major, minor = nvml.call("nvmlDeviceGetCudaComputeCapability", h)
        mig = nvml.optional("nvmlDeviceGetMigMode", h)
        ecc = nvml.optional("nvmlDeviceGetEccMode", h)
        numa = nvml.optional("nvmlDeviceGetNumaNodeId", h)
        compute_mode = nvml.optional("nvmlDeviceGetComputeMode", h)
        persistence = nvml.optional("nvmlDeviceGetPersistenceMode", h)
        return DeviceInfo(
            index=index,
            uuid=text(nvml.call("nvmlDeviceGetUUID", h)),
            name=text(nvml.call("nvmlDeviceGetName", h)),
            serial=_text_or_none(nvml.optional("nvmlDeviceGetSerial", h)),
            pci_bus_id=text(pci.busId),
            pci_device_id=int(pci.pciDeviceId),
            pci_subsystem_id=int(pci.pciSubSystemId),
            minor_number=int(nvml.call("nvmlDeviceGetMinorNumber", h)),
            memory_total_bytes=int(nvml.call("nvmlDeviceGetMemoryInfo", h).total),
            compute_capability_major=int(major),
            compute_capability_minor=int(minor),
            architecture=ARCHITECTURES.get(_int(nvml.optional("nvmlDeviceGetArchitecture", h))),
            brand=BRANDS.get(_int(nvml.optional("nvmlDeviceGetBrand", h))),
            mig_mode_current=None if mig is None else bool(mig[0]),
            mig_mode_pending=None if mig is None else bool(mig[1]),
            max_mig_devices=_int_or_none(nvml.optional("nvmlDeviceGetMaxMigDeviceCount", h)),
            numa_node=None if numa is None or int(numa) < 0 else int(numa),
            vbios_version=_text_or_none(nvml.optional("nvmlDeviceGetVbiosVersion", h)),
            inforom_image_version=_text_or_none(
                nvml.optional("nvmlDeviceGetInforomImageVersion", h)
            ),
            board_part_number=_text_or_none(nvml.optional("nvmlDeviceGetBoardPartNumber", h)),
            persistence_mode=None if persistence is None else bool(persistence),
            compute_mode=COMPUTE_MODES.get(_int(compute_mode)),
            ecc_enabled=None if ecc is None else bool(ecc[0]),
            power_limit_mw=_int_or_none(nvml.optional("nvmlDeviceGetPowerManagementLimit", h)),
            max_sm_clock_mhz=_int_or_none(
                nvml.optional("nvmlDeviceGetMaxClockInfo", h, nvml.constant("NVML_CLOCK_SM"))
            ),
            fabric_clique=fabric_clique(nvml, h),
        )

    def metrics(self, index: int) -> DeviceMetrics:
        h, nvml = self._handle(index), self._nvml
        used, free, reserved = self._memory(h)
        utilization = nvml.optional("nvmlDeviceGetUtilizationRates", h)
        encoder = nvml.optional("nvmlDeviceGetEncoderUtilization", h)
        pstate = _int_or_none(nvml.optional("nvmlDeviceGetPerformanceState", h))
        reasons = nvml.optional("nvmlDeviceGetCurrentClocksEventReasons", h)
        rows = nvml.optional("nvmlDeviceGetRemappedRows", h)
        retired = nvml.optional("nvmlDeviceGetRetiredPagesPendingStatus", h)
        return DeviceMetrics(
            index=index,
            memory_used_bytes=used,
            memory_free_bytes=free,
            memory_reserved_bytes=reserved,
            gpu_utilization_percent=None if utilization is None else int(utilization.gpu),
            memory_utilization_percent=None if utilization is None else int(utilization.memory),
            encoder_utilization_percent=None if encoder is None else int(encoder[0]),
            temperature_celsius=_int_or_none(
                nvml.optional("nvmlDeviceGetTemperatureV", h, nvml.constant("NVML_TEMPERATURE_GPU"))
            ),
            fan_speed_percent=_int_or_none(nvml.optional("nvmlDeviceGetFanSpeed", h)),
            power_usage_mw=_int_or_none(nvml.optional("nvmlDeviceGetPowerUsage", h)),
            total_energy_mj=_int_or_none(nvml.optional("nvmlDeviceGetTotalEnergyConsumption", h)),
            sm_clock_mhz=self._clock(h, "NVML_CLOCK_SM"),
            memory_clock_mhz=self._clock(h, "NVML_CLOCK_MEM"),
            performance_state=None if pstate == UNKNOWN_PSTATE else pstate,
            clock_event_reasons=None if reasons is None else _reasons(int(reasons)),
            ecc_volatile_corrected=self._ecc(h, "CORRECTED", "VOLATILE"),
            ecc_volatile_uncorrected=self._ecc(h, "UNCORRECTED", "VOLATILE"),
            ecc_aggregate_corrected=self._ecc(h, "CORRECTED", "AGGREGATE"),
            ecc_aggregate_uncorrected=self._ecc(h, "UNCORRECTED", "AGGREGATE"),
            remapped_rows_correctable=None if rows is None else int(rows[0]),
            remapped_rows_uncorrectable=None if rows is None else int(rows[1]),
            remapped_rows_pending=None if rows is None else bool(rows[2]),
            remapped_rows_failure=None if rows is None else bool(rows[3]),
            retired_pages_pending=None if retired is None else bool(retired),
            pcie_replay_count=_int_or_none(nvml.optional("nvmlDeviceGetPcieReplayCounter", h)),
            processes=self._processes(h),
            pcie_link_generation=_int_or_none(
                nvml.optional("nvmlDeviceGetCurrPcieLinkGeneration", h)
            ),
            pcie_link_width=_int_or_none(nvml.optional("nvmlDeviceGetCurrPcieLinkWidth", h)),
            pcie_max_link_generation=_int_or_none(
                nvml.optional("nvmlDeviceGetMaxPcieLinkGeneration", h)
            ),
            pcie_max_link_width=_int_or_none(nvml.optional("nvmlDeviceGetMaxPcieLinkWidth", h)),
        )

    def pcie_throughput(self, index: int) -> PcieThroughput:
        h, nvml = self._handle(index), self._nvml
        tx, rx = (
            _int_or_none(nvml.optional("nvmlDeviceGetPcieThroughput", h, nvml.constant(name)))
            for name in ("NVML_PCIE_UTIL_TX_BYTES", "NVML_PCIE_UTIL_RX_BYTES")
        )
        return PcieThroughput(index=index, tx_kilobytes_per_second=tx, rx_kilobytes_per_second=rx)

    def field_values(self, index: int, field_ids: Sequence[int]) -> tuple[FieldValue, ...]:
        h = self._handle(index)
        if not field_ids:
            return ()
        answers = self._nvml.call("nvmlDeviceGetFieldValues", h, [int(f) for f in field_ids])
        return tuple(_field_value(answer) for answer in answers)

    def activity(self, index: int, gpu_instance_id: int | None = None) -> Activity:
        return self._gpm.activity(index, self._handle(index), gpu_instance_id)

    def nvlinks(self, index: int) -> tuple[NvLink, ...]:
        return real_topology.read_nvlinks(self._nvml, self._handle(index))

    def topology(self, index: int, peer: int) -> PeerTopology:
        h, other = self._handle(index), self._handle(peer)
        return real_topology.read_topology(self._nvml, index, h, peer, other)

    def mig_profiles(self, index: int) -> tuple[MigProfile, ...]:
        return real_mig.read_profiles(self._nvml, self._handle(index), placements=True)

    def mig_devices(self, index: int) -> tuple[MigDevice, ...]:
        h = self._handle(index)
        uuid = text(self._nvml.call("nvmlDeviceGetUUID", h))
        return real_mig.read_devices(self._nvml, h, index, uuid)

    # MigControl: root only; see `real_mig`.

    def mig_mode(self, index: int) -> MigModeState:
        return real_mig.mig_mode(self._nvml, self._handle(index))

    def set_mig_mode(self, index: int, enabled: bool) -> MigModeState:
        return real_mig.set_mig_mode(self._nvml, self._handle(index), enabled)

    def gpu_instances(self, index: int) -> tuple[GpuInstance, ...]:
        h = self._handle(index)
        if not real_mig.mig_enabled(self._nvml, h):
            return ()  # NVML lists instances only while MIG is on
        profiles = real_mig.read_profiles(self._nvml, h)
        return real_mig.gpu_instances(self._nvml, h, profiles, self.mig_devices(index))

    def create_gpu_instance(self, index: int, profile_id: int, placement: Placement) -> int:
        return real_mig.create_gpu_instance(self._nvml, self._handle(index), profile_id, placement)

    def destroy_gpu_instance(self, index: int, gpu_instance_id: int) -> None:
        real_mig.destroy_gpu_instance(self._nvml, self._handle(index), gpu_instance_id)

    def create_compute_instance(self, index: int, gpu_instance_id: int) -> int:
        h = self._handle(index)
        profiles = real_mig.read_profiles(self._nvml, h)
        return real_mig.create_compute_instance(self._nvml, h, gpu_instance_id, profiles)

    def destroy_compute_instance(
        self, index: int, gpu_instance_id: int, compute_instance_id: int
    ) -> None:
        h = self._handle(index)
        real_mig.destroy_compute_instance(self._nvml, h, gpu_instance_id, compute_instance_id)

    def watch_events(self, indices: Sequence[int] | None = None) -> EventWatcher:
        handles = self._session()
        chosen = range(len(handles)) if indices is None else indices
        watched = {index: self._handle(index) for index in chosen}
        watcher = PynvmlEventWatcher(self._nvml, watched, self._uuids, self._watchers.discard)
        return self._watchers.add(watcher)

    def _session(self) -> list[Any]:
        handles = self._handles
        if handles is None:
            raise NotInitialized("the NVML session is not open: call init() first")
        return handles

    def _handle(self, index: int) -> Any:
        handles = self._session()
        if not 0 <= index < len(handles):
            raise InvalidArgument(f"no GPU at index {index}: NVML sees {len(handles)}")
        return handles[index]

    def _memory(self, h: Any) -> tuple[int | None, int | None, int | None]:
        nvml = self._nvml
        if self._memory_v2:
            try:
                memory = nvml.call("nvmlDeviceGetMemoryInfo", h, version=nvml.lib.nvmlMemory_v2)
            except NotSupported:
                self._memory_v2 = False  # the driver predates v2; do not ask again
            else:
                return int(memory.used), int(memory.free), int(memory.reserved)
        memory = nvml.optional("nvmlDeviceGetMemoryInfo", h)
        if memory is None:
            return None, None, None
        return int(memory.used), int(memory.free), None

    def _clock(self, h: Any, clock: str) -> int | None:
        nvml = self._nvml
        return _int_or_none(nvml.optional("nvmlDeviceGetClockInfo", h, nvml.constant(clock)))

    def _ecc(self, h: Any, error_type: str, counter: str) -> int | None:
        nvml = self._nvml
        return _int_or_none(
            nvml.optional(
                "nvmlDeviceGetTotalEccErrors",
                h,
                nvml.constant(f"NVML_MEMORY_ERROR_TYPE_{error_type}"),
                nvml.constant(f"NVML_{counter}_ECC"),
            )
        )

    def _processes(self, h: Any) -> tuple[ProcessInfo, ...]:
        nvml = self._nvml
        found = nvml.optional("nvmlDeviceGetComputeRunningProcesses_v3", h)
        if found is None:
            found = nvml.optional("nvmlDeviceGetComputeRunningProcesses_v2", h) or []
        return tuple(
            ProcessInfo(
                pid=int(p.pid),
                used_memory_bytes=_int_or_none(p.usedGpuMemory),
                gpu_instance_id=instance_id(int(getattr(p, "gpuInstanceId", 0xFFFFFFFF))),
                compute_instance_id=instance_id(int(getattr(p, "computeInstanceId", 0xFFFFFFFF))),
            )
            for p in found
        )


def _field_value(answer: Any) -> FieldValue:
    code = int(answer.nvmlReturn)
    if code != 0:
        return FieldValue(field_id=int(answer.fieldId), return_code=code, value=None)
    kind = int(answer.valueType)
    if not 0 <= kind < len(FIELD_VALUE_MEMBERS):
        raise NvmlError(f"field {int(answer.fieldId)}: unknown NVML value type {kind}")
    raw = getattr(answer.value, FIELD_VALUE_MEMBERS[kind])
    value: int | float = float(raw) if kind == 0 else int(raw)
    return FieldValue(field_id=int(answer.fieldId), return_code=0, value=value)


def _reasons(mask: int) -> ClockEventReason:
    # bits a newer driver defines stay out rather than fail the whole reading
    return ClockEventReason(mask & _KNOWN_REASONS)


_KNOWN_REASONS = sum(reason.value for reason in ClockEventReason)


def _int(value: Any) -> int:
    """An optional NVML integer as a dictionary key; -1 (matching nothing) when absent."""
    return -1 if value is None else int(value)


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _text_or_none(value: Any) -> str | None:
    return None if value is None else text(value) or None


FABRIC_COMPLETED = 3
"""`NVML_GPU_FABRIC_STATE_COMPLETED`: the fabric manager registered the GPU."""


def fabric_clique(nvml: Binding, handle: Any) -> str | None:
    """The GPU's NVLink clique, `<clusterUuid>.<cliqueId>`, from `nvmlDeviceGetGpuFabricInfo`;
    None where the GPU has no fabric (NotSupported, or a binding without the call) or its
    registration is not completed or failed."""
    make = getattr(nvml.lib, "c_nvmlGpuFabricInfo_t", None)
    if make is None:
        return None
    info = make()
    try:
        answered = nvml.optional("nvmlDeviceGetGpuFabricInfo", handle, ctypes.byref(info))
    except FunctionNotFound:
        return None
    if answered is None or int(info.state) != FABRIC_COMPLETED or int(info.status) != 0:
        return None
    cluster = uuid.UUID(bytes=bytes(bytearray(info.clusterUuid)))
    return f"{cluster}.{int(info.cliqueId)}"
