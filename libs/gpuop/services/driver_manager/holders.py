"""Who keeps a driver from unloading, and whether unloading it would cut the node off.

`unloading.unload` calls these when `rmmod` refuses, and before an OFED unload:

- `processes_holding(root, component)` finds the host processes with the component's
  device files open (`/dev/nvidia*`; `/dev/infiniband/*`), by their `proc/<pid>/fd` links
  under the host root, as `fuser` does; the pod needs the host's PID namespace (hostPID)
  and the privilege to read other processes' descriptors. A GPU process names the GPU
  whose `/dev/nvidia<minor>` it holds.
- `gpu_holders(root)` lists the processes with any `/dev/nvidia*` open and the GPU minors
  among them, for a GPU reset (`resetting`), which must know which GPUs are in use.
- `management_interfaces(root, component)` names the network interfaces that carry a
  default route and sit on a PCI function bound to one of the component's modules:
  reloading that driver resets the interface and the node drops off the network
  (upstream's Mellanox/network-operator#2176). Routes come from `proc/net/route` and
  `proc/net/ipv6_route` (the pod shares the host's network namespace); a host root with
  neither cannot tell, and no interface is named.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from gpuop.events.driver import Component, Process
from gpuop.host import components, nvidia, pci
from gpuop.host.errors import HostReadError
from gpuop.host.roots import HostRoot

MAX_PROCESSES = 256
"""As many as `DriverUnloadFailed.holding_processes` carries."""

DEVICE_FILES = {
    Component.GPU: re.compile(r"^/dev/nvidia"),
    Component.OFED: re.compile(r"^/dev/infiniband/"),
}
_GPU_MINOR = re.compile(r"^/dev/nvidia(\d+)$")
_PCI_ADDRESS = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def processes_holding(root: HostRoot, component: Component) -> tuple[Process, ...]:
    """Processes with one of `component`'s device files open, by pid (at most 256)."""
    pattern = DEVICE_FILES[component]
    proc = root.join("proc")
    try:
        pids = sorted(int(name) for name in os.listdir(proc) if name.isdigit())
    except OSError:
        return ()
    uuids = _gpu_uuids_by_minor(root) if component is Component.GPU else {}
    found: list[Process] = []
    for pid in pids:
        targets = _open_files(proc / str(pid) / "fd")
        held = [target for target in targets if pattern.match(target)]
        if not held:
            continue
        try:
            name = (proc / str(pid) / "comm").read_text().strip()[:64] or "?"
        except OSError:
            name = "?"
        gpu = next(
            (uuids[int(m[1])] for t in held if (m := _GPU_MINOR.match(t)) and int(m[1]) in uuids),
            None,
        )
        found.append(Process(pid=pid, name=name, gpu_uuid=gpu))
        if len(found) == MAX_PROCESSES:
            break
    return tuple(found)


@dataclass(frozen=True)
class GpuHolder:
    """A process with the GPU driver's device files open."""

    pid: int
    name: str
    minors: frozenset[int]
    """The GPUs whose `/dev/nvidia<minor>` it holds; empty when it holds only the driver's
    shared files (`nvidiactl`, `nvidia-uvm`)."""


def gpu_holders(root: HostRoot, *, excluding: int | None = None) -> tuple[GpuHolder, ...]:
    """Processes with a `/dev/nvidia*` file open, by pid, but `excluding` (the agent itself,
    whose NVML session holds them while it looks)."""
    proc = root.join("proc")
    try:
        pids = sorted(int(name) for name in os.listdir(proc) if name.isdigit())
    except OSError:
        return ()
    found = []
    for pid in pids:
        if pid == excluding:
            continue
        held = [
            t for t in _open_files(proc / str(pid) / "fd") if DEVICE_FILES[Component.GPU].match(t)
        ]
        if not held:
            continue
        try:
            name = (proc / str(pid) / "comm").read_text().strip()[:64] or "?"
        except OSError:
            name = "?"
        minors = frozenset(int(m[1]) for t in held if (m := _GPU_MINOR.match(t)))
        found.append(GpuHolder(pid, name, minors))
    return tuple(found)


def management_interfaces(root: HostRoot, component: Component) -> tuple[str, ...]:
    """Default-route interfaces whose PCI function `component`'s modules drive."""
    drivers = set(components.modules_of(component))
    found = []
    for interface in sorted(_default_route_interfaces(root)):
        for member in (interface, *_bond_members(root, interface)):
            address = _pci_address(root, member)
            if address is not None and pci.bound_driver(root, address) in drivers:
                found.append(interface)
                break
    return tuple(found)


def _open_files(fd_dir: os.PathLike[str]) -> list[str]:
    try:
        names = os.listdir(fd_dir)
    except OSError:  # gone, or not ours to read
        return []
    targets = []
    for name in names:
        try:
            targets.append(os.readlink(os.path.join(fd_dir, name)))
        except OSError:
            continue
    return targets


def _gpu_uuids_by_minor(root: HostRoot) -> dict[int, str]:
    try:
        gpus = nvidia.gpus(root)
    except HostReadError:
        return {}
    return {
        gpu.device_minor: gpu.uuid
        for gpu in gpus
        if gpu.device_minor is not None and gpu.uuid is not None
    }


def _default_route_interfaces(root: HostRoot) -> set[str]:
    interfaces = set()
    for line in (root.read_text("proc/net/route") or "").splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[1] == "00000000" and fields[7] == "00000000":
            interfaces.add(fields[0])
    for line in (root.read_text("proc/net/ipv6_route") or "").splitlines():
        fields = line.split()
        default = len(fields) >= 10 and fields[0] == "0" * 32 and fields[1] == "00"
        if default and fields[9] != "lo":
            interfaces.add(fields[9])
    return interfaces


def _bond_members(root: HostRoot, interface: str) -> tuple[str, ...]:
    slaves = root.read_text(f"sys/class/net/{interface}/bonding/slaves")
    return tuple(slaves.split()) if slaves else ()


def _pci_address(root: HostRoot, interface: str) -> str | None:
    """The PCI function under `interface`, from its `sys/class/net` link."""
    target = root.link_target(f"sys/class/net/{interface}")
    if target is None:
        return None
    addresses = [part for part in PurePosixPath(target).parts if _PCI_ADDRESS.match(part)]
    return addresses[-1] if addresses else None
