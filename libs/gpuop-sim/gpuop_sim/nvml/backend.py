"""`--nvml sim:<gpus>` (entry point `gpuop.nvml:sim`): `gpus` simulated H200s (1 to 64), their
driver the `nvidia` module of the simulated kernel under `--host-root`."""

from __future__ import annotations

from pathlib import Path

from gpuop.nvml.errors import InvalidBackendSpec
from gpuop_sim.nvml import sim_mig_fault, sim_replacements, sim_xids
from gpuop_sim.nvml.modules import HostRootModules
from gpuop_sim.nvml.simulated import MAX_GPUS, SimNvml

MIG_STATE = "run/gpuop/sim-nvml/mig.json"
"""Where the node's simulated MIG state lives under its host root, shared by its services."""


def open_sim(
    argument: str, *, spec: str, host_root: Path, node: str, holder_id: str | None
) -> SimNvml:
    """The simulated NVML of node `node`; `InvalidBackendSpec` for a bad GPU count."""
    if not argument.isdigit() or not 1 <= int(argument) <= MAX_GPUS:
        raise InvalidBackendSpec(
            f"--nvml {spec!r}: the GPU count must be a number from 1 to {MAX_GPUS}"
        )
    modules = HostRootModules(host_root)
    return SimNvml(
        int(argument),
        node=node,
        module_state=modules,
        holder_id=holder_id,
        mig_state=host_root / MIG_STATE,
        xid_feed=host_root / sim_xids.XIDS,
        nvlink_feed=host_root / sim_xids.NVLINK,
        mig_fault=host_root / sim_mig_fault.MIG_FAULT,
        replaced=host_root / sim_replacements.REPLACED,
    )
