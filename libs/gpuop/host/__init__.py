"""A node's host, seen from a node agent: everything under a host root (`/host` in a pod,
a directory in tests), read with typed readers, and the kernel's modules, changed through
one `KernelOps` protocol, implemented here for a real host (`SubprocessKernelOps`) and by
plugins for a simulated one (`gpuop_sim.host.simkernel`, entry point group `gpuop.kernels`).

Import the pieces as namespaces: `from gpuop.host import pci, system, modules, nvidia`,
then `pci.pci_functions(root)`, `nvidia.driver_version(root)`.

    roots         HostRoot: paths and links under the host root
    pci           PCI functions from sysfs
    system        OS release, kernel release, architecture, boot id, uptime
    modules       proc/modules and sys/module
    nvidia        proc/driver/nvidia: driver version, per-GPU information
    components    driver components, their modules and dependency order
    protocol      KernelOps
    subprocesses  SubprocessKernelOps: modprobe, rmmod, depmod, chrooted
    packages      installed package layout, active versions, module stand-ins
    indexing      the simulated depmod's modules.dep
    packaging     package archives (reproducible), driver sources and their indexes
    manifests     what a package holds: format 1 (stand-ins) and 2 (a real driver)
    kmod          Debian kmod's modinfo and depmod -b on real modules; signatures required?
    building      format 2 packages from Debian's NVIDIA packages or NVIDIA's .run
    cdi_specs     the CDI specs a runtime would load: kind, version, devices, malformed ones
    runtime_handlers  containerd and CRI-O: version, the `nvidia` handler in their config
    gobinaries    the version a Go binary was released as, from its build information
    inotify       a directory watch for asyncio
    errors        the exception tree
"""

from gpuop.host.errors import (
    DepmodFailed,
    HostError,
    HostReadError,
    KernelError,
    KernelToolMissing,
    KernelToolTimedOut,
    ModuleInUse,
    ModuleLoadFailed,
    ModuleNotFound,
    ModuleNotLoaded,
    ModuleUnloadFailed,
)
from gpuop.host.modules import LoadedModule, ModuleInfo
from gpuop.host.nvidia import GpuInformation, NvidiaDriverVersion
from gpuop.host.pci import PciFunction
from gpuop.host.protocol import KernelOps
from gpuop.host.roots import HostRoot
from gpuop.host.subprocesses import SubprocessKernelOps
from gpuop.host.system import HostSystem, OsRelease

__all__ = [
    "DepmodFailed",
    "GpuInformation",
    "HostError",
    "HostReadError",
    "HostRoot",
    "HostSystem",
    "KernelError",
    "KernelOps",
    "KernelToolMissing",
    "KernelToolTimedOut",
    "LoadedModule",
    "ModuleInUse",
    "ModuleInfo",
    "ModuleLoadFailed",
    "ModuleNotFound",
    "ModuleNotLoaded",
    "ModuleUnloadFailed",
    "NvidiaDriverVersion",
    "OsRelease",
    "PciFunction",
    "SubprocessKernelOps",
]
