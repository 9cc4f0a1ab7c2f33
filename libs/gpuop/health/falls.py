"""GPUs that fell off the bus, remembered across reboots: a GPU that falls again in a later
boot than its first fall asks for new hardware, not another reboot.

The catalogs send a GPU that fell off the bus (XID 79 from NVML or the kernel log, or
`NVML_ERROR_GPU_IS_LOST`) to a reboot, NVIDIA's resolution for a first fall. The reboot is
the test: a GPU that falls again after it is at fault, or its slot or its power, and the
health catalog's `gpu-lost-again` sends it to `drain-and-replace`. Telemetry's health
tracker asks `Falls.again` at each fall; what it remembers is a small JSON file on the
host (`{"<GPU uuid>": ["<boot id of a fall>", ...]}`, in the directory the chart mounts for
telemetry's state), since the telemetry that saw the first fall did not survive the reboot.

A file that cannot be read or written is logged and the fall counts as a first one: the
worst outcome is one more reboot before the hand-off, never a GPU handed off wrongly.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from gpuop.host import system
from gpuop.host.errors import HostError
from gpuop.host.files import write_atomic
from gpuop.host.roots import HostRoot

log = logging.getLogger(__name__)

STATE = "var/lib/gpuop/telemetry/gpu-falls.json"
"""Where the falls are kept, relative to the host root (beside the kernel log's cursor)."""
MAX_BOOTS = 8
"""Boots remembered per GPU (the latest): enough to tell a first fall from a second."""


def at(host: HostRoot) -> Falls:
    """The falls kept on the host at `host`, with its boot id (`None` when unreadable)."""

    def boot_id() -> str | None:
        try:
            return system.boot_id(host)
        except HostError as error:
            log.warning("boot id unreadable (%s): a fall counts as a first one", error)
            return None

    return Falls(host.join(STATE), boot_id)


class Falls:
    """The boots in which each GPU fell off the bus, kept in `path`; `boot_id` reads the
    current boot's id (None when unknown: every fall then counts as a first one)."""

    def __init__(self, path: Path, boot_id: Callable[[], str | None]) -> None:
        self.path = path
        self._boot_id = boot_id

    def again(self, uuid: str) -> bool:
        """Record that GPU `uuid` fell off the bus now; whether it had fallen in an earlier
        boot (the reboot meant to bring it back did not)."""
        boot = self._boot_id()
        if boot is None:
            return False
        seen = self._read()
        boots = seen.get(uuid, [])
        earlier = any(b != boot for b in boots)
        if boot not in boots:
            seen[uuid] = [*boots, boot][-MAX_BOOTS:]
            self._write(seen)
        return earlier

    def _read(self) -> dict[str, list[str]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as error:
            log.warning("GPU falls in %s unreadable (%s): counted afresh", self.path, error)
            return {}
        if not isinstance(data, dict):
            return {}
        return {
            str(uuid): [str(b) for b in boots]
            for uuid, boots in data.items()
            if isinstance(boots, list)
        }

    def _write(self, seen: dict[str, list[str]]) -> None:
        try:
            write_atomic(self.path, json.dumps(seen, sort_keys=True))
        except OSError as error:
            log.warning("GPU falls not kept in %s: %s", self.path, error)
