"""The remediation's transition table: state -> the states it may move to, with triggers.

    remediation-admission-required -(admitted)-> gpu-holders-required
    gpu-holders-required -(holders named)-> gpu-pods-eviction-required | operands-pause
    gpu-pods-eviction-required -(evicted)-> operands-pause-required
    operands-pause-required -(paused)-> gpu-reset-required | reboot-required
        | hardware-replacement-required
    gpu-reset-required -(reset)-> validation-required; -(failed)-> reboot-required
    reboot-required -(new boot id)-> validation-required
    hardware-replacement-required -(released, another GPU in each faulty slot)->
        validation-required
    validation-required -(validated)-> release-required
    release-required -(resumed, then GPUHealthy True and the taint off, confirmed)->
        remediation-done, or the next attempt's admission for GPUs that failed after the
        holders were asked (too late for this reset)
    folded-into-upgrade -(the upgrade validated)-> release-required

Any state but the ends may fail (remediation-failed); the node's removal ends it there too.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gpuop.events.remediation import RemediationState as S

_FAIL = "a step failed, its deadline passed, or the node is gone"

TABLE: Mapping[S, Mapping[S, str]] = MappingProxyType(
    {
        S.ADMISSION_REQUIRED: {
            S.HOLDERS_REQUIRED: "admitted under maxUnavailable",
            S.FAILED: _FAIL,
        },
        S.HOLDERS_REQUIRED: {
            S.EVICTION_REQUIRED: "the device plugin named the holders",
            S.OPERANDS_PAUSE_REQUIRED: "no pod holds the GPUs",
            S.FAILED: _FAIL,
        },
        S.EVICTION_REQUIRED: {S.OPERANDS_PAUSE_REQUIRED: "the holders are gone", S.FAILED: _FAIL},
        S.OPERANDS_PAUSE_REQUIRED: {
            S.RESET_REQUIRED: "every operand paused",
            S.REBOOT_REQUIRED: "paused, and the fault asks for a reboot",
            S.REPLACEMENT_REQUIRED: "paused, and the fault asks for new hardware",
            S.FAILED: _FAIL,
        },
        S.RESET_REQUIRED: {
            S.VALIDATION_REQUIRED: "GpuReset",
            S.REBOOT_REQUIRED: "GpuResetFailed or its deadline, a reboot allowed",
            S.FAILED: _FAIL,
        },
        S.REBOOT_REQUIRED: {S.VALIDATION_REQUIRED: "a new boot id", S.FAILED: _FAIL},
        S.REPLACEMENT_REQUIRED: {
            S.VALIDATION_REQUIRED: "released, and another GPU in each faulty slot",
            S.FAILED: "the node is gone",
        },
        S.VALIDATION_REQUIRED: {S.RELEASE_REQUIRED: "every rung passed", S.FAILED: _FAIL},
        S.RELEASE_REQUIRED: {
            S.DONE: "operands resumed, the node untainted (NodeUntainted)",
            S.ADMISSION_REQUIRED: "GPUs failed after the holders were asked: the next attempt",
            S.FAILED: _FAIL,
        },
        S.FOLDED: {
            S.RELEASE_REQUIRED: "the upgrade validated the node's GPUs",
            S.FAILED: "the upgrade failed",
        },
        S.DONE: {},
        S.FAILED: {},
    }
)
