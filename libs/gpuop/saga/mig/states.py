"""The MIG reconfiguration's states, its one transition table, and the label it shows.

A state names the pending action (`apply-required`, not `applied`), as the upgrade's do.
The main line:

    mig-config-required -(admitted)-> operands-pause-required -(every operand paused: the
    device plugin advertises the node's GPUs Unhealthy, so no new pod is given one)->
    holders-eviction-required -(the holders of the re-carved GPUs listed and evicted)->
    apply-required -(MigLayoutApplied)-> verification-required -(the layout and CDI spec
    as requested)-> operands-resume-required -(every operand resumed)-> mig-config-done

A MIG mode NVML leaves pending until a reboot (`MigLayoutFailed` `mode-pending`):
apply-required -> reboot-required -(a new boot id)-> apply-required again, once.

Compensation: a failure before the apply resumes the operands (when paused) and ends in
mig-config-failed; a failure of the apply that the driver-manager undid itself
(`MigLayoutFailed.restored`) does the same; one it did not undo, a layout that verifies
other than requested, or an apply that never answers goes to restore-required, which applies
the layout recorded at the start, then resumes and fails. A request that cannot run at all
(a config name the policy does not have) fails at once from mig-config-required. No state
leads out of done or failed: a new request starts a new saga.

Upstream's MIG manager shows its progress in the node label `nvidia.com/mig.config.state`
(`CONFIG_STATE_LABEL`); `config_state` maps every state to one of its values. The states
and the label's values are public (`gpuop.events.mig`): each move is published.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gpuop.events.mig import ConfigState, MigState
from gpuop.events.mig_requests import MIG_CONFIG_LABEL

CONFIG_LABEL = MIG_CONFIG_LABEL
"""The Node label naming the MIG config a node should have, as upstream's."""
CONFIG_STATE_LABEL = "nvidia.com/mig.config.state"
"""The Node label showing where the node's reconfiguration stands, as upstream's."""


S = MigState
TERMINAL_STATES = frozenset({S.MIG_CONFIG_DONE, S.MIG_CONFIG_FAILED})

_UNDO = "a step failed with the operands paused: resume them, then fail"
_RESTORE = "the GPUs may be changed and not as requested: put the recorded layout back"

TABLE: Mapping[MigState, Mapping[MigState, str]] = MappingProxyType(
    {
        S.MIG_CONFIG_REQUIRED: {
            S.OPERANDS_PAUSE_REQUIRED: "admitted",
            S.MIG_CONFIG_DONE: "the GPUs already have the requested layout",
            S.MIG_CONFIG_FAILED: "the request cannot run (unknown config), or node removed",
        },
        S.OPERANDS_PAUSE_REQUIRED: {
            S.HOLDERS_EVICTION_REQUIRED: "every operand paused",
            S.OPERANDS_RESUME_REQUIRED: _UNDO,
            S.MIG_CONFIG_FAILED: "node removed",
        },
        S.HOLDERS_EVICTION_REQUIRED: {
            S.APPLY_REQUIRED: "the holders evicted, or none",
            S.OPERANDS_RESUME_REQUIRED: _UNDO,
            S.MIG_CONFIG_FAILED: "node removed",
        },
        S.APPLY_REQUIRED: {
            S.VERIFICATION_REQUIRED: "MigLayoutApplied",
            S.REBOOT_REQUIRED: "MigLayoutFailed mode-pending: the mode takes effect at a boot",
            S.OPERANDS_RESUME_REQUIRED: "MigLayoutFailed, the node restored the layout",
            S.RESTORE_REQUIRED: f"MigLayoutFailed not restored, or no answer: {_RESTORE}",
            S.MIG_CONFIG_FAILED: "node removed",
        },
        S.REBOOT_REQUIRED: {
            S.APPLY_REQUIRED: "a new boot id: apply the layout again",
            S.RESTORE_REQUIRED: f"no new boot id by the deadline: {_RESTORE}",
            S.OPERANDS_RESUME_REQUIRED: "no new boot id by the deadline, nothing to restore",
            S.MIG_CONFIG_FAILED: "node removed",
        },
        S.VERIFICATION_REQUIRED: {
            S.OPERANDS_RESUME_REQUIRED: "the layout and the CDI spec are as requested",
            S.RESTORE_REQUIRED: f"the layout differs from the request: {_RESTORE}",
            S.MIG_CONFIG_FAILED: "node removed",
        },
        S.RESTORE_REQUIRED: {
            S.OPERANDS_RESUME_REQUIRED: "the recorded layout is back, or could not be",
            S.MIG_CONFIG_FAILED: "node removed",
        },
        S.OPERANDS_RESUME_REQUIRED: {
            S.MIG_CONFIG_DONE: "every operand resumed after the layout verified",
            S.MIG_CONFIG_FAILED: "operands resumed (or not) after a failure, or node removed",
        },
        S.MIG_CONFIG_DONE: {},
        S.MIG_CONFIG_FAILED: {},
    }
)
"""State -> the states it may move to -> the trigger of that move."""


__all__ = [
    "CONFIG_LABEL",
    "CONFIG_STATE_LABEL",
    "TABLE",
    "TERMINAL_STATES",
    "ConfigState",
    "MigState",
    "config_state",
]


def config_state(state: MigState) -> ConfigState:
    """The value of `nvidia.com/mig.config.state` while the saga is in `state`."""
    if state is S.MIG_CONFIG_DONE:
        return ConfigState.SUCCESS
    if state is S.MIG_CONFIG_FAILED:
        return ConfigState.FAILED
    if state is S.REBOOT_REQUIRED:
        return ConfigState.REBOOTING
    return ConfigState.PENDING
