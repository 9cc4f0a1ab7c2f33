"""mig-config-required: the request waits for a slot under the shared `maxUnavailable`
budget; an admission pauses the node's operands.

A request that cannot run (its plan has a problem: an unknown config name, a file that does
not parse, a layout that does not fit) fails from here at once, and one that changes no GPU
ends here at once, both in the saga's first decision (`kind.begin`), before any admission.
"""

from __future__ import annotations

from gpuop.saga.machine import Admitted, StepResult, Trigger, ignore, no_effects
from gpuop.saga.mig.drafting import Draft
from gpuop.saga.mig.phases.common import start
from gpuop.saga.mig.records import MigStepKind
from gpuop.saga.mig.states import MigState as S

STATE = S.MIG_CONFIG_REQUIRED


def enter(draft: Draft, retry: bool) -> None:
    start(draft, MigStepKind.ADMISSION)


def on_event(draft: Draft, trigger: Trigger) -> None:
    if isinstance(trigger, Admitted):
        draft.outcome(StepResult.SUCCEEDED, "admitted")
        draft.move(S.OPERANDS_PAUSE_REQUIRED, f"admitted: re-carving to {draft.saga.config}")


on_deadline = ignore
"""Admission has no deadline."""
effects = no_effects
