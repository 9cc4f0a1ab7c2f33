"""What one `nvidia.com/mig.config` request means for one node: its plan, made once.

When a node's label names a config, the orchestrator's runtime makes the saga's `MigPlan`
from three things it has: the label's value, the policy's mig-parted file (inline, or the
ConfigMap's text, `gpuop.policy.mig`) and the node's latest inventory
(`hardware.HardwareDiscovered`). `plan` resolves the config against the node's GPUs with
`gpuop.policy.migconfig.resolve` (by index and PCI id, as mig-parted selects them) and
compares each layout with what the GPU has now:

    layouts      every GPU the config selects, with its layout: what `ApplyMigLayout` sends
    recarved     the GPUs among them whose layout changes: their pods are evicted, and only
                 theirs (a GPU that has its layout already keeps its pods)
    previous     the layout each re-carved GPU had at the start, where the inventory tells
                 it fully (MIG off: no devices; MIG on: the devices discovery reported);
                 None when it does not (MIG on, no device reported), so only the
                 driver-manager's own restore can put it back
    problem      why the request cannot run at all: the file does not parse, it has no config
                 of that name, the config does not fit the node's GPUs, or it turns MIG on
                 for a GPU that cannot do MIG; the saga then
                 fails at once with it as the reason, touching nothing

The plan (`gpuop.events.mig.MigPlan`) is part of the saga's record from its
first moment (`records.new_saga`) and of the `MigReconfigurationStarted` the runtime
records, so a replay decides on the same plan without reading the ConfigMap again. Pure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from gpuop.events import hardware as hw
from gpuop.events.mig import MigPlan, RecarvedGpu
from gpuop.events.mig_commands import GpuMigLayout, MigDeviceCount
from gpuop.policy import migconfig
from gpuop.saga.mig.states import CONFIG_LABEL

__all__ = ["MigPlan", "RecarvedGpu", "changes", "current", "facts", "plan"]


def plan(
    config: str,
    file: migconfig.MigConfigFile | None,
    source: str,
    inventory: hw.HardwareDiscovered | None,
) -> MigPlan:
    """The plan of the request for `config` (the label's value) with the configs of `file`
    (None: the policy has none, or its file did not parse; `source` says which, in words)
    on the node `inventory` describes (None: not discovered yet)."""
    label = f"{CONFIG_LABEL}={config}"
    if file is None:
        return MigPlan(config=config, problem=f"{label}: {source}"[:2048])
    if inventory is None:
        return MigPlan(config=config, problem=f"{label}: the node's GPUs are not discovered yet")
    try:
        layouts = migconfig.resolve(file, config, facts(inventory))
    except migconfig.MigConfigError as error:
        return MigPlan(config=config, problem=f"{label}: {source}: {error}"[:2048])
    by_index = {gpu.index: gpu for gpu in inventory.gpus}
    incapable = [
        layout.gpu_index
        for layout in layouts
        if layout.mig_enabled and by_index[layout.gpu_index].mig_mode is hw.MigMode.UNSUPPORTED
    ]
    if incapable:
        problem = f"{label}: GPU(s) {incapable} cannot do MIG (the node reports it unsupported)"
        return MigPlan(config=config, problem=problem)
    recarved = tuple(
        RecarvedGpu(index=layout.gpu_index, uuid=gpu.uuid, previous=current(gpu))
        for layout in layouts
        if changes(gpu := by_index[layout.gpu_index], layout)
    )
    selected = {layout.gpu_index for layout in layouts}
    others = [current(gpu) for gpu in inventory.gpus if gpu.index not in selected]
    return MigPlan(
        config=config,
        layouts=layouts,
        recarved=recarved,
        other_mig_devices=_devices_on(others),
    )


def facts(inventory: hw.HardwareDiscovered) -> tuple[migconfig.GpuFacts, ...]:
    """The node's GPUs as the resolution reads them: index and PCI id (profiles unknown on
    the cluster side; the driver-manager checks them against NVML)."""
    return tuple(
        migconfig.GpuFacts(index=gpu.index, pci_id=_pci_id(gpu, inventory.pci_functions))
        for gpu in inventory.gpus
    )


def current(gpu: hw.Gpu) -> GpuMigLayout | None:
    """The GPU's layout as far as the inventory tells it fully: MIG off (or unsupported) is
    a layout without devices, MIG on with the devices discovery reported is those; MIG on
    with none reported is unknown (an inventory from before discovery read them, or a GPU
    left empty: the two look alike)."""
    if gpu.mig_mode is not hw.MigMode.ENABLED:
        return GpuMigLayout(gpu_index=gpu.index, mig_enabled=False)
    if not gpu.mig_devices:
        return None
    counts = Counter(device.profile for device in gpu.mig_devices)
    devices = tuple(MigDeviceCount(profile=p, count=n) for p, n in sorted(counts.items()))
    return GpuMigLayout(gpu_index=gpu.index, mig_enabled=True, devices=devices)


def changes(gpu: hw.Gpu, layout: GpuMigLayout) -> bool:
    """Whether `layout` changes `gpu`: unless the GPU is known to have it already."""
    return current(gpu) != layout


def _devices_on(layouts: Sequence[GpuMigLayout | None]) -> int | None:
    """MIG devices on these GPUs; None when the layout of one is unknown."""
    if any(layout is None for layout in layouts):
        return None
    return sum(d.count for layout in layouts if layout is not None for d in layout.devices)


def _pci_id(gpu: hw.Gpu, functions: Sequence[hw.PciFunction]) -> str | None:
    for function in functions:
        if _same_address(function.address, gpu.pci_bus_id):
            return migconfig.pci_id(function.vendor_id, function.device_id)
    return None


def _same_address(sysfs: str, nvml: str) -> bool:
    """sysfs writes `0000:17:00.0`, NVML `00000000:17:00.0`: the same function."""
    domain_a, rest_a = sysfs.lower().split(":", 1)
    domain_b, rest_b = nvml.lower().split(":", 1)
    return int(domain_a, 16) == int(domain_b, 16) and rest_a == rest_b
