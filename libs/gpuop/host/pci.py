"""PCI functions of the node, read from `sys/bus/pci/devices/*` under the host root.

Discovery calls `pci_functions` for the inventory it publishes and for the NFD-style
`pci-<vendor>.present` labels; the driver-manager and the network-manager use it to find the
GPUs and ConnectX functions a driver binds to. Values are kept as sysfs gives them, typed:
ids as integers (`0x10de`), the link speed in GT/s, a NUMA node of `-1` as None.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from gpuop.host.errors import HostReadError
from gpuop.host.roots import HostRoot

DEVICES = "sys/bus/pci/devices"
"""Where sysfs lists every PCI function by address."""

NVIDIA = 0x10DE
"""PCI vendor id of NVIDIA."""
MELLANOX = 0x15B3
"""PCI vendor id of Mellanox (NVIDIA networking: ConnectX, BlueField)."""

DISPLAY_CLASS = 0x03
"""Base class of display controllers: VGA (`0x0300xx`) and 3D controllers (`0x0302xx`)."""
NETWORK_CLASS = 0x02
"""Base class of network controllers: Ethernet (`0x0200xx`), InfiniBand (`0x0207xx`)."""

_HEX = re.compile(r"^0x[0-9a-fA-F]+$")
_LINK_SPEED = re.compile(r"^(\d+(?:\.\d+)?) GT/s\b")
_PCIE_ROOT = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")


@dataclass(frozen=True)
class PciFunction:
    """One PCI function, as sysfs describes it."""

    address: str
    """Domain, bus, device and function: `0000:00:06.0`."""
    vendor_id: int
    """Vendor id: `0x10de` is NVIDIA, `0x15b3` Mellanox."""
    device_id: int
    """Device id: `0x2335` is an H200."""
    class_code: int
    """Class, subclass and programming interface: `0x030200` is a 3D controller."""
    subsystem_vendor_id: int | None
    """Subsystem vendor id; None when sysfs has none."""
    subsystem_device_id: int | None
    """Subsystem device id; None when sysfs has none."""
    numa_node: int | None
    """NUMA node; None when sysfs says `-1` or has no such file."""
    link_speed_gts: float | None
    """Current PCIe link speed in GT/s per lane (`32.0` for Gen5); None when unknown."""
    link_width: int | None
    """Current PCIe link width in lanes; None when unknown."""
    driver: str | None
    """Name of the kernel driver bound to the function (`nvidia`); None when unbound."""
    pcie_root: str | None = None
    """The PCIe root complex it sits below, `pci<domain>:<bus>` (`pci0000:00`); None when
    sysfs does not say (`pcie_root`)."""

    @property
    def base_class(self) -> int:
        """The class code's first byte: `0x03` for display, `0x02` for network controllers."""
        return self.class_code >> 16

    @property
    def is_nvidia_gpu(self) -> bool:
        """An NVIDIA display or 3D controller (not an NVSwitch or an audio function)."""
        return self.vendor_id == NVIDIA and self.base_class == DISPLAY_CLASS


def pci_functions(root: HostRoot) -> tuple[PciFunction, ...]:
    """Every PCI function under the host root, by address; empty when sysfs has none."""
    return tuple(pci_function(root, address) for address in root.list_dir(DEVICES))


def pci_function(root: HostRoot, address: str) -> PciFunction:
    """The PCI function at `address`; `HostReadError` when it or its ids are missing."""
    base = f"{DEVICES}/{address}"
    if not root.resolve(base).is_dir():
        raise HostReadError(root.join(base), "no such PCI function")
    return PciFunction(
        address=address,
        vendor_id=_required_hex(root, f"{base}/vendor"),
        device_id=_required_hex(root, f"{base}/device"),
        class_code=_required_hex(root, f"{base}/class"),
        subsystem_vendor_id=_optional_hex(root, f"{base}/subsystem_vendor"),
        subsystem_device_id=_optional_hex(root, f"{base}/subsystem_device"),
        numa_node=_numa_node(root, f"{base}/numa_node"),
        link_speed_gts=_link_speed(root, f"{base}/current_link_speed"),
        link_width=_link_width(root, f"{base}/current_link_width"),
        driver=bound_driver(root, address),
        pcie_root=pcie_root(root, address),
    )


def pcie_root(root: HostRoot, address: str) -> str | None:
    """The PCIe root complex of the function at `address`, or None.

    `sys/bus/pci/devices/<address>` is a link into the device tree,
    `../../../devices/pci0000:15/0000:15:01.0/0000:16:00.0`, whose `pci<domain>:<bus>`
    component is the root complex: the value of Kubernetes' standard DRA attribute
    `resource.kubernetes.io/pcieRoot`, which the `deviceattribute` package reads the same
    way. Read from the real link, else the one recorded in `SYMLINKS.txt`."""
    target = root.link_target(f"{DEVICES}/{address}")
    if target is None:
        return None
    for part in PurePosixPath(target).parts:
        if _PCIE_ROOT.match(part):
            return part
    return None


def bound_driver(root: HostRoot, address: str) -> str | None:
    """The driver bound to the function at `address`, or None.

    Read from its `driver` link (a real one, else one recorded in `SYMLINKS.txt`), and for
    a root that has neither from the `DRIVER=` line of its `uevent`.
    """
    base = f"{DEVICES}/{address}"
    target = root.link_target(f"{base}/driver")
    if target is not None:
        return target.rstrip("/").rpartition("/")[2] or None
    uevent = root.read_text(f"{base}/uevent") or ""
    for line in uevent.splitlines():
        key, _, value = line.partition("=")
        if key == "DRIVER" and value.strip():
            return value.strip()
    return None


def parse_link_speed(text: str) -> float | None:
    """GT/s from a `current_link_speed` value (`32.0 GT/s PCIe`, `8 GT/s`); None for
    `Unknown`. Raises `ValueError` for anything else."""
    text = text.strip()
    if text.startswith("Unknown"):
        return None
    match = _LINK_SPEED.match(text)
    if match is None:
        raise ValueError(f"not a PCIe link speed: {text!r}")
    return float(match.group(1))


def _text(root: HostRoot, relative: str) -> str | None:
    text = root.read_text(relative)
    return None if text is None else text.strip()


def _optional_hex(root: HostRoot, relative: str) -> int | None:
    text = _text(root, relative)
    if text is None:
        return None
    if not _HEX.match(text):
        raise HostReadError(root.join(relative), f"not a 0x-prefixed hex number: {text!r}")
    return int(text, 16)


def _required_hex(root: HostRoot, relative: str) -> int:
    value = _optional_hex(root, relative)
    if value is None:
        raise HostReadError(root.join(relative), "missing")
    return value


def _numa_node(root: HostRoot, relative: str) -> int | None:
    text = _text(root, relative)
    if text is None:
        return None
    try:
        node = int(text)
    except ValueError:
        raise HostReadError(root.join(relative), f"not a NUMA node: {text!r}") from None
    return None if node < 0 else node


def _link_speed(root: HostRoot, relative: str) -> float | None:
    text = _text(root, relative)
    if text is None:
        return None
    try:
        return parse_link_speed(text)
    except ValueError as error:
        raise HostReadError(root.join(relative), str(error)) from None


def _link_width(root: HostRoot, relative: str) -> int | None:
    text = _text(root, relative)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise HostReadError(root.join(relative), f"not a link width: {text!r}") from None
