"""GPU faults from the kernel log: `/dev/kmsg` records, NVIDIA's `NVRM:` lines, read without
losing or repeating a record across restarts.

NVML reports XIDs only to a process that registered for events before they happened, and a
GPU that fell off the bus, or whose GSP stopped answering, can stall NVML itself; the kernel
log keeps arriving. So telemetry reads both, and this module is the kernel log's half:

- `parse_record` reads one `/dev/kmsg` record, `PRIO,SEQ,TS_USEC,FLAGS[,...];TEXT` with
  `\\xNN` escapes (a printk with embedded newlines arrives as one record). Only kernel
  records count: userspace cannot write facility 0, so `PRIO >= 8` is someone writing to
  `/dev/kmsg` and is ignored (a pod must not be able to fake a GPU fault).
- `parse_fault` finds the GPU fault a record's text reports: an XID
  (`NVRM: Xid (PCI:0000:17:00): 79, pid=..., name=..., GPU has fallen off the bus.`, with
  the optional MIG `GPU-I:`/`GPU-CI:` attribution and `pid='<unknown>'` of older drivers),
  or a GPU that fell off the bus without one (`NVRM: The NVIDIA GPU 0000:b3:00.0 ...
  fallen off the bus`). The PCI address is normalised as NVML's bus id is (`pci_key`) so
  the two sources join on it.
- `KmsgCursor` is what survives a restart: the boot id and the last sequence number read.
  `admit` decides per record: a record of this boot at or below the cursor was
  read before (skipped); a jump in the sequence numbers is a gap (the ring overwrote records
  before they were read: reported, never silently); a new boot starts afresh. `read_new`
  reads what a cursor has not seen, from the device or a simulated host root's file.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, replace

KERNEL_FACILITY_LIMIT = 8
"""A record's PRIO is `facility << 3 | level`; facility 0 (LOG_KERN) is the kernel's alone."""
MAX_RECORD_BYTES = 8192
"""The kernel's longest record (`CONSOLE_EXT_LOG_MAX`): a read buffer must hold one."""

_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")
_PCI = r"(?P<pci>[0-9a-fA-F]{1,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)"
_XID = re.compile(
    r"NVRM: Xid \(PCI:" + _PCI + r"(?: GPU-I:(?P<gi>\d+))?(?: GPU-CI:(?P<ci>\d+))?\): "
    r"(?P<xid>\d+)(?:, pid=(?P<pid>'?<?[\w]+>?'?))?(?:, name=(?P<name>[^,]*))?(?:, (?P<text>.*))?$",
    re.S,
)
_FALLEN = re.compile(
    r"NVRM: The NVIDIA GPU " + _PCI + r"\b.*?fallen off the bus", re.S | re.IGNORECASE
)
_FALLEN_COMPANION = re.compile(r"NVRM: GPU " + _PCI + r": GPU has fallen off the bus", re.S)
FALLEN_OFF_BUS_XID = 79
"""The XID NVIDIA gives a GPU that fell off the bus; a fall reported without an XID is read
as one, so the catalog decides both the same way."""


class KmsgError(ValueError):
    """A record that is not `/dev/kmsg`'s format."""


@dataclass(frozen=True)
class KmsgRecord:
    """One `/dev/kmsg` record."""

    priority: int
    seq: int
    """The record's sequence number: rises by one per record, restarts at each boot."""
    timestamp_us: int
    """Microseconds since boot (monotonic)."""
    text: str
    """The message, unescaped: embedded newlines are newlines again."""

    @property
    def from_kernel(self) -> bool:
        """Whether the kernel wrote it (userspace writes to `/dev/kmsg` never have facility 0)."""
        return self.priority < KERNEL_FACILITY_LIMIT


@dataclass(frozen=True)
class GpuFault:
    """A GPU fault as the kernel log reports it."""

    pci: str
    """The GPU's PCI address, normalised (`pci_key`): `0000:17:00`."""
    xid: int
    """The XID; `FALLEN_OFF_BUS_XID` for a fall reported without one."""
    text: str
    """The line's own words after the XID (or the whole message), for operators."""
    gpu_instance: int | None = None
    """The MIG GPU instance the driver attributed it to, when it did."""
    compute_instance: int | None = None
    pid: int | None = None
    """The process the driver named, when it printed a number."""


def parse_record(raw: bytes | str) -> KmsgRecord:
    """One record as `read()` on `/dev/kmsg` returns it (continuation lines ignored)."""
    line = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
    line = line.split("\n", 1)[0]
    header, separator, text = line.partition(";")
    fields = header.split(",")
    if not separator or len(fields) < 4:
        raise KmsgError(f"not a /dev/kmsg record (PRIO,SEQ,TS,FLAGS;TEXT): {line[:80]!r}")
    try:
        priority, seq, timestamp = int(fields[0]), int(fields[1]), int(fields[2])
    except ValueError:
        raise KmsgError(f"a /dev/kmsg record's numbers do not parse: {header[:80]!r}") from None
    if priority < 0 or seq < 0 or timestamp < 0:
        raise KmsgError(f"a /dev/kmsg record with a negative field: {header[:80]!r}")
    return KmsgRecord(priority, seq, timestamp, _unescape(text))


def parse_fault(record: KmsgRecord) -> GpuFault | None:
    """The GPU fault the record reports, if it is a kernel record that reports one."""
    if not record.from_kernel or "NVRM:" not in record.text:
        return None
    if (xid := _XID.search(record.text)) is not None:
        pid = (xid["pid"] or "").strip("'")
        return GpuFault(
            pci=pci_key(xid["pci"]),
            xid=int(xid["xid"]),
            text=(xid["text"] or "").strip(),
            gpu_instance=int(xid["gi"]) if xid["gi"] else None,
            compute_instance=int(xid["ci"]) if xid["ci"] else None,
            pid=int(pid) if pid.isdigit() else None,
        )
    fallen = _FALLEN.search(record.text) or _FALLEN_COMPANION.search(record.text)
    if fallen is not None:
        message = " ".join(record.text.split())
        return GpuFault(pci=pci_key(fallen["pci"]), xid=FALLEN_OFF_BUS_XID, text=message)
    return None


def pci_key(address: str) -> str:
    """A PCI address as both sources can be joined on: lower case, a 4-digit domain, no
    function (`00000000:17:00.0` from NVML and `0000:17:00` from the kernel log alike)."""
    domain, bus, device = address.lower().split(".", 1)[0].split(":")
    return f"{int(domain, 16):04x}:{bus}:{device}"


@dataclass(frozen=True)
class KmsgCursor:
    """Where reading the kernel log got to: persisted so a restart neither loses nor repeats."""

    boot_id: str
    last_seq: int | None = None
    """The last record's sequence number read in that boot; None before the first."""


@dataclass(frozen=True)
class Admission:
    """What to do with one record, and the cursor after it."""

    fresh: bool
    """The record was not read before: act on it."""
    lost: int
    """Records the ring overwrote between the cursor and this one (0 when none)."""
    cursor: KmsgCursor


def admit(cursor: KmsgCursor, boot_id: str, seq: int) -> Admission:
    """Whether the record `seq` of boot `boot_id` is new to a reader at `cursor`."""
    if boot_id != cursor.boot_id:
        return Admission(True, 0, KmsgCursor(boot_id, seq))
    if cursor.last_seq is not None and seq <= cursor.last_seq:
        return Admission(False, 0, cursor)
    lost = 0 if cursor.last_seq is None else seq - cursor.last_seq - 1
    return Admission(True, lost, replace(cursor, last_seq=seq))


def _unescape(text: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m[1], 16)), text)


@dataclass(frozen=True)
class Batch:
    """What one pass over the kernel log read."""

    faults: tuple[tuple[KmsgRecord, GpuFault], ...]
    """The new kernel records that report a GPU fault, in order."""
    lost: int
    """Records lost to the ring's overwriting since the cursor (a gap the reader could not
    read: a fault may be among them)."""
    cursor: KmsgCursor


def read_new(path: str, cursor: KmsgCursor, boot_id: str, *, limit: int = 10_000) -> Batch:
    """Read the records of `path` (the host's `/dev/kmsg`, under its host root) that
    `cursor` has not seen, at most `limit`, without blocking; a regular file (a simulated
    host root's, one record per line) is read the same way.

    The device gives one record per `read()` and `EPIPE` when the ring overwrote the next
    record (the read then goes on from the oldest one left, and the sequence numbers tell
    how many were lost); `EAGAIN` means no record is left."""
    faults: list[tuple[KmsgRecord, GpuFault]] = []
    lost = 0
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        device = stat.S_ISCHR(os.fstat(descriptor).st_mode)
        lines = _records(descriptor) if device else _lines(descriptor)
        for count, raw in enumerate(lines):
            if count >= limit:
                break
            try:
                record = parse_record(raw)
            except KmsgError:
                continue
            admission = admit(cursor, boot_id, record.seq)
            cursor, lost = admission.cursor, lost + admission.lost
            if admission.fresh and (fault := parse_fault(record)) is not None:
                faults.append((record, fault))
    finally:
        os.close(descriptor)
    return Batch(tuple(faults), lost, cursor)


def _records(descriptor: int) -> Iterator[bytes]:
    while True:
        try:
            raw = os.read(descriptor, MAX_RECORD_BYTES)
        except BlockingIOError:
            return
        except BrokenPipeError:
            continue  # overwritten: the next read starts at the oldest record left
        if not raw:
            return
        yield raw


def _lines(descriptor: int) -> Iterator[bytes]:
    with os.fdopen(os.dup(descriptor), "rb") as stream:
        yield from stream
