"""mig-config-failed: the request failed; its reason is the transition's, the node's Event
and `MigSaga.failure`. Final: a failed reconfiguration is not retried by itself (upstream's
manager does not either); setting the label to another config, or to the same one again
after removing it, is a new request."""

from __future__ import annotations

from gpuop.saga.machine import ignore, no_effects
from gpuop.saga.mig.drafting import Draft
from gpuop.saga.mig.records import MigStep, MigStepKind
from gpuop.saga.mig.states import MigState as S

STATE = S.MIG_CONFIG_FAILED


def enter(draft: Draft, retry: bool) -> None:
    draft.take(MigStep(kind=MigStepKind.FAILED))


on_event = ignore
on_deadline = ignore
effects = no_effects
