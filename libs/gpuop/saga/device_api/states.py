"""The device-API switch's states and its one transition table.

A state names the pending action (`api-switch-required`, not `switched`), as every kind's
do. The main line:

    device-api-switch-required -(admitted)-> cordon-required -(cordoned)-> drain-required
    -(the GPU pods gone)-> api-switch-required -(DeviceApiApplied, serving)->
    validation-required -(a pod given a GPU through the new API succeeded)->
    uncordon-required -(uncordoned)-> device-api-done

Compensation: a failure before `SetDeviceApi` was sent uncordons (when the saga cordoned)
and fails; a failure after it switches back to the API the node served at the start
(switch-back-required), then uncordons and fails; a switch back that fails too leaves the
node cordoned, failed (an operator is needed: neither API is known to serve). No state
leads out of done or failed: the next difference between the policy and the node starts a
new switch.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gpuop.events.device_api import TERMINAL_STATES, DeviceApiState

S = DeviceApiState

_REMOVED = "node removed"
_UNDO = "a step failed with the node cordoned: uncordon it, then fail"
_BACK = "a step failed after SetDeviceApi: serve the API of the start again"

TABLE: Mapping[DeviceApiState, Mapping[DeviceApiState, str]] = MappingProxyType(
    {
        S.SWITCH_REQUIRED: {
            S.CORDON_REQUIRED: "admitted",
            S.FAILED: _REMOVED,
        },
        S.CORDON_REQUIRED: {
            S.DRAIN_REQUIRED: "NodeCordoned",
            S.FAILED: f"the cordon not confirmed in time, or {_REMOVED}",
        },
        S.DRAIN_REQUIRED: {
            S.API_SWITCH_REQUIRED: "PodsDeleted: no pod holds a GPU of the node",
            S.UNCORDON_REQUIRED: _UNDO,
            S.FAILED: _REMOVED,
        },
        S.API_SWITCH_REQUIRED: {
            S.VALIDATION_REQUIRED: "DeviceApiApplied serving the API wanted",
            S.SWITCH_BACK_REQUIRED: f"DeviceApiApplied not serving, or no answer: {_BACK}",
            S.FAILED: _REMOVED,
        },
        S.VALIDATION_REQUIRED: {
            S.UNCORDON_REQUIRED: "ValidationPodSucceeded",
            S.SWITCH_BACK_REQUIRED: f"ValidationPodFailed, or no answer: {_BACK}",
            S.FAILED: _REMOVED,
        },
        S.SWITCH_BACK_REQUIRED: {
            S.UNCORDON_REQUIRED: "DeviceApiApplied serving the API of the start",
            S.FAILED: f"the switch back failed too (the node stays cordoned), or {_REMOVED}",
        },
        S.UNCORDON_REQUIRED: {
            S.DONE: "NodeUncordoned (or left cordoned as found) after the switch validated",
            S.FAILED: f"uncordoned after a compensation, the uncordon failed, or {_REMOVED}",
        },
        S.DONE: {},
        S.FAILED: {},
    }
)
"""State -> the states it may move to -> the trigger of that move."""

__all__ = ["TABLE", "TERMINAL_STATES", "DeviceApiState"]
