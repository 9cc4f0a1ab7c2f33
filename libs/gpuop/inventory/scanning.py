"""One node's inventory, taken from its host root and NVML: the `hardware.discovered` event.

Called by discovery's node role on every scan and by `gpuop discover`. The host root gives
the PCI functions, kernel, OS, boot id, loaded modules, DMI product, and the container
runtimes and CDI specs (`containers`); NVML gives the GPUs and the CUDA version. The NVML
session is opened and closed within `scan`, so discovery never keeps the `nvidia` module in
use between scans. Without a loaded driver (NVML says `DriverNotLoaded`) the inventory has
no GPUs and no driver version: that is the node's state in the middle of a driver reload,
not an error.

While the node's operands are paused for a driver reload, discovery must not touch NVML:
`scan(root, None)` reads the host root only, and `with_known_gpus` keeps the GPUs of the
last NVML scan as long as the same driver version is still loaded.
"""

from __future__ import annotations

import logging
import platform
import re

from pydantic import ValidationError

from gpuop.events.driver import Flavour
from gpuop.events.hardware import Gpu, HardwareDiscovered, MigInstance, MigMode, PciFunction
from gpuop.host import modules, nvidia, pci, system
from gpuop.host.errors import HostReadError
from gpuop.host.roots import HostRoot
from gpuop.inventory import containers
from gpuop.nvml.devices import DeviceInfo
from gpuop.nvml.errors import DriverNotLoaded, DriverUnavailable, GpuFailure
from gpuop.nvml.mig import MigDevice
from gpuop.nvml.protocol import Nvml, opened

log = logging.getLogger(__name__)

DMI_PRODUCT_NAME = "sys/class/dmi/id/product_name"
"""The machine model the firmware reports; cloud VMs put the instance type here."""
MANAGED_MODULE_PREFIXES = ("nvidia", "mlx5_", "ib_")
"""Loaded modules an inventory lists: the GPU and OFED driver stacks gpuop manages."""
OFED_CORE_MODULE = "mlx5_core"
"""The module whose declared version is the loaded OFED driver's."""
UNKNOWN_BOOT_ID = "00000000-0000-0000-0000-000000000000"
"""The boot id of an inventory taken from a host root that has none (a recording without
`proc/sys/kernel/random/boot_id`); a mounted host `/proc` always has one."""
PLACEHOLDER_HASH = "0" * 64

_OS_ID = re.compile(r"^[a-z0-9._-]{1,64}$")
_MACHINE = re.compile(r"^[a-z0-9_]{1,32}$")


def scan(root: HostRoot, nvml: Nvml | None) -> HardwareDiscovered:
    """The node's inventory now; `nvml=None` reads the host root only (no GPUs).

    Raises `HostReadError` when the host root cannot describe a node (no kernel release, a
    malformed file) and `NvmlError` for NVML failures other than a missing driver.
    """
    host = system.describe(root)
    if host.kernel_release is None:
        raise HostReadError(root.join(system.PROC_VERSION), "missing: the host root has no kernel")
    functions = pci.pci_functions(root)
    loaded = modules.loaded_modules(root)
    procfs_driver = nvidia.driver_version(root)
    gpus: tuple[Gpu, ...] = ()
    driver_version = procfs_driver.version if procfs_driver else None
    cuda_version: str | None = None
    if nvml is not None:
        try:
            with opened(nvml):
                driver_version = nvml.driver_version()
                cuda_version = nvml.cuda_driver_version()
                gpus = _gpus(nvml, functions)
        except DriverNotLoaded:
            driver_version = None
        except DriverUnavailable as error:
            # a library and kernel module of different versions (right after an install,
            # before the reload): the kernel's own report is the loaded driver
            log.warning("NVML is unavailable, reporting no GPUs: %s", error)
    loaded_names = {module.name for module in loaded}
    values = {
        "gpus": gpus,
        "pci_functions": tuple(_pci_function(function) for function in functions),
        "kernel_release": host.kernel_release,
        "machine": _machine(host.machine),
        "os_id": _os_id(host.os.id),
        "os_version_id": host.os.version_id,
        "product_name": _product_name(root),
        "boot_id": host.boot_id or UNKNOWN_BOOT_ID,
        "driver_version": driver_version,
        "driver_flavour": _flavour(procfs_driver) if driver_version is not None else None,
        "cuda_driver_version": cuda_version,
        "ofed_version": (
            modules.module_version(root, OFED_CORE_MODULE)
            if OFED_CORE_MODULE in loaded_names
            else None
        ),
        "modules_loaded": tuple(
            sorted(name for name in loaded_names if name.startswith(MANAGED_MODULE_PREFIXES))
        ),
        "container_runtimes": containers.container_runtimes(root),
        "cdi_specs": containers.cdi_specs(root),
        "inventory_hash": PLACEHOLDER_HASH,
    }
    try:
        inventory = HardwareDiscovered.model_validate(values)
    except ValidationError as error:
        raise HostReadError(root.path, f"the host gives an invalid inventory: {error}") from None
    return hashed(inventory)


def hashed(inventory: HardwareDiscovered) -> HardwareDiscovered:
    """The inventory with `inventory_hash` set to its content hash."""
    return inventory.model_copy(update={"inventory_hash": inventory.content_hash()})


def with_known_gpus(
    host_only: HardwareDiscovered, previous: HardwareDiscovered | None
) -> HardwareDiscovered:
    """A host-only inventory completed with the GPUs and CUDA version of `previous` (the
    last NVML scan) while the driver that scan saw is still the one loaded; as is otherwise.
    """
    if (
        previous is None
        or not previous.gpus
        or host_only.driver_version is None
        or host_only.driver_version != previous.driver_version
    ):
        return host_only
    completed = host_only.model_copy(
        update={"gpus": previous.gpus, "cuda_driver_version": previous.cuda_driver_version}
    )
    return hashed(completed)


def gpu_record(
    info: DeviceInfo,
    sysfs_numa_node: int | None = None,
    mig_devices: tuple[MigDevice, ...] = (),
    pcie_root: str | None = None,
) -> Gpu:
    """The inventory record of one GPU; the PCI address in sysfs's form (`0000:00:06.0`),
    its NUMA node (when NVML does not say) and PCIe root complex from sysfs."""
    if info.mig_mode_current is None:
        mig_mode = MigMode.UNSUPPORTED
    else:
        mig_mode = MigMode.ENABLED if info.mig_mode_current else MigMode.DISABLED
    return Gpu(
        uuid=info.uuid,
        index=info.index,
        minor_number=info.minor_number,
        pci_bus_id=info.sysfs_bus_id,
        model_name=info.name,
        memory_bytes=info.memory_total_bytes,
        numa_node=info.numa_node if info.numa_node is not None else sysfs_numa_node,
        pcie_root=pcie_root,
        mig_mode=mig_mode,
        compute_capability=info.compute_capability,
        architecture=info.architecture,
        brand=info.brand,
        clique=info.fabric_clique,
        mig_devices=tuple(mig_instance(device) for device in mig_devices),
    )


def mig_instance(device: MigDevice) -> MigInstance:
    """The inventory record of one MIG device."""
    return MigInstance(
        uuid=device.uuid,
        profile=device.profile,
        gpu_instance_slices=device.gpu_instance_slices,
        compute_instance_slices=device.compute_instance_slices,
        memory_bytes=device.memory_total_bytes,
        multiprocessors=device.multiprocessor_count,
        copy_engines=device.copy_engines,
        decoders=device.decoders,
        encoders=device.encoders,
        jpeg_engines=device.jpeg_engines,
        ofa_engines=device.ofa_engines,
        gpu_instance_profile_id=device.gpu_instance_profile_id,
        placement_start=device.placement.start if device.placement else None,
        placement_size=device.placement.size if device.placement else None,
    )


def _gpus(nvml: Nvml, functions: tuple[pci.PciFunction, ...]) -> tuple[Gpu, ...]:
    by_address = {function.address: function for function in functions}
    gpus = []
    for index in range(nvml.device_count()):
        try:
            info = nvml.device_info(index)
            migs = nvml.mig_devices(index) if info.mig_mode_current else ()
        except GpuFailure as error:
            # a GPU that fell off the bus is not one the node can offer
            log.warning("GPU %d does not answer, leaving it out: %s", index, error)
            continue
        function = by_address.get(info.sysfs_bus_id)
        numa, root = (function.numa_node, function.pcie_root) if function else (None, None)
        gpus.append(gpu_record(info, numa, migs, root))
    return tuple(gpus)


def _pci_function(function: pci.PciFunction) -> PciFunction:
    return PciFunction(
        address=function.address,
        vendor_id=f"{function.vendor_id:04x}",
        device_id=f"{function.device_id:04x}",
        class_id=f"{function.class_code:06x}",
        subsystem_vendor_id=f"{function.subsystem_vendor_id or 0:04x}",
        subsystem_device_id=f"{function.subsystem_device_id or 0:04x}",
        numa_node=function.numa_node,
        link_speed_gts=function.link_speed_gts,
        link_width=function.link_width,
        driver=function.driver,
    )


def _flavour(procfs_driver: nvidia.NvidiaDriverVersion | None) -> Flavour | None:
    # the kernel's own report names the tree ("Open Kernel Module"); NVML does not
    if procfs_driver is None:
        return None
    return Flavour.OPEN if procfs_driver.open_kernel_module else Flavour.PROPRIETARY


def _machine(reported: str | None) -> str:
    # a host whose driver is unloaded may not say; a node agent runs on its node's CPUs
    machine = (reported or platform.machine()).lower()
    return machine if _MACHINE.match(machine) else "unknown"


def _os_id(os_id: str | None) -> str | None:
    if os_id is None:
        return None
    lowered = os_id.lower()
    return lowered if _OS_ID.match(lowered) else None


def _product_name(root: HostRoot) -> str | None:
    text = root.read_text(DMI_PRODUCT_NAME)
    name = (text or "").strip()[:128]
    return name or None
