"""Module parameters on a host: what a loaded module shows in `sys/module/<name>/parameters/`,
the `options` lines of `etc/modprobe.d/`, and what the module stand-ins declare.

The driver-manager writes the parameters it loads a component's modules with into
`etc/modprobe.d/gpuop-<component>.conf` (`write_options`) as well as on modprobe's command
line, so a load it does not make (the boot after a reboot, a `modprobe` by hand) uses them
too; `configured` reads every file there as modprobe does, and the simulated kernel applies
them.

The driver-manager reads `shown` after a load to record the parameters the kernel took (a
parameter the module does not declare is ignored by the kernel and shows nowhere); the
simulated kernel writes them there. `STANDIN_DECLARED` is what the stand-ins of NVIDIA's
modules declare, the `parm:` entries of the 535 branch's modules (`modinfo nvidia.ko`, types
as modinfo prints them; the `NVreg_*` are `uint` but the string ones); a real module's own
are read with modinfo (`gpuop.host.indexing.declared_module`).
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuop import moduleparams
from gpuop.host.files import write_atomic
from gpuop.host.modules import SYS_MODULE
from gpuop.host.roots import HostRoot

MODPROBE_D = "etc/modprobe.d"
PARAMETERS = "parameters"
"""The directory of `sys/module/<name>` holding one file per readable parameter."""

_UINT = (
    "NVreg_Mobile",
    "NVreg_ResmanDebugLevel",
    "NVreg_RmLogonRC",
    "NVreg_ModifyDeviceFiles",
    "NVreg_DeviceFileUID",
    "NVreg_DeviceFileGID",
    "NVreg_DeviceFileMode",
    "NVreg_InitializeSystemMemoryAllocations",
    "NVreg_UsePageAttributeTable",
    "NVreg_EnablePCIeGen3",
    "NVreg_EnableMSI",
    "NVreg_TCEBypassMode",
    "NVreg_EnableStreamMemOPs",
    "NVreg_RestrictProfilingToAdminUsers",
    "NVreg_PreserveVideoMemoryAllocations",
    "NVreg_EnableS0ixPowerManagement",
    "NVreg_S0ixPowerManagementVideoMemoryThreshold",
    "NVreg_DynamicPowerManagement",
    "NVreg_DynamicPowerManagementVideoMemoryThreshold",
    "NVreg_EnableGpuFirmware",
    "NVreg_EnableGpuFirmwareLogs",
    "NVreg_OpenRmEnableUnsupportedGpus",
    "NVreg_EnableUserNUMAManagement",
    "NVreg_MemoryPoolSize",
    "NVreg_KMallocHeapMaxSize",
    "NVreg_VMallocHeapMaxSize",
    "NVreg_IgnoreMMIOCheck",
    "NVreg_NvLinkDisable",
    "NVreg_EnablePCIERelaxedOrderingMode",
    "NVreg_RegisterPCIDriver",
    "NVreg_EnableResizableBar",
    "NVreg_EnableDbgBreakpoint",
    "NVreg_DmaRemapPeerMmio",
)
_CHARP = (
    "NVreg_RegistryDwords",
    "NVreg_RegistryDwordsPerDevice",
    "NVreg_RmMsg",
    "NVreg_GpuBlacklist",
    "NVreg_TemporaryFilePath",
    "NVreg_ExcludedGpus",
    "rm_firmware_active",
)

STANDIN_DECLARED: dict[str, dict[str, str]] = {
    "nvidia": {**dict.fromkeys(_UINT, "uint"), **dict.fromkeys(_CHARP, "charp")},
    "nvidia_uvm": {
        "uvm_ats_mode": "int",
        "uvm_perf_prefetch_enable": "uint",
        "uvm_perf_prefetch_threshold": "uint",
        "uvm_perf_thrashing_enable": "uint",
        "uvm_global_oversubscription": "int",
        "uvm_disable_hmm": "bool",
        "uvm_enable_builtin_tests": "int",
        "uvm_release_asserts": "int",
        "uvm_debug_prints": "int",
        "uvm_channel_num_gpfifo_entries": "uint",
        "uvm_page_table_location": "charp",
        "uvm_peer_copy": "charp",
    },
    "nvidia_modeset": {
        "output_rounding_fix": "bool",
        "disable_hdmi_frl": "bool",
        "disable_vrr_memclk_switch": "bool",
        "fail_malloc": "int",
        "malloc_verbose": "bool",
        "config_file": "charp",
    },
    "nvidia_drm": {"modeset": "bool"},
    "nvidia_peermem": {"peerdirect_support": "int"},
}
"""The parameters each NVIDIA module's stand-in declares (OFED's declare none)."""


def write_options(root: HostRoot, component: str, options: Mapping[str, Mapping[str, str]]) -> None:
    """`etc/modprobe.d/gpuop-<component>.conf` with one `options` line per module of
    `options`; removed when there are none."""
    path = root.join(f"{MODPROBE_D}/gpuop-{component}.conf")
    lines = [
        f"options {m} {' '.join(moduleparams.words(p))}" for m, p in sorted(options.items()) if p
    ]
    if not lines:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    header = "# written by gpuop's driver-manager: the policy's kernelModuleParameters"
    write_atomic(path, "\n".join([header, *lines]) + "\n")


def configured(root: HostRoot) -> dict[str, dict[str, str]]:
    """The `options` of every `etc/modprobe.d/*.conf`, module to parameters, files in name
    order and a later value winning, as modprobe reads them."""
    found: dict[str, dict[str, str]] = {}
    for name in sorted(root.list_dir(MODPROBE_D)):
        text = root.read_text(f"{MODPROBE_D}/{name}") if name.endswith(".conf") else None
        for line in (text or "").splitlines():
            fields = line.split()
            if len(fields) > 2 and fields[0] == "options":
                module = fields[1].replace("-", "_")
                found.setdefault(module, {}).update(moduleparams.parsed(fields[2:]))
    return found


def shown(root: HostRoot, module: str) -> dict[str, str]:
    """The parameters loaded `module` shows, name to value as sysfs prints it; empty when
    it is not loaded or shows none."""
    base = f"{SYS_MODULE}/{module}/{PARAMETERS}"
    found: dict[str, str] = {}
    for name in root.list_dir(base):
        text = root.read_text(f"{base}/{name}")
        if text is not None:
            found[name] = text.rstrip("\n")
    return found
