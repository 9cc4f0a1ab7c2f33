"""The simulated host's kernel log: what the demo writes there reads as the real device's
records, and a reboot starts a new ring."""

from __future__ import annotations

from pathlib import Path

from gpuop.health import kmsg
from gpuop.host import system
from gpuop_sim.cluster import hosts
from gpuop_sim.host import simkmsg
from gpuop_sim.host.simkernel import SimKernel


def test_an_xid_written_there_is_a_kernel_record_the_kernel_log_reader_finds(
    tmp_path: Path,
) -> None:
    root = hosts.build_host_root(tmp_path / "host", "node-1", 2, boot_id=None)
    assert not root.join(simkmsg.KMSG).exists()  # seeded without: dev/ holds device nodes
    simkmsg.provide(root)
    boot = system.boot_id(root)
    assert boot is not None
    path = str(root.join(simkmsg.KMSG))
    assert kmsg.read_new(path, kmsg.KmsgCursor(boot), boot).faults == ()

    simkmsg.printk(root, "usb 1-1: new device")
    seq = simkmsg.xid(
        root, "00000000:2B:00.0", 79, "pid=7, name=train, GPU has fallen off the bus."
    )
    batch = kmsg.read_new(path, kmsg.KmsgCursor(boot), boot)

    [(record, fault)] = batch.faults
    assert (record.seq, record.from_kernel, fault.pci, fault.xid, fault.pid) == (
        seq, True, "0000:2b:00", 79, 7,
    )  # fmt: skip
    assert seq == 2 and batch.lost == 0


def test_a_reboot_starts_a_new_ring(tmp_path: Path) -> None:
    root = hosts.build_host_root(tmp_path / "host", "node-1", 1)
    SimKernel(root).reboot()
    assert not root.join(simkmsg.KMSG).exists(), "a reboot makes no kernel log of its own"
    simkmsg.xid(root, "00000000:10:00.0", 48, "boom")
    SimKernel(root).reboot()
    assert root.join(simkmsg.KMSG).read_bytes() == b""
    assert simkmsg.printk(root, "after") == 1
