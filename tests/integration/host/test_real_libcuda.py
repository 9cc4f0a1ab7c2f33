"""The CUDA rung's probe against NVIDIA's real libcuda on a machine without a GPU: Debian's
`libcuda1` 535.261.03 (fetched and unpacked, never installed: `tests.support.nvml_library`),
loaded by `gpuop.host.cudarun` in the child `LibcudaProbe` starts, in a process whose `/dev`
is private (libcuda run as root makes `/dev/nvidiactl`, as NVML does). It must end as a
clean report with the CUDA error `cuInit` returned, not as a crash or a hang."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import nvml_library
from tests.support.driver_packages import REPOSITORY

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

NO_DRIVER_ERRORS = {
    100: "CUDA_ERROR_NO_DEVICE",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    35: "CUDA_ERROR_INSUFFICIENT_DRIVER",
    999: "CUDA_ERROR_UNKNOWN",
}
"""What cuInit may answer with no NVIDIA driver loaded."""


@pytest.fixture(scope="module")
def libcuda() -> Path:
    for tool in ("apt-get", "dpkg-deb", "unshare", "mount", "mknod"):
        if shutil.which(tool) is None:
            pytest.fail(
                f"{tool} is not installed: apt-get install dpkg util-linux mount coreutils "
                "(with Debian's archive reachable for apt)"
            )
    return nvml_library.real_library("libcuda1", "libcuda.so.1", "cuda") / "libcuda.so.1"


def run_probe(library: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "tests.support.cuda_probe", str(library), "60"]
    result = subprocess.run(
        nvml_library.in_private_dev(command),
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, f"the probe failed:\n{result.stderr[-4000:]}"
    found: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return found


def test_the_real_libcuda_without_a_gpu_fails_cuinit_cleanly(libcuda: Path) -> None:
    found = run_probe(libcuda)
    print(f"\nreal libcuda 535.261.03, no GPU: {found['described']}")
    assert found["call"] == "cuInit", found
    assert found["error"] in NO_DRIVER_ERRORS, found
    assert found["name"] == NO_DRIVER_ERRORS[found["error"]]
    assert found["devices"] == 0
    assert found["described"] == f"cuInit failed: {found['name']} ({found['error']})"
