"""`gpuop run ...` with tracemalloc at hand, for the soak benchmark's `--trace KIND`: the first
SIGUSR2 starts tracing (at the end of warm-up, so imports and start-up cost nothing), the
second writes a snapshot of the traced allocations still held to `held.snapshot` in the
directory `SOAK_SNAPSHOTS` names: what the service allocated after warm-up and kept.

Run as `python -m tests.bench._traced run <service> ...`, with the arguments of `gpuop`.
Tracing slows the service and takes memory of its own: its resident memory is no figure.
"""

from __future__ import annotations

import os
import signal
import sys
import tracemalloc
from pathlib import Path
from types import FrameType

FRAMES = 12
"""Frames kept per allocation: enough to reach the service's own code from a library's."""
SNAPSHOT = "held.snapshot"


def main() -> int:
    directory = Path(os.environ["SOAK_SNAPSHOTS"])
    directory.mkdir(parents=True, exist_ok=True)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if not tracemalloc.is_tracing():
            tracemalloc.start(FRAMES)
            return
        partial = directory / f"{SNAPSHOT}.partial"
        tracemalloc.take_snapshot().dump(str(partial))
        partial.rename(directory / SNAPSHOT)  # whole, or not there

    signal.signal(signal.SIGUSR2, on_signal)
    from gpuop.cli.main import main as gpuop

    return gpuop(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
