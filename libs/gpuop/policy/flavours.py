"""Which kernel modules a node's GPU driver runs: the policy's `kernelModuleType`, resolved.

Called by the upgrade orchestrator's controller when it starts a node's saga (the flavour
is then recorded in the saga's `SagaStarted`, so `gpuop replay` never resolves it again) and
when it compares what a node runs with the policy. Pure: the node is described by its
inventory (`gpuop.events.hardware.HardwareDiscovered`), the driver by its version.

`open` and `proprietary` are what they say. `auto` follows upstream, where the driver
container asks NVIDIA's installer (`nvidia-installer --print-recommended-kernel-module-type`,
whose rule is `valid_kernel_module_types` in its `kernel.c`) and falls back on the branch
when the installer cannot tell:

    1. a GPU that runs only the open modules (Blackwell and later, Grace Hopper): `open`
    2. else a GPU the open modules do not support (Volta and earlier: no GSP): `proprietary`
    3. else (Turing to Hopper): `open` from branch 560 on, when NVIDIA made open the
       installer's default, and `proprietary` before
    4. no GPU whose architecture is known (none found yet): rule 3 alone, the driver
       container's fallback (`branch >= 560`)

A GPU's architecture is NVML's (`Gpu.architecture`) when the inventory has it; a node whose
driver is not loaded has no NVML answers, so the PCI device id of each NVIDIA display
function stands in (`architecture_of`), by the ranges NVIDIA allocates per chip family; an id
above the table is taken for Blackwell or later (NVIDIA's ids grow with each family, and
every family since Blackwell runs only the open modules)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuop.events.driver import Flavour
from gpuop.events.hardware import HardwareDiscovered

NVIDIA_VENDOR = "10de"
DISPLAY_CLASS_PREFIX = "03"
"""PCI base class 03: VGA (`0300xx`) and 3D controllers (`0302xx`); a GPU's audio function
(`0403xx`) and NVSwitches (`0680xx`) are not GPUs."""
OPEN_DEFAULT_BRANCH = 560
"""The first driver branch whose installer recommends the open modules on Turing and later."""

OPEN_ONLY = frozenset({"blackwell", "rubin"})
"""Architectures whose GPUs run only the open modules."""
OPEN_UNSUPPORTED = frozenset({"tesla", "fermi", "kepler", "maxwell", "pascal", "volta"})
"""Architectures the open modules do not support (they need the GSP, Turing's first)."""
OPEN_SUPPORTED = frozenset({"turing", "ampere", "ada-lovelace", "hopper"})
"""Architectures that run either; the branch decides."""
GRACE_HOPPER_DEVICE_IDS = frozenset({"2342", "2348"})
"""GH200 (Grace Hopper) device ids: Hopper GPUs that, coupled to Grace, run only the open
modules."""

_DEVICE_ID_RANGES: tuple[tuple[int, int, str], ...] = (
    (0x0FC0, 0x12BF, "kepler"),
    (0x1340, 0x17FF, "maxwell"),
    (0x15F0, 0x15FF, "pascal"),
    (0x1B00, 0x1D7F, "pascal"),
    (0x1D80, 0x1DFF, "volta"),
    (0x1E00, 0x1FFF, "turing"),
    (0x2000, 0x20FF, "ampere"),
    (0x2180, 0x21FF, "turing"),
    (0x2200, 0x25FF, "ampere"),
    (0x2300, 0x23FF, "hopper"),
    (0x2600, 0x28FF, "ada-lovelace"),
    (0x2900, 0x2FFF, "blackwell"),
)
"""NVIDIA device ids per chip family, as the PCI id database lists them (GK, GM, GP, GV,
TU, GA, GH, AD, GB): `2335` (H200) is Hopper, `1eb8` (T4) Turing, `2901` (B200) Blackwell.
Later entries win where ranges overlap (GP100's `15fx` sits inside Maxwell's span, Hopper's
`23xx` inside Ampere's)."""


@dataclass(frozen=True)
class Resolution:
    """The flavour a node's GPU driver runs, and why, for the saga's log line."""

    flavour: Flavour
    reason: str


def branch_of(version: str) -> int | None:
    """The driver branch, the version's first number: 580 for `580.159.04`; None when the
    version does not start with one."""
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def architecture_of(device_id: str) -> str | None:
    """The architecture of an NVIDIA PCI device id (`2335`, 4 hex digits); None for an id
    outside every known range (too old, or newer than the table)."""
    try:
        number = int(device_id, 16)
    except ValueError:
        return None
    found = None
    for low, high, family in _DEVICE_ID_RANGES:
        if low <= number <= high:
            found = family
    if found is None and number > 0x2FFF:
        return "blackwell"  # ids only grow: a chip newer than the table is Blackwell or later
    return found


def gpu_architectures(inventory: HardwareDiscovered) -> tuple[str, ...]:
    """The architecture of each GPU of the node: NVML's when it named one, else the PCI
    device id's, for every NVIDIA display function (the only source while no driver is
    loaded). Unknown ones are left out."""
    named = {gpu.pci_bus_id.lower(): gpu.architecture for gpu in inventory.gpus}
    found: list[str] = []
    for function in inventory.pci_functions:
        if function.vendor_id != NVIDIA_VENDOR:
            continue
        if not function.class_id.startswith(DISPLAY_CLASS_PREFIX):
            continue
        architecture = named.get(function.address.lower()) or architecture_of(function.device_id)
        if architecture is not None:
            found.append(architecture)
    listed = {function.address.lower() for function in inventory.pci_functions}
    found.extend(
        gpu.architecture
        for gpu in inventory.gpus
        if gpu.architecture and gpu.pci_bus_id.lower() not in listed
    )
    return tuple(found)


def _grace_hopper(inventory: HardwareDiscovered) -> bool:
    return any(
        f.vendor_id == NVIDIA_VENDOR and f.device_id in GRACE_HOPPER_DEVICE_IDS
        for f in inventory.pci_functions
    ) or any("GH200" in gpu.model_name for gpu in inventory.gpus)


def resolve(
    kernel_module_type: str, inventory: HardwareDiscovered | None, version: str
) -> Resolution:
    """The flavour the policy's `kernel_module_type` (`auto`, `open`, `proprietary`) means for
    a node with `inventory` (None: not reported yet) running driver `version`."""
    if kernel_module_type != "auto":
        return Resolution(Flavour(kernel_module_type), f"kernelModuleType is {kernel_module_type}")
    architectures = gpu_architectures(inventory) if inventory is not None else ()
    grace_hopper = inventory is not None and _grace_hopper(inventory)
    return recommended(architectures, version, grace_hopper=grace_hopper)


def recommended(
    architectures: Iterable[str], version: str, *, grace_hopper: bool = False
) -> Resolution:
    """`auto`'s choice for GPUs of `architectures` and driver `version` (rules 1 to 4 of the
    module docstring)."""
    families = sorted(set(architectures))
    needs_open = sorted(set(families) & OPEN_ONLY)
    if grace_hopper:
        needs_open.append("grace-hopper")
    if needs_open:
        return Resolution(Flavour.OPEN, f"{', '.join(needs_open)} GPUs run only open modules")
    unsupported = sorted(set(families) & OPEN_UNSUPPORTED)
    if unsupported:
        return Resolution(
            Flavour.PROPRIETARY, f"{', '.join(unsupported)} GPUs cannot run open modules"
        )
    branch = branch_of(version)
    known = [family for family in families if family in OPEN_SUPPORTED]
    gpus = f"{', '.join(known)} GPUs" if known else "no known GPU"
    if branch is not None and branch >= OPEN_DEFAULT_BRANCH:
        return Resolution(Flavour.OPEN, f"{gpus}, branch {branch} recommends open modules")
    return Resolution(
        Flavour.PROPRIETARY,
        f"{gpus}, branch {branch if branch is not None else version} predates open modules "
        f"by default ({OPEN_DEFAULT_BRANCH})",
    )
