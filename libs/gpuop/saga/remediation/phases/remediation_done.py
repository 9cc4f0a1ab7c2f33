"""remediation-done: the node released; release-required issued the release (`GPUHealthy`
True, the taint removed) and entered this state only once the executor confirmed it, so
nothing is left to do here."""

from __future__ import annotations

from gpuop.events.remediation import RemediationState as S
from gpuop.saga.machine import ignore, no_effects
from gpuop.saga.remediation.drafting import Draft
from gpuop.saga.remediation.records import Step

STATE = S.DONE


def enter(draft: Draft, retry: bool) -> None:
    draft.start(Step(name="done"))


on_event = ignore
on_deadline = ignore
effects = no_effects
