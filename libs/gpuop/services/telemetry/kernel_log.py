"""XIDs from the host's kernel log, beside NVML's events, as one stream of faults.

NVML tells telemetry of an XID only if its event set was registered before the fault, and a
GPU that fell off the bus or whose GSP stopped answering can stall NVML itself; the kernel
log keeps arriving. `KernelLog.poll` reads the records of the host's `/dev/kmsg` (through
the host root) that it has not read before (`gpuop.health.kmsg`), and turns each GPU fault
into the `XidEvent` NVML would have sent, matched to the GPU by its PCI address in the last
inventory telemetry saw (which outlives an NVML session that no longer opens). A fault the
log names on an address no known GPU has is counted and dropped.

`SeenFaults` makes the two sources one: an XID of a GPU seen from either source is acted on
once; the same XID of the same GPU from the other source within `window` seconds is a
duplicate (counted, not acted on), so a fault both sources report is one health event.

The cursor (boot id, last sequence number) is kept in `state` (a file on the host, in the
directory the chart mounts for it) after every poll, so a restart neither repeats the faults
it acted on nor loses the ones that came while it was down. Without a cursor of the current
boot (the first start, or after a reboot) it starts at the log's end: the faults of earlier
boots and of before gpuop ran are history, not news (NVSentinel starts there too).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from gpuop.health import kmsg
from gpuop.nvml import XidEvent
from gpuop.services.telemetry.sessions import Inventory

KMSG = Path("dev/kmsg")
"""The kernel log, relative to the host root."""
BOOT_ID = Path("proc/sys/kernel/random/boot_id")
STATE = Path("var/lib/gpuop/telemetry/kmsg-cursor.json")
"""Where the cursor is kept, relative to the host root (the chart mounts its directory)."""

log = logging.getLogger(__name__)


@dataclass
class SeenFaults:
    """XIDs already acted on, per GPU, for de-duplication across the two sources."""

    window: float = 30.0
    _last: dict[tuple[str, int], float] = field(default_factory=dict)

    def first(self, uuid: str, xid: int, now: float) -> bool:
        """Whether this XID of this GPU is news at `now` (and remember it if so)."""
        for key, seen in list(self._last.items()):
            if now - seen > self.window:
                del self._last[key]
        if (uuid, xid) in self._last:
            return False
        self._last[(uuid, xid)] = now
        return True


@dataclass
class Poll:
    """What one poll of the kernel log found."""

    events: list[XidEvent]
    unknown_gpus: int = 0
    """Faults on an address that no GPU of the inventory has."""
    lost: int = 0
    """Records the ring overwrote before they were read."""


class KernelLog:
    """The host's kernel log under `host_root`, read from where the last poll stopped."""

    def __init__(self, host_root: Path, *, state: Path | None = None) -> None:
        self.path = host_root / KMSG
        self.boot_id_path = host_root / BOOT_ID
        self.state = state if state is not None else host_root / STATE
        self.cursor: kmsg.KmsgCursor | None = None

    def poll(self, inventory: Inventory | None) -> Poll:
        """Read what is new (blocking file reads: call it off the event loop)."""
        boot_id = self.boot_id_path.read_text(encoding="ascii").strip()
        cursor = self.cursor or self._stored(boot_id)
        at_end = cursor is None
        batch = kmsg.read_new(str(self.path), cursor or kmsg.KmsgCursor(boot_id), boot_id)
        self.cursor = batch.cursor
        self._store(batch.cursor)
        if at_end:  # no cursor of this boot: start at the end, what came before is history
            return Poll([], lost=0)
        gpus = {kmsg.pci_key(gpu.pci_bus_id): gpu for gpu in (inventory.gpus if inventory else ())}
        found = Poll([], lost=batch.lost)
        for _, fault in batch.faults:
            gpu = gpus.get(fault.pci)
            if gpu is None:
                found.unknown_gpus += 1
                continue
            found.events.append(
                XidEvent(
                    index=gpu.index,
                    uuid=gpu.uuid,
                    xid=fault.xid,
                    gpu_instance_id=fault.gpu_instance,
                    compute_instance_id=fault.compute_instance,
                )
            )
        return found

    def _stored(self, boot_id: str) -> kmsg.KmsgCursor | None:
        try:
            data = json.loads(self.state.read_text(encoding="utf-8"))
            cursor = kmsg.KmsgCursor(str(data["boot_id"]), int(data["last_seq"]))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as error:
            log.warning(
                "kernel log cursor %s unreadable (%s): starting at the end", self.state, error
            )
            return None
        return cursor if cursor.boot_id == boot_id else None

    def _store(self, cursor: kmsg.KmsgCursor) -> None:
        if cursor.last_seq is None:
            return
        text = json.dumps({"boot_id": cursor.boot_id, "last_seq": cursor.last_seq})
        try:
            self.state.parent.mkdir(parents=True, exist_ok=True)
            partial = self.state.with_suffix(".tmp")
            partial.write_text(text, encoding="utf-8")
            partial.replace(self.state)
        except OSError as error:
            log.warning("kernel log cursor not kept in %s: %s", self.state, error)
