"""The simulated node's CUDA probe (`gpuop.host.cuda.CudaProbe`), for the validation
ladder's CUDA rung: it answers from the simulated kernel's files as libcuda would.

    nvidia not loaded                       cuInit: CUDA_ERROR_NO_DEVICE (100)
    nvidia of another version loaded        cuInit: CUDA_ERROR_SYSTEM_DRIVER_MISMATCH (803)
    loaded from a build that brings up      cuInit: CUDA_ERROR_NO_DEVICE (100)
      no GPU (the simulated kernel's no-gpus)
    otherwise                               a context on every GPU the simulated
                                            NVML sees

A test or an operator of the demo tells it to fail by writing `FAULT` under the host root:
a CUDA error number (`cuCtxCreate` fails with it on the first GPU), or `hang` (the probe
never answers, as a libcuda stuck on a wedged GPU, until its timeout).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gpuop.host import modules
from gpuop.host.cuda import CudaReport
from gpuop.host.roots import HostRoot
from gpuop_sim.host.simstate import NO_GPUS

FAULT = "run/gpuop/sim-cuda/fault"
"""A CUDA error number, or `hang`; absent: healthy."""
HANG = "hang"
NO_DEVICE = 100
DRIVER_MISMATCH = 803


class SimCudaProbe:
    """`CudaProbe` for the simulated node under `root`."""

    def __init__(self, root: HostRoot, count_gpus: Callable[[], int]) -> None:
        self.root = root
        self.count_gpus = count_gpus
        """The GPUs the node has: the simulated NVML's count (`--nvml sim:<gpus>`)."""

    async def probe(self, version: str, timeout_seconds: float) -> CudaReport:
        fault = (self.root.read_text(FAULT) or "").strip()
        if fault == HANG:
            await asyncio.sleep(timeout_seconds)
            return CudaReport(0, -1, "timeout", f"hung past {timeout_seconds:g} s; killed")
        loaded = modules.module_version(self.root, "nvidia")
        if loaded is None or self.root.join(f"{NO_GPUS}/nvidia").exists():
            return CudaReport(0, NO_DEVICE, "cuInit")
        if loaded != version:
            detail = f"libcuda {version}, nvidia module {loaded}"
            return CudaReport(0, DRIVER_MISMATCH, "cuInit", detail)
        gpus = await asyncio.to_thread(self.count_gpus)
        if fault:
            return CudaReport(gpus, int(fault), "cuCtxCreate", "GPU 0")
        return CudaReport(gpus)
