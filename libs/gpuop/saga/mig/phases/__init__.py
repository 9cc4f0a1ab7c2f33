"""The MIG reconfiguration's phases: one module per state, each its whole behaviour.

Each module names its `STATE` and defines `enter`, `on_event`, `on_deadline` and `effects`,
as the upgrade's phases do (`gpuop.saga.upgrade.phases`). `PHASES` is what the kind
(`gpuop.saga.mig.kind`) hands the machinery; `Kind.check` proves every state has one.

    mig_config_required        admission                          -> operands-pause
    operands_pause_required    operands released (the GPUs held)  -> holders-eviction
    holders_eviction_required  holders listed, only they evicted  -> apply
    apply_required             ApplyMigLayout answered            -> verification | restore
                                                                     | reboot (mode pending)
    reboot_required            a new boot id                      -> apply
    verification_required      the answer is the request          -> operands-resume | restore
    restore_required           the start's layout applied again   -> operands-resume
    operands_resume_required   operands back                      -> done | failed
    mig_config_done            final
    mig_config_failed          final
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType

from gpuop.saga.machine import Phase, phases_of
from gpuop.saga.mig.drafting import Draft
from gpuop.saga.mig.phases import (
    apply_required,
    holders_eviction_required,
    mig_config_done,
    mig_config_failed,
    mig_config_required,
    operands_pause_required,
    operands_resume_required,
    reboot_required,
    restore_required,
    verification_required,
)
from gpuop.saga.mig.records import MigSaga
from gpuop.saga.mig.states import MigState

MODULES: tuple[ModuleType, ...] = (
    mig_config_required,
    operands_pause_required,
    holders_eviction_required,
    apply_required,
    reboot_required,
    verification_required,
    restore_required,
    operands_resume_required,
    mig_config_done,
    mig_config_failed,
)
"""Every phase module, in the order of the main line."""


PHASES: Mapping[MigState, Phase[MigSaga, Draft]] = phases_of(MODULES)
"""State -> its phase."""
