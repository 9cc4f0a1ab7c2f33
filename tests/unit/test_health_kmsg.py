"""The kernel log's GPU faults, from `/dev/kmsg` records as the kernel writes them."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuop.health import kmsg

# Records in /dev/kmsg's format; the NVRM texts are the line shapes NVIDIA's open kernel
# modules print (krcReportXid) and NVSentinel's parser tests carry.
XID_79 = (
    b"3,1042,987654321,-;NVRM: Xid (PCI:0000:17:00): 79, pid=2112, name=python3, "
    b"GPU has fallen off the bus.\n SUBSYSTEM=pci\n DEVICE=+pci:0000:17:00.0\n"
)
XID_48_NO_PROCESS = (
    b"4,1043,987654400,-;NVRM: Xid (PCI:0000:2b:00): 48, An uncorrectable double bit error\n"
)
XID_OLD_UNKNOWN_PID = (
    b"4,1044,987654500,-;NVRM: Xid (PCI:0000:2b:00): 13, pid='<unknown>', name=<unknown>, "
    b"Graphics Exception: ESR 0x50df30=0x107000e\n"
)
XID_MIG = (
    b"4,1045,987654600,-;NVRM: Xid (PCI:0000:3f:00 GPU-I:05 GPU-CI:01): 43, pid=77, "
    b"name=a.out, Ch 0000000b\n"
)
FALLEN_WITHOUT_XID = (
    b"3,1046,987654700,-;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: (PCI ID: 10de:2335) "
    b"installed in this system has\\x0aNVRM: fallen off the bus and is not responding to "
    b"commands.\n"
)
FROM_USERSPACE = b"12,1047,987654800,-;NVRM: Xid (PCI:0000:17:00): 79, pid=1, name=x, forged\n"


def _fault(raw: bytes) -> kmsg.GpuFault | None:
    return kmsg.parse_fault(kmsg.parse_record(raw))


def test_an_xid_with_its_process_is_read_with_the_gpus_address() -> None:
    record = kmsg.parse_record(XID_79)
    assert (record.priority, record.seq, record.timestamp_us) == (3, 1042, 987654321)
    assert kmsg.parse_fault(record) == kmsg.GpuFault(
        pci="0000:17:00", xid=79, text="GPU has fallen off the bus.", pid=2112
    )


@pytest.mark.parametrize(
    ("raw", "xid", "pid", "gi", "ci"),
    [
        (XID_48_NO_PROCESS, 48, None, None, None),
        (XID_OLD_UNKNOWN_PID, 13, None, None, None),
        (XID_MIG, 43, 77, 5, 1),
    ],
    ids=["no-process", "old-unknown-pid", "mig-attributed"],
)
def test_every_xid_line_shape_is_read(
    raw: bytes, xid: int, pid: int | None, gi: int | None, ci: int | None
) -> None:
    fault = _fault(raw)
    assert fault is not None
    assert (fault.xid, fault.pid, fault.gpu_instance, fault.compute_instance) == (xid, pid, gi, ci)


def test_a_fall_off_the_bus_without_an_xid_is_read_as_xid_79_from_one_record() -> None:
    fault = _fault(FALLEN_WITHOUT_XID)
    assert fault is not None
    assert (fault.pci, fault.xid) == ("0000:b3:00", kmsg.FALLEN_OFF_BUS_XID)
    assert "not responding to commands" in fault.text


def test_userspace_cannot_fake_a_gpu_fault_through_dev_kmsg() -> None:
    record = kmsg.parse_record(FROM_USERSPACE)
    assert not record.from_kernel
    assert kmsg.parse_fault(record) is None


def test_other_kernel_lines_are_not_faults() -> None:
    assert _fault(b"6,5,100,-;usb 1-1: new high-speed USB device number 2\n") is None
    assert _fault(b"6,6,101,-;NVRM: loading NVIDIA UNIX Open Kernel Module  535.261.03\n") is None


@pytest.mark.parametrize(
    "raw",
    [b"no header at all", b"3,abc,1,-;text", b"3,1;text", b"-1,2,3,-;text"],
    ids=["no-semicolon", "seq-not-a-number", "too-few-fields", "negative"],
)
def test_a_malformed_record_is_refused_saying_what(raw: bytes) -> None:
    with pytest.raises(kmsg.KmsgError):
        kmsg.parse_record(raw)


def test_extra_header_fields_are_ignored_as_the_abi_says() -> None:
    record = kmsg.parse_record(b"4,7,100,-,caller=T123;NVRM: Xid (PCI:0000:17:00): 31, x\n")
    assert record.seq == 7 and kmsg.parse_fault(record) is not None


@pytest.mark.parametrize(
    ("nvml", "kernel"),
    [("00000000:17:00.0", "0000:17:00"), ("0000:2B:00.0", "0000:2b:00")],
)
def test_nvml_and_kernel_addresses_join_on_one_key(nvml: str, kernel: str) -> None:
    assert kmsg.pci_key(nvml) == kmsg.pci_key(kernel)


def test_the_cursor_skips_what_was_read_and_reports_a_gap() -> None:
    start = kmsg.KmsgCursor("boot-a")
    first = kmsg.admit(start, "boot-a", 10)
    assert first.fresh and first.lost == 0 and first.cursor.last_seq == 10
    again = kmsg.admit(first.cursor, "boot-a", 10)
    assert not again.fresh, "a record read before a restart is not read again"
    gap = kmsg.admit(first.cursor, "boot-a", 14)
    assert gap.fresh and gap.lost == 3
    rebooted = kmsg.admit(gap.cursor, "boot-b", 2)
    assert rebooted.fresh and rebooted.lost == 0 and rebooted.cursor == kmsg.KmsgCursor("boot-b", 2)


def test_read_new_reads_a_host_roots_log_once_across_restarts(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    records = (XID_48_NO_PROCESS, XID_OLD_UNKNOWN_PID, XID_MIG, FALLEN_WITHOUT_XID)
    log.write_bytes(XID_79.split(b"\n")[0] + b"\n" + b"".join(records) + FROM_USERSPACE)
    first = kmsg.read_new(str(log), kmsg.KmsgCursor("boot-a"), "boot-a")
    assert [fault.xid for _, fault in first.faults] == [79, 48, 13, 43, 79]
    assert first.cursor.last_seq == 1047 and first.lost == 0
    with log.open("ab") as stream:
        stream.write(b"3,1050,987655000,-;NVRM: Xid (PCI:0000:17:00): 31, pid=9, name=x, y\n")
    second = kmsg.read_new(str(log), first.cursor, "boot-a")
    assert [fault.xid for _, fault in second.faults] == [31]
    assert second.lost == 2, "seq 1048 and 1049 were never read: a gap, said"


def test_read_new_reads_the_machines_own_dev_kmsg_without_blocking_or_repeating() -> None:
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    first = kmsg.read_new("/dev/kmsg", kmsg.KmsgCursor(boot_id), boot_id)
    assert first.cursor.last_seq is not None, "the kernel log of a running machine has records"
    again = kmsg.read_new("/dev/kmsg", first.cursor, boot_id)
    assert again.cursor.last_seq is not None and again.cursor.last_seq >= first.cursor.last_seq
    assert not set(r.seq for r, _ in again.faults) & set(r.seq for r, _ in first.faults)
