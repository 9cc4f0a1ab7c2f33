"""folded-into-upgrade: the node's upgrade had its driver reload still ahead when the fault
came (`UpgradeState.remediation_folds_in`); its reload and validation serve, so the
remediation only marks the node (`quarantine`) and ends with the upgrade's moves
(`NodeUpgradeStateChanged` from the log): validated (uncordon-required, or upgrade-done)
moves it to release-required, whose untaint ends it; upgrade-failed fails it."""

from __future__ import annotations

from gpuop.events.remediation import RemediationState as S
from gpuop.events.upgrade import NodeUpgradeStateChanged, UpgradeState
from gpuop.saga.machine import Trigger, ignore
from gpuop.saga.remediation.drafting import Draft
from gpuop.saga.remediation.phases.common import quarantine
from gpuop.saga.remediation.records import Step

STATE = S.FOLDED
VALIDATED = (UpgradeState.UNCORDON_REQUIRED, UpgradeState.UPGRADE_DONE)


def enter(draft: Draft, retry: bool) -> None:
    draft.start(Step(name="folded"))


def on_event(draft: Draft, trigger: Trigger) -> None:
    if not isinstance(trigger, NodeUpgradeStateChanged):
        return
    if trigger.to_state in VALIDATED:
        draft.outcome_ok(f"the upgrade moved to {trigger.to_state}")
        draft.move(S.RELEASE_REQUIRED, "the upgrade's reload and validation served")
    elif trigger.to_state is UpgradeState.UPGRADE_FAILED:
        draft.fail(f"the upgrade it folded into failed: {trigger.reason}")


on_deadline = ignore
effects = quarantine
