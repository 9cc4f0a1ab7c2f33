"""The device-API switch's phases: one module per state, each its whole behaviour.

Each module names its `STATE` and defines `enter`, `on_event`, `on_deadline` and `effects`,
as the other kinds' phases do. `PHASES` is what the kind (`gpuop.saga.device_api.kind`)
hands the machinery; `Kind.check` proves every state has one.

    switch_required        admission                              -> cordon
    cordon_required        the node unschedulable                 -> drain
    drain_required         the GPU pods (both APIs') evicted      -> api-switch | uncordon
    api_switch_required    SetDeviceApi answered, serving         -> validation | switch-back
    validation_required    a pod given a GPU that way succeeded   -> uncordon | switch-back
    switch_back_required   the API of the start served again      -> uncordon | failed
    uncordon_required      schedulable again (unless cordoned before) -> done | failed
    done                   final
    failed                 final
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType

from gpuop.saga.device_api.drafting import Draft
from gpuop.saga.device_api.phases import (
    api_switch_required,
    cordon_required,
    done,
    drain_required,
    failed,
    switch_back_required,
    switch_required,
    uncordon_required,
    validation_required,
)
from gpuop.saga.device_api.records import DeviceApiSaga
from gpuop.saga.device_api.states import DeviceApiState
from gpuop.saga.machine import Phase, phases_of

MODULES: tuple[ModuleType, ...] = (
    switch_required,
    cordon_required,
    drain_required,
    api_switch_required,
    validation_required,
    switch_back_required,
    uncordon_required,
    done,
    failed,
)
"""Every phase module, in the order of the main line."""

PHASES: Mapping[DeviceApiState, Phase[DeviceApiSaga, Draft]] = phases_of(MODULES)
"""State -> its phase."""
