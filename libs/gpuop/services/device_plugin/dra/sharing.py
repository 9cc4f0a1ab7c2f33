"""How a claim's devices are shared, from the opaque configuration of its allocation.

NVIDIA's DRA driver takes `resource.nvidia.com/v1beta1` objects under `opaque.parameters`
(`GpuConfig` for whole GPUs, `MigDeviceConfig` for MIG devices); gpuop reads the same, so a
claim written for NVIDIA's driver means the same here. Claim configuration is decoded
strictly, as NVIDIA's is: an unknown field, kind or strategy is an error that names it, and
the kubelet shows it in the pod's events (`FailedPrepareDynamicResources`) instead of the
claim running under a configuration it did not ask for.

    TimeSlicing (interval Default)   the devices are time-sliced between the claim's
                                     containers, as a GPU is by default: nothing to set
    TimeSlicing (Short, Medium, Long)  refused: setting the driver's timeslice takes
                                     `nvidia-smi compute-policy`, which gpuop does not run
    MPS                              refused: gpuop's MPS daemons serve the device plugin's
                                     replicas, not claims, yet

Configurations apply in the allocation's order (class ones before the claim's), a later one
overriding an earlier for the requests it names (empty: every request). Called by
`preparing.Preparer` before anything is written for a claim.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from gpuop.events import dra

API_VERSION = "resource.nvidia.com/v1beta1"
"""The group and version of NVIDIA's configuration objects."""


class SharingError(ValueError):
    """A configuration gpuop cannot apply to the claim; the message says exactly what."""


class Strategy(StrEnum):
    TIME_SLICING = "TimeSlicing"
    MPS = "MPS"


class Interval(StrEnum):
    DEFAULT = "Default"
    SHORT = "Short"
    MEDIUM = "Medium"
    LONG = "Long"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TimeSlicingConfig(_Strict):
    interval: Interval = Interval.DEFAULT


class MpsConfig(_Strict):
    """Read only to refuse it with its own error: NVIDIA's field names, as the claim spells
    them (so are the other models')."""

    defaultActiveThreadPercentage: int | None = None
    defaultPinnedDeviceMemoryLimit: str | None = None
    defaultPerDevicePinnedMemoryLimit: dict[str, str] | None = None
    multiUser: bool | None = None


class Sharing(_Strict):
    strategy: Strategy
    timeSlicingConfig: TimeSlicingConfig | None = None
    mpsConfig: MpsConfig | None = None


class DeviceConfig(_Strict):
    """`GpuConfig` or `MigDeviceConfig` (the latter has no interval, checked below)."""

    apiVersion: Literal["resource.nvidia.com/v1beta1"]
    kind: Literal["GpuConfig", "MigDeviceConfig"]
    sharing: Sharing | None = None


def decode(parameters: dict[str, object]) -> DeviceConfig:
    """One opaque configuration, strictly; `SharingError` naming what is wrong."""
    try:
        found = DeviceConfig.model_validate(parameters)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in e['loc']) or 'parameters'}: {e['msg']}"
            for e in error.errors()
        )
        raise SharingError(f"invalid {API_VERSION} configuration: {problems}") from None
    sharing = found.sharing
    if sharing is None:
        return found
    if sharing.strategy is Strategy.MPS:
        raise SharingError(
            f"{found.kind} sharing.strategy MPS is not supported by gpuop's DRA plugin; "
            "use TimeSlicing or no sharing"
        )
    if sharing.mpsConfig is not None:
        raise SharingError(f"{found.kind} sharing.mpsConfig is set but the strategy is TimeSlicing")
    slicing = sharing.timeSlicingConfig
    if slicing is not None and found.kind == "MigDeviceConfig":
        raise SharingError(
            "MigDeviceConfig sharing.timeSlicingConfig: MIG devices take no interval"
        )
    if slicing is not None and slicing.interval is not Interval.DEFAULT:
        raise SharingError(
            f"{found.kind} sharing.timeSlicingConfig.interval {slicing.interval} cannot be "
            "applied: gpuop sets no GPU timeslice (only Default is supported)"
        )
    return found


def sharing_by_request(
    configs: Iterable[dra.OpaqueConfig], requests: Iterable[str]
) -> dict[str, Strategy | None]:
    """The sharing strategy each request's devices get (None: not shared), the later
    configuration winning; `SharingError` for the first configuration that cannot apply."""
    found: dict[str, Strategy | None] = dict.fromkeys(requests)
    for config in configs:
        decoded = decode(config.parameters)
        strategy = decoded.sharing.strategy if decoded.sharing else None
        for request in found:
            if not config.requests or _base(request) in {_base(r) for r in config.requests}:
                found[request] = strategy
    return found


def _base(request: str) -> str:
    return request.partition("/")[0]
