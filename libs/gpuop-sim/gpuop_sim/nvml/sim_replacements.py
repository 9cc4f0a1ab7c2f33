"""GPUs of a simulated node replaced by new boards: the demo's and the tests' repair knob.

A GPU that the remediation hands over for replacement (`drain-and-replace`) comes back as
another board in the same slot: the same PCI address and index, another UUID and serial. A
node's services are processes of their own, so the swap goes through a file under the node's
host root, as the injected XIDs do (`sim_xids`):

    run/gpuop/sim-nvml/replaced.json    {"<GPU index>": <boards put in that slot since>}

`replace_gpu` counts one more board in a slot; every `SimNvml` made with the file (`--nvml
sim:` makes them so) reads it when a session opens and gives that GPU the identity of its
new board, clean as after a driver load. A file that is not such an object counts as none.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpuop.host.files import write_atomic

REPLACED = "run/gpuop/sim-nvml/replaced.json"
"""Where a node's replaced GPUs are counted under its host root."""


def boards(path: Path) -> dict[int, int]:
    """GPU index -> boards put in its slot since the first; empty without a readable file."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        int(index): count
        for index, count in data.items()
        if index.isdigit() and isinstance(count, int) and count > 0
    }


def replace_gpu(host_root: Path, index: int) -> None:
    """A new board goes into the slot of GPU `index` of the node at `host_root`."""
    path = host_root / REPLACED
    counted = boards(path)
    counted[index] = counted.get(index, 0) + 1
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({str(i): n for i, n in sorted(counted.items())}).encode())
