"""The NVML seam: what node services may ask of a GPU driver, whatever answers.

`PynvmlBackend` (nvidia-ml-py, on a node), `SimNvml` (simulated GPUs for tests and the demo)
and `RecordedNvml` (the answers recorded on a real H200) all satisfy `Nvml`; services build
one with `backends.open_backend()` from `--nvml` and receive it in their constructor.
Discovery reads inventory, the device plugin inventory, topology, MIG devices and health
events, telemetry metrics and events, the driver manager's validation the versions and count.
The one writer is the driver-manager's MIG step: the real and simulated backends also satisfy
`mig.MigControl` (mode, GPU and compute instances), which `mig_layout.apply` drives.

An `Nvml` is a session. `init()` opens it and holds the GPU device files, which is what keeps
the `nvidia` kernel module in use: a driver reload needs every node service to `shutdown()`
first (the pause command). Every query outside an open session raises
`errors.NotInitialized`; a GPU index past `device_count()` raises `errors.InvalidArgument`.

Methods are synchronous: NVML answers in microseconds. Two queries do not, and must stay off
any hot path (run them on their own slower loop or in a thread, never per scrape):
`pcie_throughput()` blocks for about 21 ms while NVML samples, and `field_values()` took
3.4 ms (p90 5.9 ms) for 7 fields on a real H200. `EventWatcher.wait()` blocks by design.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol, TypeVar

from gpuop.nvml.devices import DeviceInfo
from gpuop.nvml.metrics import DeviceMetrics, FieldValue, PcieThroughput
from gpuop.nvml.mig import MigDevice, MigProfile
from gpuop.nvml.profiling import Activity
from gpuop.nvml.topology import NvLink, PeerTopology
from gpuop.nvml.watching import EventWatcher


class Nvml(Protocol):
    """One NVML session on one node."""

    def init(self) -> None:
        """Open the session; a no-op when it is open. Raises `errors.DriverUnavailable`
        (`DriverNotLoaded`, `LibraryNotFound`, `DriverMismatch`) when NVML cannot start."""
        ...

    def shutdown(self) -> None:
        """Close open event watchers and the session, letting go of the GPUs; a no-op when
        closed."""
        ...

    def driver_version(self) -> str:
        """Loaded kernel driver version: `580.159.04`."""
        ...

    def cuda_driver_version(self) -> str:
        """Highest CUDA version the driver supports, `major.minor`: `13.0`."""
        ...

    def nvml_version(self) -> str:
        """NVML library version: `13.580.159.04`."""
        ...

    def device_count(self) -> int:
        """How many GPUs NVML sees; their indices are `0 .. count-1`."""
        ...

    def device_info(self, index: int) -> DeviceInfo:
        """Inventory of one GPU; constant while the driver stays loaded."""
        ...

    def metrics(self, index: int) -> DeviceMetrics:
        """The fast metrics of one GPU: tens of microseconds in all."""
        ...

    def pcie_throughput(self, index: int) -> PcieThroughput:
        """PCIe TX and RX rates. Slow: blocks about 21 ms per GPU. Off the hot path."""
        ...

    def field_values(self, index: int, field_ids: Sequence[int]) -> tuple[FieldValue, ...]:
        """Batched `NVML_FI_DEV_*` values, one per id in order. Slow: about 3.4 ms a call."""
        ...

    def activity(self, index: int, gpu_instance_id: int | None = None) -> Activity:
        """GPM profiling of the GPU, or of one of its MIG GPU instances, since the previous
        call for it in this session (`profiling`); every value None on the first call.
        Raises `NotSupported` where the GPU has no GPM (before Hopper). A sample each:
        tens of microseconds, but it belongs on the slow loop with the other rates."""
        ...

    def nvlinks(self, index: int) -> tuple[NvLink, ...]:
        """The GPU's NVLinks; empty when it has none or NVML answers NotSupported."""
        ...

    def topology(self, index: int, peer: int) -> PeerTopology:
        """PCIe proximity and NVLink reachability between two GPUs."""
        ...

    def mig_profiles(self, index: int) -> tuple[MigProfile, ...]:
        """GPU instance profiles the GPU supports; empty when it cannot do MIG."""
        ...

    def mig_devices(self, index: int) -> tuple[MigDevice, ...]:
        """The GPU's MIG devices; empty unless MIG mode is on and instances exist."""
        ...

    def watch_events(self, indices: Sequence[int] | None = None) -> EventWatcher:
        """Start watching XID and ECC events on the given GPUs (default: all)."""
        ...


N = TypeVar("N", bound=Nvml)


@contextmanager
def opened(nvml: N) -> Iterator[N]:
    """`with opened(backend) as nvml:` runs `init()` and always `shutdown()` after."""
    nvml.init()
    try:
        yield nvml
    finally:
        nvml.shutdown()


def inventory(nvml: Nvml) -> tuple[DeviceInfo, ...]:
    """`device_info()` of every GPU, by index."""
    return tuple(nvml.device_info(index) for index in range(nvml.device_count()))
