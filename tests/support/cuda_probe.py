"""Runs the driver-manager's CUDA probe (`gpuop.host.cuda.LibcudaProbe`) against one
libcuda and prints its report as JSON: `python -m tests.support.cuda_probe LIBCUDA TIMEOUT`.

The real-libcuda test runs this in a private `/dev` (`nvml_library.in_private_dev`): libcuda
run as root makes `/dev/nvidiactl` as libnvidia-ml does, and must not make it in the
machine's `/dev`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from pathlib import Path

from gpuop.host.cuda import LibcudaProbe, error_name
from gpuop.host.roots import HostRoot


def main(argv: list[str]) -> int:
    library, timeout = Path(argv[0]), float(argv[1])
    probe = LibcudaProbe(HostRoot(Path("/nonexistent")), library=library)
    report = asyncio.run(probe.probe("535.261.03", timeout))
    found = dataclasses.asdict(report)
    found["name"] = error_name(report.error)
    found["described"] = report.describe()
    print(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
