"""mig-config-done: the node has the layout its label names; final."""

from __future__ import annotations

from gpuop.saga.machine import ignore, no_effects
from gpuop.saga.mig.drafting import Draft
from gpuop.saga.mig.records import MigStep, MigStepKind
from gpuop.saga.mig.states import MigState as S

STATE = S.MIG_CONFIG_DONE


def enter(draft: Draft, retry: bool) -> None:
    draft.take(MigStep(kind=MigStepKind.DONE))


on_event = ignore
on_deadline = ignore
effects = no_effects
