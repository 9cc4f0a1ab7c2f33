"""The simulated host as the driver-manager's plugin (entry point `gpuop.kernels:simulated`):
`SimKernel` for its kernel, `SimRebooter` to reboot the simulation, `SimCudaProbe` for
the validation ladder's CUDA rung, and `SimFunctionResets` for the resets of one GPU.

`SimRebooter` ends every module and hold, writes a new boot id, and loads again the modules
that were loaded before (as a host that loads its drivers at boot would), each at the active
version. The agent keeps running, as the next boot's agent would.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from gpuop.host import components, modules
from gpuop.host.cuda import CudaProbe
from gpuop.host.protocol import KernelOps, Rebooter
from gpuop.host.resets import FunctionResets
from gpuop.host.restarting import RuntimeService
from gpuop.host.roots import HostRoot
from gpuop_sim.host.simcuda import SimCudaProbe
from gpuop_sim.host.simkernel import SimKernel
from gpuop_sim.host.simreset import SimFunctionResets
from gpuop_sim.host.simruntime import SimRuntime

log = logging.getLogger(__name__)


class SimRebooter:
    """Reboots a simulated node whose `/` is the host root."""

    def __init__(self, root: HostRoot) -> None:
        self.kernel = SimKernel(root)

    async def reboot(self) -> None:
        running = {module.name for module in modules.loaded_modules(self.kernel.root)}
        managed = [m for c in components.MODULES for m in components.modules_of(c)]
        again = components.load_order(m for m in managed if m in running)
        boot_id = await asyncio.to_thread(self.kernel.reboot, load=again)
        log.info("simulated reboot done: boot id %s, loaded %s", boot_id, " ".join(again))


@dataclass(frozen=True)
class SimulatedNode:
    """A `gpuop.host.protocol.SimulatedHost`."""

    kernel: KernelOps
    rebooter: Rebooter
    root: HostRoot
    runtime: RuntimeService
    function_resets: FunctionResets

    def cuda_probe(self, count_gpus: Callable[[], int]) -> CudaProbe:
        return SimCudaProbe(self.root, count_gpus)


def simulated_host(root: HostRoot) -> SimulatedNode:
    """The plugin's entry point: the simulated kernel and reboot of the host under `root`
    (and its CUDA probe and GPU resets)."""
    return SimulatedNode(
        SimKernel(root), SimRebooter(root), root, SimRuntime(root), SimFunctionResets(root)
    )
