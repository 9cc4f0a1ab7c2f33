"""`deviceAPI`: which kubelet API serves a node's GPUs, at the top of the policy and per pool.

`devicePlugin` (the default) advertises `nvidia.com/gpu` through the kubelet's device plugin
API; `dra` serves the GPUs through Dynamic Resource Allocation (ResourceSlices of the driver
`gpu.nvidia.com`, gpuop's DRA kubelet plugin). A driver pool (`driver.pools[].deviceAPI`)
may choose for its nodes; unset, they follow the top-level `deviceAPI`. The upgrade
orchestrator compares what `api_for` says of a node with what its device plugin last said
it serves (`device.api-applied`) and switches the node with a saga of the kind
`device-api` (`gpuop.saga.device_api`). Pure.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator
from pydantic_core import PydanticCustomError

from gpuop.events.device_api_commands import DeviceApi

DeviceApiName = Literal["devicePlugin", "dra"]
"""The policy's spelling of `DeviceApi` (camelCase, as Kubernetes APIs spell values)."""
DEFAULT: DeviceApiName = "devicePlugin"
FIELD = "deviceAPI"
"""The field's wire name (not `deviceApi`: Kubernetes writes acronyms in capitals)."""

_NAMES: dict[str, DeviceApi] = {"devicePlugin": DeviceApi.DEVICE_PLUGIN, "dra": DeviceApi.DRA}
_LIKELY: dict[str, str] = {
    "device-plugin": "devicePlugin",
    "deviceplugin": "devicePlugin",
    "device_plugin": "devicePlugin",
    "DRA": "dra",
    "Dra": "dra",
}
"""Spellings an operator may write, and the value they meant."""


def _named(value: object) -> object:
    """Refuse anything but the two values (or unset), saying which was meant."""
    if value is None or value in _NAMES:
        return value
    if not isinstance(value, str):
        raise PydanticCustomError("device_api", "must be devicePlugin or dra (a string)")
    meant = _LIKELY.get(value) or _LIKELY.get(value.lower())
    hint = f" (did you mean {meant}?)" if meant else ""
    raise PydanticCustomError(
        "device_api",
        "must be devicePlugin (the device plugin API, the default) or dra (Dynamic Resource "
        "Allocation), not '{value}'{hint}",
        {"value": value, "hint": hint},
    )


DeviceApiSetting = Annotated[DeviceApiName | None, BeforeValidator(_named)]
"""The field's type: one of the two values, or unset (None, left out of the wire form)."""


def api_of(name: DeviceApiName | None) -> DeviceApi:
    """The `DeviceApi` a policy value names (None: the default, the device plugin)."""
    return _NAMES[name or DEFAULT]


__all__ = ["DEFAULT", "FIELD", "DeviceApiName", "DeviceApiSetting", "api_of"]
