"""GPU resets on a simulated host, kept in the host root where every simulated NVML sees them.

The driver-manager of a simulated node resets a GPU alone through `SimFunctionResets` (its
`gpuop.host.resets.FunctionResets`), and reloads the driver through `SimKernel`, which
counts each load of `nvidia` here (`driver_loaded`). Each process's simulated NVML reads the
counts when a session opens (`reset_counts`, through `gpuop_sim.nvml.modules`): a GPU reset
since its last session, or every GPU after a driver load, starts again without its volatile
ECC errors, pending row remaps and processes, and answers again if it had fallen off the
bus. So telemetry, whose session the saga's pause closed around the reset, reports the GPU
`recovered` when it resumes.

    run/gpuop/sim-gpu-reset/count/<bus id>   resets of that GPU (NVML's bus id, `:` as `_`)
    run/gpuop/sim-gpu-reset/count/driver     loads of the `nvidia` module
    run/gpuop/sim-gpu-reset/fault            a test's or a demo operator's fault (below)

The fault file holds one word, for every GPU of the node:

    fail          the reset is refused, as a kernel answering EIO would
    unsupported   no function reset is offered (the sysfs `reset` file is absent)
    hang          the reset never returns (the command's timeout ends it)
    stuck         the GPU is wedged until the node reboots: the reset is refused and the
                  `nvidia` module does not load again (`SimKernel`); a reboot clears it
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from gpuop.host.files import exclusive_lock, write_atomic
from gpuop.host.resets import FunctionResetFailed
from gpuop.host.roots import HostRoot

STATE_DIR = "run/gpuop/sim-gpu-reset"
COUNTS = f"{STATE_DIR}/count"
LOCK = f"{STATE_DIR}/lock"
FAULT = f"{STATE_DIR}/fault"
DRIVER = "driver"
"""The count of `nvidia` loads: a reset of every GPU."""
FAIL, UNSUPPORTED, HANG, STUCK = "fail", "unsupported", "hang", "stuck"
FAULTS = (FAIL, UNSUPPORTED, HANG, STUCK)
HANG_SECONDS = 24 * 3600.0


def count_key(pci_bus_id: str) -> str:
    """The file name of a GPU's count: its bus id with `:` as `_`."""
    return pci_bus_id.replace(":", "_")


def fault(root: HostRoot) -> str:
    """The fault the host root asks for; empty for none."""
    return (root.read_text(FAULT) or "").strip()


def set_fault(root: HostRoot, word: str | None) -> None:
    """Ask for `word` (one of `FAULTS`), or for no fault with None."""
    path = root.join(FAULT)
    if word is None:
        path.unlink(missing_ok=True)
        return
    if word not in FAULTS:
        raise ValueError(f"unknown GPU reset fault {word!r}: expected one of {', '.join(FAULTS)}")
    write_atomic(path, word + "\n")


def reset_counts(root: Path) -> dict[str, int]:
    """Every count kept under the host root at `root`, by file name."""
    directory = root / COUNTS
    counts = {}
    with contextlib.suppress(FileNotFoundError):
        for entry in directory.iterdir():
            if entry.name.startswith("."):
                continue
            with contextlib.suppress(OSError, ValueError):
                counts[entry.name] = int(entry.read_text().strip() or 0)
    return counts


def record(root: HostRoot, key: str) -> int:
    """Count one more reset under `key`; the new count."""
    with exclusive_lock(root.join(LOCK)):
        path = root.join(f"{COUNTS}/{key}")
        try:
            count = int(path.read_text().strip() or 0) + 1
        except (FileNotFoundError, ValueError):
            count = 1
        write_atomic(path, f"{count}\n")
        return count


def wedged(root: HostRoot) -> bool:
    """A GPU is wedged until the next boot (fault `stuck`)."""
    return fault(root) == STUCK


def rebooted(root: HostRoot) -> None:
    """The node rebooted: a wedged GPU came back with the power cycle."""
    if wedged(root):
        set_fault(root, None)


def driver_loaded(root: HostRoot) -> None:
    """The simulated kernel loaded `nvidia`: every GPU came up from a reset."""
    record(root, DRIVER)


class SimFunctionResets:
    """The function resets of a simulated node's GPUs; a `FunctionResets`."""

    def __init__(self, root: HostRoot) -> None:
        self.root = root

    def offered(self, pci_bus_id: str) -> bool:
        return fault(self.root) != UNSUPPORTED

    async def reset(self, pci_bus_id: str) -> None:
        wanted = fault(self.root)
        if wanted == HANG:
            await asyncio.sleep(HANG_SECONDS)
        if wanted in (FAIL, STUCK):
            raise FunctionResetFailed(
                f"writing 1 to the reset of {pci_bus_id} failed: Input/output error (EIO)"
            )
        if wanted == UNSUPPORTED:
            raise FunctionResetFailed(f"{pci_bus_id} offers no function reset")
        await asyncio.to_thread(record, self.root, count_key(pci_bus_id))
