"""The GPU metrics as Prometheus text (format 0.0.4), rendered once per collection.

The collector calls `render()` after each fast collection and keeps the bytes; every scrape
until the next collection serves them as they are (`ServiceContext.exposition`), so a scrape
costs a copy, never an NVML call or a formatting pass. The label part of each GPU's series
(`label_sets()`) is built only when the NVML session opens or the pod attribution changes.

The text is dcgm-exporter's: its metric names as they are (counters have no `_total`, which
is why the registry of prometheus_client cannot render them), its labels in its order, the
pod labels only on GPUs one container holds. A GPU that several containers share (time
slicing) keeps one series per metric, without pod labels, rather than the same values copied
to every pod; `gpuop_telemetry_gpu_pod_info` lists who shares it. Each MIG GPU instance
has its own series (`instance_label_sets()`): its GPU's labels with `GPU_I_PROFILE` and
`GPU_I_ID` after `modelName`, as dcgm-exporter writes them, and the pod labels of the one
container holding it through a MIG device, by the same rule as a GPU's.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from gpuop.nvml import DeviceInfo, MigDevice
from gpuop.services.telemetry import catalog
from gpuop.services.telemetry.catalog import Metric, Reading
from gpuop.services.telemetry.pods import Attribution, InstanceKey, Owner

OWNER_LABELS = (*catalog.POD_LABELS, catalog.POD_UID)
"""The labels of a container holding a GPU, in their order (`pod_uid` only where known)."""


@dataclass(frozen=True, slots=True)
class GpuLabels:
    """The rendered labels of one GPU's series."""

    series: str
    """`{gpu="0",UUID="GPU-…",…}`: what follows the metric name on each line."""
    identity: str
    """The GPU labels alone, without braces and pod labels, for the per-container series."""
    owners: tuple[Owner, ...]
    """The containers holding the GPU."""


def escape(value: str) -> str:
    """A label value as the text format writes it between quotes."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def label_sets(
    gpus: Sequence[DeviceInfo],
    *,
    node: str,
    driver_version: str,
    attribution: Attribution,
    allowed: Collection[str],
) -> dict[int, GpuLabels]:
    """The labels of every GPU's series, keeping only the `allowed` label names."""
    found: dict[int, GpuLabels] = {}
    for gpu in gpus:
        values = _gpu_values(gpu, node, driver_version)
        identity = _identity(values, allowed)
        found[gpu.index] = _labelled(identity, attribution.get(gpu.index, ()), allowed)
    return found


def _labelled(identity: str, owners: tuple[Owner, ...], allowed: Collection[str]) -> GpuLabels:
    """A series' labels: the pod labels of its one holder, none when shared or free."""
    if catalog.POD_UID not in allowed:
        owners = tuple(replace(owner, uid="") for owner in owners)
    series = identity
    if len(owners) == 1:
        series = _join(identity, _owner_pairs(owners[0], allowed))
    return GpuLabels(series=f"{{{series}}}", identity=identity, owners=owners)


def instance_label_sets(
    gpus: Sequence[DeviceInfo],
    migs: Iterable[MigDevice],
    *,
    node: str,
    driver_version: str,
    attribution: Attribution,
    allowed: Collection[str],
) -> dict[InstanceKey, GpuLabels]:
    """The labels of every MIG GPU instance's series, keeping only the `allowed` names; an
    instance one container holds carries its pod labels."""
    by_index = {gpu.index: gpu for gpu in gpus}
    found: dict[InstanceKey, GpuLabels] = {}
    for mig in sorted(migs, key=lambda m: (m.parent_index, m.gpu_instance_id)):
        gpu = by_index.get(mig.parent_index)
        key = (mig.parent_index, mig.gpu_instance_id)
        if gpu is None or key in found:  # one series per GPU instance, not per CI
            continue
        values = _gpu_values(gpu, node, driver_version)
        values["GPU_I_PROFILE"] = gpu_instance_profile(mig.profile)
        values["GPU_I_ID"] = str(mig.gpu_instance_id)
        found[key] = _labelled(_identity(values, allowed), attribution.get(key, ()), allowed)
    return found


def gpu_instance_profile(device_profile: str) -> str:
    """The GPU instance's profile of a MIG device's: `1c.2g.35gb` is in a `2g.35gb`."""
    first, _, rest = device_profile.partition(".")
    return rest if first.endswith("c") and rest else device_profile


def render(
    readings: Mapping[int, Reading],
    labels: Mapping[int, GpuLabels],
    *,
    xid_counts: Mapping[int, Mapping[int, int]],
    enabled: Collection[str],
    instances: Sequence[tuple[GpuLabels, Reading]] = (),
) -> bytes:
    """The exposition of one collection: every enabled metric of every GPU, then of every
    MIG GPU instance, with a value."""
    lines: list[str] = []
    gpus = [(labels[index].series, reading) for index, reading in sorted(readings.items())]
    gpus += [(labelled.series, reading) for labelled, reading in instances]
    for metric in catalog.METRICS:
        if metric.name not in enabled:
            continue
        samples = [(series, metric.read(reading)) for series, reading in gpus]
        present = [(series, value) for series, value in samples if value is not None]
        if present:
            lines.append(_header(metric))
            lines.extend(f"{metric.name}{series} {_number(value)}\n" for series, value in present)
    if catalog.XID_COUNT.name in enabled:
        lines.extend(_xid_counts(xid_counts, labels))
    if catalog.POD_INFO.name in enabled:
        lines.extend(_pod_info(labels))
    return "".join(lines).encode()


def _xid_counts(
    xid_counts: Mapping[int, Mapping[int, int]], labels: Mapping[int, GpuLabels]
) -> list[str]:
    metric = catalog.XID_COUNT
    lines = [
        f"{metric.name}{{{_join(labels[index].identity, _pairs([('xid', str(xid))]))}}} {count}\n"
        for index, counts in sorted(xid_counts.items())
        if index in labels
        for xid, count in sorted(counts.items())
    ]
    return [_header(metric), *lines] if lines else []


def _pod_info(labels: Mapping[int, GpuLabels]) -> list[str]:
    metric = catalog.POD_INFO
    lines = [
        f"{metric.name}{{{_join(gpu.identity, _owner_pairs(owner, OWNER_LABELS))}}} 1\n"
        for _, gpu in sorted(labels.items())
        for owner in gpu.owners
    ]
    return [_header(metric), *lines] if lines else []


def _gpu_values(gpu: DeviceInfo, node: str, driver_version: str) -> dict[str, str]:
    return {
        "gpu": str(gpu.index),
        "UUID": gpu.uuid,
        "pci_bus_id": gpu.pci_bus_id,
        "device": f"nvidia{gpu.index}",
        "modelName": gpu.name,
        "Hostname": node,
        "DCGM_FI_DRIVER_VERSION": driver_version,
    }


def _identity(values: Mapping[str, str], allowed: Collection[str]) -> str:
    return _pairs(
        (name, values[name]) for name in catalog.GPU_LABELS if name in allowed and name in values
    )


def _header(metric: Metric) -> str:
    return f"# HELP {metric.name} {metric.help}\n# TYPE {metric.name} {metric.kind}\n"


def _owner_pairs(owner: Owner, allowed: Collection[str]) -> str:
    values = {"pod": owner.pod, "namespace": owner.namespace, "container": owner.container}
    if owner.uid:
        values[catalog.POD_UID] = owner.uid
    return _pairs(
        (name, values[name]) for name in OWNER_LABELS if name in allowed and name in values
    )


def _pairs(pairs: Iterable[tuple[str, str]]) -> str:
    return ",".join(f'{name}="{escape(value)}"' for name, value in pairs)


def _join(*parts: str) -> str:
    return ",".join(part for part in parts if part)


def _number(value: int | float) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))
