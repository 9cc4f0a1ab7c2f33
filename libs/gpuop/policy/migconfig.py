"""MIG layouts in NVIDIA mig-parted's config format, parsed and resolved per GPU.

A config file names layouts; the node label `nvidia.com/mig.config` picks one:

    version: v1
    mig-configs:
      all-balanced:
        - devices: all                      # or a list of GPU indexes: [0, 1]
          device-filter: ["0x233510DE"]     # optional: PCI ids (device then vendor)
          mig-enabled: true
          mig-devices: {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}
        - devices: [7]
          mig-enabled: false

The checks are mig-parted's (`api/spec/v1`): `version` is `v1`; only the known keys; each
config a non-empty list of entries; `devices` is `all` or a list of distinct indexes;
`mig-enabled` is required; `mig-devices` is required when MIG is enabled (`{}` leaves it
enabled and empty) and must be empty when it is not; a profile is
`[<c>c.]<g>g.<mem>gb[+me|+me.all|+gfx|-me]` and counts are positive. `parse` raises
`MigConfigError` naming the config and entry (`all-balanced[0]`).

`resolve` turns one config into a `GpuMigLayout` for every GPU an entry selects (by index
and PCI id), against the node's GPUs as discovery reports them; a GPU no entry selects is
left as it is, and an entry whose `device-filter` matches none of them selects nothing (one
config serves several GPU models that way). Resolution fails, naming the config and entry,
for a GPU two entries select, an index the node has not got, and, where the GPU's profiles
are known, a profile it does not offer or more instances than fit its seven compute
slices. Profiles with a compute-instance prefix (`1c.2g.35gb`) parse, as upstream's do, but
gpuop creates one full compute instance per GPU instance and refuses them at resolution.

Pure: text in, records out; the MIG saga resolves on the cluster side (to know which GPUs
are re-carved) and the driver-manager checks the same layouts against NVML's own profiles.
`DEFAULT_CONFIG` is the file shipped with the package for an H200 (`mig-configs-default.yaml`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

import yaml

from gpuop.events.hardware import Gpu, MigMode
from gpuop.events.mig_commands import GpuMigLayout, MigDeviceCount

VERSION = "v1"
TOP_KEYS = frozenset({"version", "mig-configs"})
ENTRY_KEYS = frozenset({"devices", "device-filter", "mig-enabled", "mig-devices"})
COMPUTE_SLICES = 7
PROFILE = re.compile(
    r"^(?:(?P<ci>[0-9]+)c\.)?(?P<gi>[0-9]+)g\.(?P<mem>[0-9]+)gb(?P<attr>\+me|\+me\.all|\+gfx|-me)?$"
)
PCI_ID = re.compile(r"^0x[0-9A-Fa-f]{8}(?::0x[0-9A-Fa-f]{8})?$")
CONFIG_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
DEFAULT_FILE = "mig-configs-default.yaml"


class MigConfigError(ValueError):
    """A config file that mig-parted would refuse, or a layout a node cannot take."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry of a config: which GPUs, and what they get."""

    devices: Literal["all"] | tuple[int, ...]
    mig_enabled: bool
    mig_devices: tuple[tuple[str, int], ...]
    """Profile and count, sorted by profile."""
    device_filter: tuple[str, ...] = ()
    """PCI ids, uppercase hex after `0x`; empty: any GPU."""


@dataclass(frozen=True, slots=True)
class MigConfigFile:
    """A parsed file: config name to its entries."""

    configs: Mapping[str, tuple[Entry, ...]]

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self.configs))


@dataclass(frozen=True, slots=True)
class ProfileShape:
    """What resolution needs of a GPU instance profile the GPU offers."""

    slices: int
    """Compute slices of one instance."""
    instance_count: int
    """How many fit an empty GPU."""


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """One GPU of the node, as far as resolution looks at it."""

    index: int
    pci_id: str | None = None
    """`0x233510DE`: device id then vendor id, as mig-parted's `device-filter` names it."""
    profiles: Mapping[str, ProfileShape] | None = None
    """Profiles the GPU offers, by name; None when unknown (no profile check)."""


def parse(text: str) -> MigConfigFile:
    """A config file's text as its validated model; `MigConfigError` says what is wrong."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise MigConfigError(f"not YAML: {exc}") from None
    if not isinstance(document, dict):
        raise MigConfigError("a MIG config file is a mapping with `version` and `mig-configs`")
    unknown = sorted(set(map(str, document)) - TOP_KEYS)
    if unknown:
        raise MigConfigError(f"unknown key(s): {', '.join(unknown)}")
    if document.get("version") != VERSION:
        raise MigConfigError(f"version must be {VERSION!r}, not {document.get('version')!r}")
    configs = document.get("mig-configs")
    if not isinstance(configs, dict) or not configs:
        raise MigConfigError("`mig-configs` must map at least one config name to its entries")
    return MigConfigFile({str(name): _config(str(name), spec) for name, spec in configs.items()})


def load_default() -> MigConfigFile:
    """The config file shipped with gpuop (H200 layouts, as mig-parted's default file)."""
    return parse(DEFAULT_CONFIG)


def resolve(file: MigConfigFile, name: str, gpus: Sequence[GpuFacts]) -> tuple[GpuMigLayout, ...]:
    """The layout of every GPU config `name` selects, by index; `MigConfigError` when the
    config is missing or cannot be applied to these GPUs."""
    entries = file.configs.get(name)
    if entries is None:
        known = ", ".join(file.names())
        raise MigConfigError(f"no MIG config named {name!r} (the file has: {known})")
    by_index = {gpu.index: gpu for gpu in gpus}
    chosen: dict[int, str] = {}
    layouts: list[GpuMigLayout] = []
    for position, entry in enumerate(entries):
        where = f"{name}[{position}]"
        selected = _selected(entry, gpus, by_index, where)
        for gpu in selected:
            if gpu.index in chosen:
                raise MigConfigError(
                    f"{where}: GPU {gpu.index} is selected by {chosen[gpu.index]} already"
                )
            chosen[gpu.index] = where
            _check_fits(entry, gpu, where)
            layouts.append(_layout(entry, gpu.index))
    return tuple(sorted(layouts, key=lambda layout: layout.gpu_index))


def check(layout: GpuMigLayout, gpu: GpuFacts, config: str) -> None:
    """`MigConfigError` when `gpu` cannot take `layout` (the node's own check)."""
    entry = Entry(
        devices=(gpu.index,),
        mig_enabled=layout.mig_enabled,
        mig_devices=tuple((d.profile, d.count) for d in layout.devices),
    )
    _check_fits(entry, gpu, f"{config} GPU {gpu.index}")


def inventory_layout(gpu: Gpu) -> GpuMigLayout:
    """The layout an inventoried GPU has: its MIG mode and the profiles of its MIG devices
    (`Gpu.mig_devices`; an inventory from before gpuop read them has none)."""
    counts = Counter(device.profile for device in gpu.mig_devices)
    return GpuMigLayout(
        gpu_index=gpu.index,
        mig_enabled=gpu.mig_mode is MigMode.ENABLED,
        devices=tuple(MigDeviceCount(profile=p, count=n) for p, n in sorted(counts.items())),
    )


def pci_id(vendor_id: str, device_id: str) -> str:
    """mig-parted's PCI id from sysfs ids: `10de`, `2335` -> `0x233510DE`."""
    return f"0x{device_id.upper()}{vendor_id.upper()}"


def layout_devices(layout: GpuMigLayout) -> Counter[str]:
    """The layout's MIG devices as profile -> count."""
    return Counter({d.profile: d.count for d in layout.devices})


def _config(name: str, spec: Any) -> tuple[Entry, ...]:
    if not CONFIG_NAME.match(name):
        raise MigConfigError(f"{name!r}: a config name is 1 to 63 of [A-Za-z0-9._-]")
    if not isinstance(spec, list) or not spec:
        raise MigConfigError(f"{name}: a config is a non-empty list of entries")
    return tuple(_entry(f"{name}[{i}]", item) for i, item in enumerate(spec))


def _entry(where: str, item: Any) -> Entry:
    if not isinstance(item, dict):
        raise MigConfigError(f"{where}: an entry is a mapping")
    unknown = sorted(set(map(str, item)) - ENTRY_KEYS)
    if unknown:
        raise MigConfigError(f"{where}: unknown key(s): {', '.join(unknown)}")
    if "devices" not in item:
        raise MigConfigError(f"{where}: `devices` is required (`all` or a list of indexes)")
    enabled = item.get("mig-enabled")
    if not isinstance(enabled, bool):
        raise MigConfigError(f"{where}: `mig-enabled` is required, true or false")
    devices = _mig_devices(where, item.get("mig-devices"), enabled)
    return Entry(
        devices=_devices(where, item["devices"]),
        mig_enabled=enabled,
        mig_devices=devices,
        device_filter=_filter(where, item.get("device-filter")),
    )


def _devices(where: str, value: Any) -> Literal["all"] | tuple[int, ...]:
    if value == "all":
        return "all"
    if not isinstance(value, list) or not value:
        raise MigConfigError(f"{where}: `devices` is `all` or a non-empty list of GPU indexes")
    if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in value):
        raise MigConfigError(f"{where}: GPU indexes are whole numbers from 0: {value}")
    repeated = sorted(i for i, n in Counter(value).items() if n > 1)
    if repeated:
        raise MigConfigError(f"{where}: GPU index(es) listed twice: {repeated}")
    return tuple(value)


def _filter(where: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    ids = [value] if isinstance(value, str) else value
    if not isinstance(ids, list) or not all(isinstance(i, str) and PCI_ID.match(i) for i in ids):
        raise MigConfigError(
            f"{where}: `device-filter` is a PCI id or a list of them, `0x233510DE`: {value!r}"
        )
    return tuple(_normal_pci_id(i) for i in ids)


def _mig_devices(where: str, value: Any, enabled: bool) -> tuple[tuple[str, int], ...]:
    if not enabled:
        if value:
            raise MigConfigError(f"{where}: `mig-devices` must be empty when MIG is disabled")
        return ()
    if value is None:
        raise MigConfigError(f"{where}: `mig-devices` is required when MIG is enabled")
    if not isinstance(value, dict):
        raise MigConfigError(f"{where}: `mig-devices` maps profiles to counts")
    devices = []
    for profile, count in value.items():
        if not isinstance(profile, str) or not PROFILE.match(profile):
            raise MigConfigError(f"{where}: {profile!r} is not a MIG profile (`1g.18gb`)")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise MigConfigError(f"{where}: the count of {profile} must be a whole number >= 1")
        if count > COMPUTE_SLICES:
            raise MigConfigError(
                f"{where}: {count} of {profile}: no GPU fits more than {COMPUTE_SLICES}"
            )
        devices.append((profile, count))
    return tuple(sorted(devices))


def _selected(
    entry: Entry, gpus: Sequence[GpuFacts], by_index: Mapping[int, GpuFacts], where: str
) -> list[GpuFacts]:
    if entry.devices == "all":
        candidates = list(gpus)
    else:
        missing = [i for i in entry.devices if i not in by_index]
        if missing:
            have = len(by_index)
            raise MigConfigError(f"{where}: no GPU at index {missing} (the node has {have})")
        candidates = [by_index[i] for i in entry.devices]
    if not entry.device_filter:
        return candidates
    return [gpu for gpu in candidates if _passes(gpu, entry.device_filter)]


def _passes(gpu: GpuFacts, device_filter: tuple[str, ...]) -> bool:
    if gpu.pci_id is None:
        return False
    ours = _normal_pci_id(gpu.pci_id)
    return any(ours == wanted.split(":")[0] for wanted in device_filter)


def _check_fits(entry: Entry, gpu: GpuFacts, where: str) -> None:
    for profile, _count in entry.mig_devices:
        match = PROFILE.match(profile)
        if match is not None and match["ci"] is not None and match["ci"] != match["gi"]:
            raise MigConfigError(
                f"{where}: {profile}: compute-instance profiles are not supported; "
                f"gpuop gives each GPU instance one full compute instance"
            )
    if gpu.profiles is None:
        return
    slices = 0
    for profile, count in entry.mig_devices:
        shape = gpu.profiles.get(_gi_profile(profile))
        if shape is None:
            offered = ", ".join(sorted(gpu.profiles))
            raise MigConfigError(
                f"{where}: GPU {gpu.index} has no MIG profile {profile} (it offers: {offered})"
            )
        if count > shape.instance_count:
            raise MigConfigError(
                f"{where}: GPU {gpu.index} fits at most {shape.instance_count} of {profile}, "
                f"not {count}"
            )
        slices += shape.slices * count
    if slices > COMPUTE_SLICES:
        raise MigConfigError(
            f"{where}: GPU {gpu.index}: the devices need {slices} compute slices, "
            f"more than the {COMPUTE_SLICES} it has"
        )


def _gi_profile(profile: str) -> str:
    match = PROFILE.match(profile)
    if match is None or match["ci"] is None:
        return profile
    return profile.split(".", 1)[1]


def _layout(entry: Entry, index: int) -> GpuMigLayout:
    return GpuMigLayout(
        gpu_index=index,
        mig_enabled=entry.mig_enabled,
        devices=tuple(MigDeviceCount(profile=p, count=n) for p, n in entry.mig_devices),
    )


def _normal_pci_id(value: str) -> str:
    return ":".join(f"0x{part[2:].upper()}" for part in value.split(":"))


DEFAULT_CONFIG = resources.files("gpuop.policy").joinpath(DEFAULT_FILE).read_text()
"""The default config file's text."""
