"""XIDs put on a simulated node's GPUs from outside its services: the demo's fault knob.

`SimNvml.inject_xid` reaches only the watchers of the same process; a node's services are
processes of their own (`gpuop demo`), so an XID meant for telemetry's watcher goes through
a file under the node's host root instead, as the GPU reset counts do (`gpuop_sim.host.simreset`):

    run/gpuop/sim-nvml/xids.jsonl    one line per XID: {"gpu": "<GPU uuid>", "xid": 48}
    run/gpuop/sim-nvml/nvlink.jsonl  one line per burst of NVLink errors, the counts each
                                     error total grows by, by field id:
                                     {"gpu": "<GPU uuid>", "nvlink": {"52": 180}}

`inject` appends a line (one `write` of a short line on an `O_APPEND` file, so writers never
interleave); every `SimNvml` made with the file (`--nvml sim:` makes them so) follows it with
an `XidFeed` from the end it found when made, and hands each new line to its open event
watchers, as the driver would hand the XID to every process registered for events. An XID
put there while no watcher is open reaches nobody, as on a real node. NVLink errors
(`inject_nvlink_errors`, read with an `NvlinkFeed`) grow the GPU's counters when the next
field query reads them, whoever reads. A line that is not such an object is skipped.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path

XIDS = "run/gpuop/sim-nvml/xids.jsonl"
"""Where a node's injected XIDs are kept under its host root."""
NVLINK = "run/gpuop/sim-nvml/nvlink.jsonl"
"""Where a node's injected NVLink errors are kept under its host root."""
MAX_XID = 65535


def inject(host_root: Path, gpu_uuid: str, xid: int) -> None:
    """The driver of the node at `host_root` reports XID `xid` on GPU `gpu_uuid`."""
    if not 0 <= xid <= MAX_XID:
        raise ValueError(f"XID {xid}: expected 0 to {MAX_XID}")
    _append(host_root / XIDS, {"gpu": gpu_uuid, "xid": xid})


def inject_nvlink_errors(host_root: Path, gpu_uuid: str, counts: Mapping[int, int]) -> None:
    """GPU `gpu_uuid` of the node at `host_root` counts NVLink errors: each error total
    (by `FieldId`) grows by its count."""
    if any(count < 0 for count in counts.values()):
        raise ValueError("NVLink error counts cannot be negative")
    _append(host_root / NVLINK, {"gpu": gpu_uuid, "nvlink": {str(f): n for f, n in counts.items()}})


def _append(path: Path, entry: dict[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(entry, separators=(",", ":")) + "\n"
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, line.encode())
    finally:
        os.close(descriptor)


class LineFeed:
    """The JSON lines appended to `path` since the feed was made (or last taken)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._offset = _size(path)

    def lines(self) -> list[bytes]:
        """The new complete lines, in the order they were put; a line still being written
        is left for the next call."""
        with self._lock:
            try:
                with self.path.open("rb") as file:
                    file.seek(self._offset)
                    data = file.read()
            except FileNotFoundError:
                return []
            complete = data[: data.rfind(b"\n") + 1]
            self._offset += len(complete)
        return complete.splitlines()


class XidFeed(LineFeed):
    """The XIDs appended to `path` since the feed was made (or last taken)."""

    def take(self) -> list[tuple[str, int]]:
        """The new XIDs as (GPU uuid, XID), in the order they were put."""
        return [xid for line in self.lines() if (xid := _parse(line)) is not None]


class NvlinkFeed(LineFeed):
    """The NVLink errors appended to `path` since the feed was made (or last taken)."""

    def take(self) -> list[tuple[str, dict[int, int]]]:
        """The new bursts as (GPU uuid, counts by field id), in the order they were put."""
        return [burst for line in self.lines() if (burst := _parse_nvlink(line)) is not None]


def _parse_nvlink(line: bytes) -> tuple[str, dict[int, int]] | None:
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    counts = entry.get("nvlink") if isinstance(entry, dict) else None
    if not isinstance(entry, dict) or not isinstance(counts, dict):
        return None
    gpu = entry.get("gpu")
    valid = all(k.isdigit() and type(n) is int and n >= 0 for k, n in counts.items())
    if not isinstance(gpu, str) or not valid:
        return None
    return gpu, {int(k): n for k, n in counts.items()}


def _parse(line: bytes) -> tuple[str, int] | None:
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    if not isinstance(entry, dict):
        return None
    gpu, xid = entry.get("gpu"), entry.get("xid")
    if not isinstance(gpu, str) or type(xid) is not int or not 0 <= xid <= MAX_XID:
        return None
    return gpu, xid


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
