"""The remediation's phases: one module per state, each its whole behaviour, as the
upgrade's (`gpuop.saga.upgrade.phases`).

Each module names its `STATE` and defines `enter`, `on_event`, `on_deadline` and `effects`;
`common` holds what several share. `PHASES` is the registry the kind
(`gpuop.saga.remediation.kind.REMEDIATION`) hands the machinery.

    remediation_admission_required  quarantined, a slot        -> gpu-holders-required
    gpu_holders_required            the holders named          -> eviction | operands pause
    gpu_pods_eviction_required      only those pods evicted    -> operands-pause-required
    operands_pause_required         operands released          -> reset | reboot | replace
    gpu_reset_required              the GPUs reset             -> validation | reboot
    reboot_required                 a new boot id              -> validation-required
    hardware_replacement_required   handed over, released      -> validation-required
    validation_required             the ladder's rungs         -> release-required
    release_required                resumed, then untainted    -> done | the next attempt
    folded_into_upgrade             the upgrade's own reload   -> release | failed
    remediation_done                released
    remediation_failed              marked, with the reason
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType

from gpuop.events.remediation import RemediationState
from gpuop.saga.machine import Phase, phases_of
from gpuop.saga.remediation.drafting import Draft
from gpuop.saga.remediation.phases import (
    folded_into_upgrade,
    gpu_holders_required,
    gpu_pods_eviction_required,
    gpu_reset_required,
    hardware_replacement_required,
    operands_pause_required,
    reboot_required,
    release_required,
    remediation_admission_required,
    remediation_done,
    remediation_failed,
    validation_required,
)
from gpuop.saga.remediation.phases.common import limit_seconds
from gpuop.saga.remediation.records import RemediationSaga

MODULES: tuple[ModuleType, ...] = (
    remediation_admission_required,
    gpu_holders_required,
    gpu_pods_eviction_required,
    operands_pause_required,
    gpu_reset_required,
    reboot_required,
    hardware_replacement_required,
    validation_required,
    release_required,
    folded_into_upgrade,
    remediation_done,
    remediation_failed,
)
"""Every phase module, in the order of the main line."""


PHASES: Mapping[RemediationState, Phase[RemediationSaga, Draft]] = phases_of(MODULES)
"""State -> its phase."""

__all__ = ["MODULES", "PHASES", "limit_seconds"]
