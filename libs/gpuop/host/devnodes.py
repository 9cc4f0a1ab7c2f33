"""The NVIDIA driver's control device nodes, made under a host root's `dev/` as NVIDIA's
toolkit makes them (`nvidia-ctk system create-device-nodes --control-devices`, the nodes
`nvidia-modprobe` makes when a program first opens the driver):

    /dev/nvidiactl          c 195 255   the control device of the `nvidia` module
    /dev/nvidia-modeset     c 195 254   the `nvidia-modeset` module's, on NVIDIA's major too
    /dev/nvidia-uvm         c U 0       unified memory, on the major the kernel gave the
    /dev/nvidia-uvm-tools   c U 1       `nvidia-uvm` module (`/proc/devices`, dynamic)

each mode 0666, owned by root, as the driver's defaults (`NVreg_DeviceFileMode`). 195 is the
major NVIDIA registered for its driver; the unified memory pair is made only while the
kernel lists `nvidia-uvm` (its module loaded), since its major is known only then.

Nothing in the kernel makes these nodes: on a host without udev rules of NVIDIA's (and on
every node where gpuop is the only NVIDIA software) `/dev/nvidia-uvm` appears only once a
CUDA program asks `nvidia-modprobe` for it. A CDI spec written before then would lack it,
and so would every container given its devices. The driver-manager calls `create` after
every load of the GPU driver, before the spec is written. A node of the right kind already
there is kept; anything else at its path (a regular file, a node of another number) is
replaced.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass

from gpuop.host.errors import HostError
from gpuop.host.roots import HostRoot

NVIDIA_MAJOR = 195
"""The character major registered for NVIDIA's driver (LANANA's devices.txt)."""
UVM_MODULE = "nvidia-uvm"
"""The unified memory driver's name in `/proc/devices`."""
PROC_DEVICES = "proc/devices"
MODE = 0o666


@dataclass(frozen=True)
class DeviceNode:
    """One character device node: its path on the host (`/dev/...`) and number."""

    path: str
    major: int
    minor: int


class DeviceNodeError(HostError):
    """A device node could not be made; the message names it and why."""


def character_majors(root: HostRoot) -> dict[str, int]:
    """The character devices' majors the kernel lists in `/proc/devices`, by name."""
    text = root.read_text(PROC_DEVICES) or ""
    majors: dict[str, int] = {}
    section = ""
    for line in text.splitlines():
        if line.endswith(":"):
            section = line
            continue
        match = re.match(r"^\s*(\d+)\s+(\S+)\s*$", line)
        if match and section.startswith("Character"):
            majors.setdefault(match.group(2), int(match.group(1)))
    return majors


def control_nodes(root: HostRoot) -> tuple[DeviceNode, ...]:
    """The control device nodes the loaded driver calls for."""
    nodes = [
        DeviceNode("/dev/nvidiactl", NVIDIA_MAJOR, 255),
        DeviceNode("/dev/nvidia-modeset", NVIDIA_MAJOR, 254),
    ]
    uvm = character_majors(root).get(UVM_MODULE)
    if uvm is not None:
        nodes += [
            DeviceNode("/dev/nvidia-uvm", uvm, 0),
            DeviceNode("/dev/nvidia-uvm-tools", uvm, 1),
        ]
    return tuple(nodes)


def create(root: HostRoot) -> tuple[str, ...]:
    """Make every control node under the host root that is missing or wrong; the paths made.
    Raises `DeviceNodeError` (the process may not make device nodes: not root, no
    CAP_MKNOD)."""
    made = []
    for node in control_nodes(root):
        path = root.join(node.path.lstrip("/"))
        wanted = os.makedev(node.major, node.minor)
        try:
            present = path.lstat()
        except (FileNotFoundError, NotADirectoryError):
            present = None
        if present is not None and stat.S_ISCHR(present.st_mode) and present.st_rdev == wanted:
            continue
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if present is not None:
                path.unlink()
            os.mknod(path, stat.S_IFCHR | MODE, wanted)
            os.chmod(path, MODE)  # whatever the umask
        except OSError as exc:
            raise DeviceNodeError(
                f"cannot make {path} (c {node.major} {node.minor}): {exc.strerror or exc}"
            ) from None
        made.append(node.path)
    return tuple(made)
