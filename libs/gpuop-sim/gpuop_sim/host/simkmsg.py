"""The simulated host's kernel log: `<host root>/dev/kmsg`, a regular file of `/dev/kmsg`
records (`PRIO,SEQ,TS_USEC,FLAGS;TEXT`, one a line), which telemetry's kernel-log source
reads as it reads the real device (`gpuop.health.kmsg.read_new` takes either).

`provide` gives a host root an empty one (the demo's remediation scenario does, for its
nodes' telemetry: a host root is seeded without one, as its `dev/` holds device nodes only);
`boot` empties it at every simulated reboot, as a boot starts a new ring, so records of an
earlier boot never show in a later one (sequence numbers restart at each boot, as the
kernel's do). `printk` appends one kernel record
(facility 0, the kernel's alone) with the next sequence number; `xid` one `NVRM: Xid` line
as NVIDIA's driver prints it: the demo's way to make a GPU fault that only the kernel log
reports.
"""

from __future__ import annotations

import os

from gpuop.health import kmsg
from gpuop.host.roots import HostRoot

KMSG = "dev/kmsg"
"""The kernel log, relative to the host root."""
ERROR = 3
"""`KERN_ERR`: the level NVIDIA's driver prints XIDs at."""


def provide(root: HostRoot) -> None:
    """An empty kernel log for the host at `root`."""
    path = root.join(KMSG)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")


def boot(root: HostRoot) -> None:
    """A new boot's empty ring, where the host has a kernel log."""
    path = root.join(KMSG)
    if path.is_file():
        path.write_bytes(b"")


def printk(root: HostRoot, text: str, *, level: int = ERROR) -> int:
    """Append one kernel record; returns its sequence number."""
    path = root.join(KMSG)
    path.parent.mkdir(parents=True, exist_ok=True)
    seq = path.read_bytes().count(b"\n") + 1 if path.exists() else 1
    escaped = "".join(c if " " <= c < "\x7f" and c != "\\" else f"\\x{ord(c):02x}" for c in text)
    record = f"{level},{seq},{seq * 1_000_000},-;{escaped}\n"
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, record.encode())
    finally:
        os.close(descriptor)
    return seq


def xid(root: HostRoot, pci_bus_id: str, number: int, text: str) -> int:
    """NVIDIA's driver reports XID `number` on the GPU at `pci_bus_id` (NVML's form,
    `00000000:17:00.0`, printed as the driver prints it: `0000:17:00`)."""
    return printk(root, f"NVRM: Xid (PCI:{kmsg.pci_key(pci_bus_id)}): {number}, {text}")
