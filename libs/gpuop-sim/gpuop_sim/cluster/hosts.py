"""The host root of one simulated GPU node, as its node agents and its simulated NVML see it.

`seeding.seed_host_root` copies the recorded H200 host: one GPU at `0000:00:06.0`. A
simulated node has `gpus` GPUs whose identities `SimNvml` derives from the node name and
index (`gpuop_sim.nvml.sim_gpus`). `build_host_root` makes the host agree with that NVML: one
sysfs PCI function per simulated GPU at the bus id and NUMA node `SimNvml` reports, below
its own PCIe root complex (`sim_gpus.pcie_root`; the link recorded in `SYMLINKS.txt`, as
the recording's are), each listed by the driver in
`proc/driver/nvidia/gpus/<address>/information` with its UUID and minor number, in place of
the recorded GPU. So discovery's sysfs view and its NVML view of
a simulated node are the same machine, as on a real one.

Called by the simulated cluster, the demo and tests, before any agent runs on the root.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from gpuop.host import nvidia, pci, system
from gpuop.host.files import write_atomic
from gpuop.host.roots import RECORDED_LINKS, HostRoot
from gpuop_sim import recordings
from gpuop_sim.host import seeding, simstate
from gpuop_sim.nvml import sim_gpus

RECORDED_GPU = "0000:00:06.0"
"""The recorded H200's PCI address: the template of every simulated GPU function."""
ARCH = "x86_64"
"""What `proc/sys/kernel/arch` says when the recorded host does not."""


def build_host_root(
    destination: Path,
    node: str,
    gpus: int,
    *,
    recorded: Path | None = None,
    gpu_version: str | None = seeding.RECORDED_DRIVER_VERSION,
    ofed_version: str | None = None,
    boot_id: str | None = None,
    product_name: str | None = None,
    kernel_release: str | None = None,
) -> HostRoot:
    """A booted host root for simulated node `node` with `gpus` H200s (1 to 64), made from
    the recorded host (`recorded`, default: the packaged H200 recording). `gpu_version`,
    `ofed_version`, `boot_id` and `kernel_release` are as for `seed_host_root`;
    `product_name`, when given, is the DMI product name (a cloud instance type such as
    `p5e.48xlarge`)."""
    if not 1 <= gpus <= 64:
        raise ValueError(f"a simulated node has 1 to 64 GPUs, not {gpus}")
    source = recorded or recordings.H200_HOST_ROOT
    root = seeding.seed_host_root(
        destination,
        source,
        gpu_version=gpu_version,
        ofed_version=ofed_version,
        boot_id=boot_id,
        kernel_release=kernel_release,
    )
    if root.read_text(system.ARCH) is None:
        # a real kernel says; without it, an unloaded driver would leave the arch unknown
        write_atomic(root.join(system.ARCH), f"{system.machine(root) or ARCH}\n")
    if product_name is not None:
        write_atomic(root.join("sys/class/dmi/id/product_name"), f"{product_name}\n")
    _replace_gpus(root, node, gpus)
    return root


def gpu_address(index: int, gpus: int) -> str:
    """The sysfs address of simulated GPU `index` of `gpus`: `SimNvml`'s bus id, in sysfs's
    form (4-digit domain, lowercase)."""
    domain, _, rest = sim_gpus.bus_id(index, gpus).partition(":")
    return f"{int(domain, 16):04x}:{rest.lower()}"


def _replace_gpus(root: HostRoot, node: str, gpus: int) -> None:
    template = root.join(f"{pci.DEVICES}/{RECORDED_GPU}")
    driver_gpus = _driver_gpus_dir(root)
    information = (driver_gpus / RECORDED_GPU / "information").read_text()
    for index in range(gpus):
        address = gpu_address(index, gpus)
        function = root.join(f"{pci.DEVICES}/{address}")
        shutil.copytree(template, function, symlinks=True)
        write_atomic(function / "numa_node", f"{sim_gpus.numa_node(index, gpus)}\n")
        uevent = function / "uevent"
        write_atomic(uevent, uevent.read_text().replace(RECORDED_GPU, address))
        listed = driver_gpus / address
        shutil.copytree(driver_gpus / RECORDED_GPU, listed, symlinks=True)
        write_atomic(
            listed / "information",
            _information(information, address, sim_gpus.gpu_uuid(node, index), index),
        )
    shutil.rmtree(template)
    shutil.rmtree(driver_gpus / RECORDED_GPU)
    _forget_links(root, f"{pci.DEVICES}/{RECORDED_GPU}")
    _record_links(root, [_device_link(index, gpus) for index in range(gpus)])


def _device_link(index: int, gpus: int) -> str:
    """`sys/bus/pci/devices/<address>`'s link into the device tree, below its root complex
    and the root port above it."""
    address = gpu_address(index, gpus)
    root_complex = sim_gpus.pcie_root(index, gpus)
    port = f"{root_complex.removeprefix('pci')}:01.0"
    return f"{pci.DEVICES}/{address} -> ../../../devices/{root_complex}/{port}/{address}"


def _record_links(root: HostRoot, links: list[str]) -> None:
    """Add `PATH -> TARGET` lines to `SYMLINKS.txt`."""
    recorded = root.join(RECORDED_LINKS)
    kept = recorded.read_text() if recorded.is_file() else ""
    if kept and not kept.endswith("\n"):
        kept += "\n"
    write_atomic(recorded, kept + "".join(f"{link}\n" for link in links))


def _driver_gpus_dir(root: HostRoot) -> Path:
    """Where the driver lists its GPUs: `proc/driver/nvidia/gpus` while `nvidia` is loaded,
    else the simulated kernel's stash of it, which comes back when it is loaded."""
    live = root.join(nvidia.GPUS_DIR)
    if live.is_dir():
        return live
    return root.join(f"{simstate.NVIDIA_STASH}/gpus")


def _information(text: str, address: str, uuid: str, minor: int) -> str:
    replacements = {"GPU UUID": uuid, "Bus Location": address, "Device Minor": str(minor)}
    lines = []
    for line in text.splitlines(keepends=True):
        key, colon, value = line.partition(":")
        if colon and key.strip() in replacements:
            padding = value[: len(value) - len(value.lstrip())]
            newline = "\n" if line.endswith("\n") else ""
            line = f"{key}:{padding}{replacements[key.strip()]}{newline}"
        lines.append(line)
    return "".join(lines)


def _forget_links(root: HostRoot, prefix: str) -> None:
    """Drop the recorded links at and under `prefix` from `SYMLINKS.txt`."""
    recorded = root.join(RECORDED_LINKS)
    if not recorded.is_file():
        return
    kept = [
        line
        for line in recorded.read_text().splitlines(keepends=True)
        if not _under(line.partition(" -> ")[0].strip().strip("/"), prefix)
    ]
    write_atomic(recorded, "".join(kept))


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")
