"""Node labels implied by an inventory: GPU Feature Discovery's `nvidia.com/*` set and Node
Feature Discovery's `feature.node.kubernetes.io/*` set, with upstream's keys and formats.

Called by discovery's cluster role (which patches them onto the Node) and by
`gpuop discover` (which prints them). Pure functions: the same inventory always gives the
same labels, so a replayed event log labels nodes identically.

Labels that come from NVML (product, memory, CUDA versions, ...) need a loaded driver. While a
node's driver is unloaded during an upgrade, the inventory has NVIDIA PCI functions but no
GPUs; `merge` then keeps the NVML-derived labels the node already had instead of removing
them, so workloads' selectors do not flap for the length of a driver reload.

The sharing labels follow the device plugin config in force on the node, as GFD's do:
`nvidia.com/gpu.replicas` (1 when not shared), `nvidia.com/gpu.sharing-strategy` (`none`,
`time-slicing`, `mps`), `nvidia.com/mps.capable` (`true` when the config shares the GPUs
with MPS: GFD reads it from the config, not from the daemon) and a `-SHARED` suffix on
`nvidia.com/gpu.product` for a shared `nvidia.com/gpu` that is not renamed to
`nvidia.com/gpu.shared`. `with_plugin_config` takes them from the node's
`device.plugin-config-applied`.

`nvidia.com/cdi.ready` and `gpuop.io/runtime.nvidia` (both `true`, or both absent) say that
a GPU container can start here: a valid CDI spec and the `nvidia` runtime handler, see
`containers`. Upstream has neither (its validator writes files under `/run/nvidia/validations`
instead); they are not NVML-derived, so a driver reload that keeps the spec keeps them.

MIG labels follow GFD's (k8s-device-plugin `internal/lm`, `internal/resource`), from the MIG
devices in the inventory. Under the `mixed` strategy each profile on the node gets
`nvidia.com/mig-<profile>.{count,memory,multiprocessors,slices.gi,slices.ci,product,replicas,
sharing-strategy}` and `.engines.{copy,decoder,encoder,jpeg,ofa}` (`+` in a profile becomes
`.`: `mig-1g.18gb.me`; memory in MiB, `slices.gi` the GPU instance's slices, `slices.ci` the
compute instance's). Under `single`, where every GPU has MIG on with devices of one profile,
the `nvidia.com/gpu.*` labels describe a MIG device instead: `gpu.product`
`<model>-MIG-<profile>`, `gpu.count` the MIG devices, `gpu.memory` one device's MiB, plus
`gpu.multiprocessors`, `gpu.slices.{gi,ci}` and `gpu.engines.*`; a node with MIG on some GPUs
only, a GPU with MIG on and no device, or two profiles is `<model>-MIG-INVALID` with count 0.
A node with MIG off everywhere is labelled as under `none`.

`nvidia.com/gpu.clique` names the node's multi-node NVLink domain (`<clusterUuid>.<cliqueId>`,
from NVML's fabric info) when every GPU of the node is registered in the same one; a node
whose GPUs have no such fabric (an HGX H200) gets no such label. Waves can order a rollout by
it (`upgradePolicy.waves.topologyLabel`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace

from gpuop.events.device import DevicePluginConfigApplied, SharingStrategy
from gpuop.events.hardware import Gpu, HardwareDiscovered, MigInstance, MigMode
from gpuop.inventory import containers

GFD = "nvidia.com/"
NFD = "feature.node.kubernetes.io/"
CDI_READY = f"{GFD}cdi.ready"
"""`true` while a valid `nvidia.com/gpu` CDI spec with a device and the runtimes' `nvidia`
handler are both on the node (`containers.ready`); absent otherwise. Not an upstream label."""
RUNTIME_NVIDIA = "gpuop.io/runtime.nvidia"
"""`true` under the same condition as `CDI_READY`: the RuntimeClass `nvidia` can run here."""
NVIDIA_VENDOR = "10de"
MELLANOX_VENDOR = "15b3"
LABELLED_CLASSES = ("0200", "0207", "0300", "0302")
"""PCI classes the GPU Operator's NFD configuration labels (class 02 is covered by 0200/0207)."""

NVML_DERIVED = (
    f"{GFD}cuda.",
    f"{GFD}gpu.count",
    f"{GFD}gpu.product",
    f"{GFD}gpu.memory",
    f"{GFD}gpu.family",
    f"{GFD}gpu.compute.",
    f"{GFD}gpu.replicas",
    f"{GFD}gpu.sharing-strategy",
    f"{GFD}gpu.mode",
    f"{GFD}gpu.machine",
    f"{GFD}gpu.clique",
    f"{GFD}gpu.multiprocessors",
    f"{GFD}gpu.slices.",
    f"{GFD}gpu.engines.",
    f"{GFD}mig.",
    f"{GFD}mig-",
    f"{GFD}mps.capable",
    f"{GFD}vgpu.present",
)
"""Label key prefixes of every label that only an inventory with GPUs (NVML's) implies; kept
while the driver is unloaded. `gpu.machine` comes from DMI but GFD sets it with the rest."""

_FAMILIES = {
    1: "tesla",
    2: "fermi",
    3: "kepler",
    5: "maxwell",
    6: "pascal",
    7: "volta",
    8: "ampere",
    9: "hopper",
    10: "blackwell",
    12: "blackwell",
}


class MigStrategy(enum.StrEnum):
    """How MIG devices are advertised (the device plugin's setting)."""

    NONE = "none"
    SINGLE = "single"
    MIXED = "mixed"


@dataclass(frozen=True)
class LabelSettings:
    """What the labels depend on besides the hardware."""

    mig_strategy: MigStrategy = MigStrategy.NONE
    replicas: int = 1
    """Time-slicing replicas per GPU; 1 means unshared."""
    sharing_strategy: SharingStrategy = SharingStrategy.TIME_SLICING
    """How more than one replica shares a GPU."""
    renamed: bool = False
    """Shared GPUs are advertised as `nvidia.com/gpu.shared` (`renameByDefault`): the product
    label then gets no `-SHARED`, as upstream's."""
    timestamp: int | None = None
    """Unix seconds for `nvidia.com/gfd.timestamp`; None leaves the label out."""


def with_plugin_config(
    settings: LabelSettings, applied: DevicePluginConfigApplied | None
) -> LabelSettings:
    """`settings` with the sharing of the device plugin config in force on the node;
    unchanged when the node's plugin has not reported one."""
    if applied is None:
        return settings
    if applied.replicas == 1 or applied.sharing_strategy is SharingStrategy.NONE:
        return replace(settings, replicas=1, renamed=False)
    return replace(
        settings,
        replicas=applied.replicas,
        sharing_strategy=applied.sharing_strategy,
        renamed=applied.renamed,
    )


def labels_for(
    inventory: HardwareDiscovered, settings: LabelSettings | None = None
) -> dict[str, str]:
    """Every label the inventory implies."""
    settings = settings or LabelSettings()
    labels: dict[str, str] = {}
    labels.update(_nfd_pci(inventory))
    labels.update(_nfd_kernel(inventory.kernel_release))
    labels.update(_nfd_os(inventory.os_id, inventory.os_version_id))
    if _has_nvidia_function(inventory):
        labels[f"{GFD}gpu.present"] = "true"
    if inventory.gpus:
        labels.update(_gfd(inventory, settings))
    if containers.ready(inventory):
        labels[CDI_READY] = "true"
        labels[RUNTIME_NVIDIA] = "true"
    return labels


def merge(
    current: Mapping[str, str], implied: Mapping[str, str], inventory: HardwareDiscovered
) -> dict[str, str]:
    """The labels to hold after this inventory: `implied`, plus the node's current
    NVML-derived labels while its driver is unloaded (NVIDIA functions present, no GPUs)."""
    merged = dict(implied)
    if _has_nvidia_function(inventory) and not inventory.gpus:
        for key, value in current.items():
            if key.startswith(NVML_DERIVED) and key not in merged:
                merged[key] = value
    return merged


def _has_nvidia_function(inventory: HardwareDiscovered) -> bool:
    return any(
        f.vendor_id == NVIDIA_VENDOR and f.class_id[:4] in ("0300", "0302")
        for f in inventory.pci_functions
    )


def _nfd_pci(inventory: HardwareDiscovered) -> dict[str, str]:
    labels = {}
    for function in inventory.pci_functions:
        class4 = function.class_id[:4]
        if class4 not in LABELLED_CLASSES:
            continue
        # NFD's default `<class>_<vendor>` form and the vendor-only form the GPU Operator
        # configures; selectors in the wild use both
        labels[f"{NFD}pci-{class4}_{function.vendor_id}.present"] = "true"
        labels[f"{NFD}pci-{function.vendor_id}.present"] = "true"
    return labels


def _nfd_kernel(release: str) -> dict[str, str]:
    labels = {f"{NFD}kernel-version.full": _label_value(release)}
    numbers = release.split("-", 1)[0].split(".")
    for name, part in zip(("major", "minor", "revision"), numbers, strict=False):
        if part.isdigit():
            labels[f"{NFD}kernel-version.{name}"] = part
    return labels


def _nfd_os(os_id: str | None, version_id: str | None) -> dict[str, str]:
    labels = {}
    if os_id:
        labels[f"{NFD}system-os_release.ID"] = _label_value(os_id)
    if version_id:
        labels[f"{NFD}system-os_release.VERSION_ID"] = _label_value(version_id)
        parts = version_id.split(".")
        if len(parts) >= 2:
            labels[f"{NFD}system-os_release.VERSION_ID.major"] = _label_value(parts[0])
            labels[f"{NFD}system-os_release.VERSION_ID.minor"] = _label_value(parts[1])
    return labels


def _gfd(inventory: HardwareDiscovered, settings: LabelSettings) -> dict[str, str]:
    first = inventory.gpus[0]
    labels: dict[str, str] = {}
    if inventory.driver_version:
        labels.update(_driver_version(inventory.driver_version))
    if inventory.cuda_driver_version:
        labels.update(_cuda_version(inventory.cuda_driver_version))
    product = _label_value(first.model_name.replace(" ", "-"))
    shared = settings.replicas > 1
    suffix = "-SHARED" if shared and not settings.renamed else ""
    major, minor = first.compute_capability.split(".")
    labels.update(
        {
            f"{GFD}gpu.count": str(len(inventory.gpus)),
            f"{GFD}gpu.product": f"{product}{suffix}",
            f"{GFD}gpu.memory": str(first.memory_bytes // 2**20),
            f"{GFD}gpu.family": first.architecture or _FAMILIES.get(int(major), "unknown"),
            f"{GFD}gpu.compute.major": major,
            f"{GFD}gpu.compute.minor": minor,
            f"{GFD}gpu.replicas": str(settings.replicas),
            f"{GFD}gpu.sharing-strategy": str(settings.sharing_strategy) if shared else "none",
            f"{GFD}gpu.mode": _gpu_mode(inventory, first),
            f"{GFD}mig.capable": str(first.mig_mode is not MigMode.UNSUPPORTED).lower(),
            f"{GFD}mps.capable": str(
                shared and settings.sharing_strategy is SharingStrategy.MPS
            ).lower(),
            f"{GFD}vgpu.present": "false",
        }
    )
    if first.mig_mode is not MigMode.UNSUPPORTED:
        labels[f"{GFD}mig.strategy"] = settings.mig_strategy
    labels.update(_mig(inventory, settings, product, labels))
    cliques = {gpu.clique for gpu in inventory.gpus}
    if len(cliques) == 1 and (clique := cliques.pop()) is not None:
        labels[f"{GFD}gpu.clique"] = clique  # only when every GPU is in the one domain
    if inventory.product_name:
        labels[f"{GFD}gpu.machine"] = _label_value(inventory.product_name.replace(" ", "-"))
    if settings.timestamp is not None:
        labels[f"{GFD}gfd.timestamp"] = str(settings.timestamp)
    return labels


def _mig(
    inventory: HardwareDiscovered, settings: LabelSettings, product: str, gpu: Mapping[str, str]
) -> dict[str, str]:
    """The MIG labels of the strategy; under `single` they override `gpu.*` labels."""
    if settings.mig_strategy is MigStrategy.MIXED:
        return _mig_mixed(inventory, product, gpu)
    if settings.mig_strategy is MigStrategy.SINGLE:
        return _mig_single(inventory, product)
    return {}


def _mig_mixed(
    inventory: HardwareDiscovered, product: str, gpu: Mapping[str, str]
) -> dict[str, str]:
    by_profile: dict[str, list[MigInstance]] = {}
    for device in (d for g in inventory.gpus for d in g.mig_devices):
        by_profile.setdefault(device.profile, []).append(device)
    labels = {}
    for profile, devices in sorted(by_profile.items()):
        name = _profile_label(profile)
        prefix = f"{GFD}mig-{name}"
        labels[f"{prefix}.count"] = str(len(devices))
        labels[f"{prefix}.product"] = _label_value(f"{product}-MIG-{name}")
        labels[f"{prefix}.replicas"] = gpu[f"{GFD}gpu.replicas"]
        labels[f"{prefix}.sharing-strategy"] = gpu[f"{GFD}gpu.sharing-strategy"]
        labels.update(_mig_attributes(prefix, devices[0]))
    return labels


def _mig_single(inventory: HardwareDiscovered, product: str) -> dict[str, str]:
    enabled = [gpu.mig_mode is MigMode.ENABLED for gpu in inventory.gpus]
    if not any(enabled):
        return {}
    devices = [d for gpu in inventory.gpus for d in gpu.mig_devices]
    profiles = {d.profile for d in devices}
    empty = any(not gpu.mig_devices for gpu in inventory.gpus)
    if not all(enabled) or empty or len(profiles) != 1:
        return {f"{GFD}gpu.product": f"{product}-MIG-INVALID", f"{GFD}gpu.count": "0"}
    name = _profile_label(profiles.pop())
    return {
        f"{GFD}gpu.product": _label_value(f"{product}-MIG-{name}"),
        f"{GFD}gpu.count": str(len(devices)),
        **_mig_attributes(f"{GFD}gpu", devices[0]),
    }


def _mig_attributes(prefix: str, device: MigInstance) -> dict[str, str]:
    return {
        f"{prefix}.memory": str(device.memory_bytes // 2**20),
        f"{prefix}.multiprocessors": str(device.multiprocessors),
        f"{prefix}.slices.gi": str(device.gpu_instance_slices),
        f"{prefix}.slices.ci": str(device.compute_instance_slices),
        f"{prefix}.engines.copy": str(device.copy_engines),
        f"{prefix}.engines.decoder": str(device.decoders),
        f"{prefix}.engines.encoder": str(device.encoders),
        f"{prefix}.engines.jpeg": str(device.jpeg_engines),
        f"{prefix}.engines.ofa": str(device.ofa_engines),
    }


def _profile_label(profile: str) -> str:
    """A profile as resource and label names write it: `1g.18gb+me` -> `1g.18gb.me`."""
    return profile.replace("+", ".")


def _driver_version(version: str) -> dict[str, str]:
    labels = {f"{GFD}cuda.driver-version.full": version}
    parts = version.split(".")
    for name, old, part in zip(
        ("major", "minor", "revision"), ("major", "minor", "rev"), parts, strict=False
    ):
        labels[f"{GFD}cuda.driver-version.{name}"] = part
        labels[f"{GFD}cuda.driver.{old}"] = part
    return labels


def _cuda_version(version: str) -> dict[str, str]:
    major, _, minor = version.partition(".")
    minor = minor or "0"
    return {
        f"{GFD}cuda.runtime-version.full": f"{major}.{minor}",
        f"{GFD}cuda.runtime-version.major": major,
        f"{GFD}cuda.runtime-version.minor": minor,
        f"{GFD}cuda.runtime.major": major,
        f"{GFD}cuda.runtime.minor": minor,
    }


def _gpu_mode(inventory: HardwareDiscovered, gpu: Gpu) -> str:
    for function in inventory.pci_functions:
        if _same_address(function.address, gpu.pci_bus_id):
            return {"0302": "compute", "0300": "display"}.get(function.class_id[:4], "unknown")
    return "unknown"


def _same_address(sysfs: str, nvml: str) -> bool:
    """sysfs writes `0000:00:06.0`, NVML `00000000:00:06.0`."""
    return sysfs.lower().split(":", 1)[1] == nvml.lower().split(":", 1)[1]


def _label_value(text: str) -> str:
    """Label values are at most 63 characters of `[A-Za-z0-9._-]`, alphanumeric at the ends."""
    cleaned = "".join(c if c.isalnum() or c in "._-" else "-" for c in text)[:63]
    return cleaned.strip("._-")
