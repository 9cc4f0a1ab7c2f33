"""NVML access for node services: one `Nvml` protocol, three backends.

`PynvmlBackend` talks to the driver through nvidia-ml-py, `RecordedNvml` answers from a
recorded `nvml.json`; other backends come from plugins (entry point group `gpuop.nvml`):
`gpuop_sim`'s `SimNvml` simulates H200 nodes for `--nvml sim:<gpus>`. Services get theirs
from `open_backend()` with the `--nvml` flag. Import the concept modules as namespaces:
`from gpuop.nvml import errors, metrics` then `errors.DriverNotLoaded`, `metrics.FieldId`.
"""

from gpuop.nvml import errors
from gpuop.nvml.backends import open_backend
from gpuop.nvml.devices import ComputeMode, DeviceInfo
from gpuop.nvml.errors import (
    DriverNotLoaded,
    DriverUnavailable,
    GpuLost,
    InvalidBackendSpec,
    NotInitialized,
    NotSupported,
    NvmlError,
    NvmlTimeout,
)
from gpuop.nvml.metrics import (
    ClockEventReason,
    DeviceMetrics,
    FieldId,
    FieldValue,
    PcieThroughput,
    ProcessInfo,
)
from gpuop.nvml.mig import MigDevice, MigProfile
from gpuop.nvml.profiling import Activity
from gpuop.nvml.protocol import Nvml, inventory, opened
from gpuop.nvml.real import PynvmlBackend
from gpuop.nvml.recorded import RecordedNvml
from gpuop.nvml.recordings import load_recording
from gpuop.nvml.topology import NvLink, NvLinkRemote, PcieLevel, PeerTopology
from gpuop.nvml.watching import DeviceEvent, EccEvent, EventWatcher, XidEvent

__all__ = [
    "Activity",
    "ClockEventReason",
    "ComputeMode",
    "DeviceEvent",
    "DeviceInfo",
    "DeviceMetrics",
    "DriverNotLoaded",
    "DriverUnavailable",
    "EccEvent",
    "EventWatcher",
    "FieldId",
    "FieldValue",
    "GpuLost",
    "InvalidBackendSpec",
    "MigDevice",
    "MigProfile",
    "NotInitialized",
    "NotSupported",
    "NvLink",
    "NvLinkRemote",
    "Nvml",
    "NvmlError",
    "NvmlTimeout",
    "PcieLevel",
    "PcieThroughput",
    "PeerTopology",
    "ProcessInfo",
    "PynvmlBackend",
    "RecordedNvml",
    "XidEvent",
    "errors",
    "inventory",
    "load_recording",
    "open_backend",
    "opened",
]
