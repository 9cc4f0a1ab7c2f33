"""The node's GPUs as CDI devices, named as `nvidia-ctk cdi generate` names them, and the
spec they make with the installed driver's files (`gpuop.host.cdi`).

Called by the driver-manager after a load and a rollback, and by `gpuop cdi generate`. Each
GPU answers to its NVML index (`0`) and UUID (`GPU-...`) and gives `/dev/nvidia<minor>`; each
MIG device of a GPU in MIG mode to `<gpu index>:<MIG index>` and its `MIG-...` UUID, and gives
its GPU's node and its GPU and compute instances' capability nodes; `all` gives every node.
"""

from __future__ import annotations

from gpuop.host import cdi
from gpuop.host.roots import HostRoot
from gpuop.nvml import Nvml, opened


def gpu_devices(nvml: Nvml, root: HostRoot) -> tuple[cdi.Device, ...]:
    """Every GPU and MIG device NVML sees, then `all`; NVML's session must be open. Raises
    `NvmlError`."""
    devices: list[cdi.Device] = []
    for index in range(nvml.device_count()):
        info = nvml.device_info(index)
        node = f"/dev/nvidia{info.minor_number}"
        devices.append(cdi.Device((str(info.index), info.uuid), (node,)))
        if not info.mig_mode_current:
            continue
        for mig in nvml.mig_devices(index):
            capabilities = cdi.mig_capability_nodes(
                root, info.minor_number, mig.gpu_instance_id, mig.compute_instance_id
            )
            devices.append(
                cdi.Device((f"{info.index}:{mig.index}", mig.uuid), (node, *capabilities))
            )
    return cdi.with_all(devices)


def generate(root: HostRoot, nvml: Nvml, kind: str = cdi.KIND) -> bytes:
    """The spec for the driver in use on `root` and the GPUs a closed `nvml` session sees
    (opened and closed here). `CdiError` without an installed driver or without a GPU,
    `NvmlError` when NVML fails."""
    driver = cdi.driver_files(root)  # before NVML: a host without a driver says so first
    with opened(nvml) as session:
        devices = gpu_devices(session, root)
    return cdi.encode(cdi.spec(devices, driver, cdi.control_nodes(root), kind, root))
