"""The upgrade's phases: one module per state, each its whole behaviour.

Each module names its `STATE` and defines `enter(draft, retry)` (what entering the state
does: start its first step, or pass through when there is nothing to do), `on_event(draft,
trigger)` (what an event means in it), `on_deadline(draft, expired)` (its pending step's
deadline passed) and `effects(saga, spec)` (the commands and Kubernetes actions its step
issues, again the same after a crash). The table's edges (`gpuop.saga.upgrade.table`) and the
steps' deadlines (`gpuop.saga.upgrade.steps`) stay in one table each, where they read as a whole.
`PHASES` is the registry the upgrade kind (`gpuop.saga.upgrade`) hands the machinery; a test
proves every state has exactly one. `common` holds what several phases share (a deadline that
fails the step, a driver's answer to a driver step).

    upgrade_required         admission              -> cordon-required
    cordon_required          the node unschedulable -> wait-for-jobs-required
    wait_for_jobs_required   selected jobs done     -> pod-deletion-required
    pod_deletion_required    GPU pods gone          -> drain-required
    drain_required           drained                -> operands-pause-required
    operands_pause_required  operands released      -> driver-reload-required
    driver_reload_required   install, unload, load  -> validation-required | reboot-required
    reboot_required          a new boot id          -> driver-reload-required | validation
    rollback_required        previous drivers back  -> validation-required
    validation_required      drivers validated      -> uncordon-required
    uncordon_required        schedulable again      -> upgrade-done | upgrade-failed
    upgrade_done             final
    upgrade_failed           backoff, then retry    -> upgrade-required
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType

from gpuop.events.upgrade import UpgradeState
from gpuop.saga.machine import Phase, phases_of
from gpuop.saga.upgrade.drafting import Draft
from gpuop.saga.upgrade.phases import (
    cordon_required,
    drain_required,
    driver_reload_required,
    operands_pause_required,
    pod_deletion_required,
    reboot_required,
    rollback_required,
    uncordon_required,
    upgrade_done,
    upgrade_failed,
    upgrade_required,
    validation_required,
    wait_for_jobs_required,
)
from gpuop.saga.upgrade.records import NodeSaga

MODULES: tuple[ModuleType, ...] = (
    upgrade_required,
    cordon_required,
    wait_for_jobs_required,
    pod_deletion_required,
    drain_required,
    operands_pause_required,
    driver_reload_required,
    reboot_required,
    rollback_required,
    validation_required,
    uncordon_required,
    upgrade_done,
    upgrade_failed,
)
"""Every phase module, in the order of the main line."""


PHASES: Mapping[UpgradeState, Phase[NodeSaga, Draft]] = phases_of(MODULES)
"""State -> its phase."""
