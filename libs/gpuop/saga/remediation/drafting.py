"""The remediation's draft: the machinery's `Draft` with the helpers its phases share (a
failure, a reboot, a reset that failed) and its announcements (a Kubernetes Event for the
moves an administrator looks for)."""

from __future__ import annotations

from gpuop.events import ids
from gpuop.events.remediation import RemediationState as S
from gpuop.policy.remediation import RemediationPolicy
from gpuop.saga import machine
from gpuop.saga.actions import RecordEvent
from gpuop.saga.machine import StepResult
from gpuop.saga.remediation.actions import EVENT_REASON
from gpuop.saga.remediation.records import RemediationSaga

RECORDED_STATES = frozenset({S.REBOOT_REQUIRED, S.DONE, S.FAILED})
"""Moves recorded as a Kubernetes Event on the node (the start is recorded by the quarantine)."""


class Draft(machine.Draft[RemediationSaga, S]):
    """A remediation being decided on."""

    @property
    def policy(self) -> RemediationPolicy:
        return self.spec.remediation

    def outcome_ok(self, detail: str) -> None:
        self.outcome(StepResult.SUCCEEDED, detail)

    def _failed(self, reason: str, *, expired: bool) -> None:
        self.outcome(StepResult.EXPIRED if expired else StepResult.FAILED, reason)

    def fail(self, reason: str, *, expired: bool = False) -> None:
        """The pending step failed for `reason`: remediation-failed."""
        self._failed(reason, expired=expired)
        self.update(failure=reason[:2048])
        self.move(S.FAILED, reason)

    def reboot(self, reason: str) -> None:
        """Reboot when the policy allows and a boot id is known to confirm it; else fail."""
        if not self.policy.allow_reboot:
            self.fail(f"{reason}; reboots are not allowed (remediation.allowReboot)")
        elif self.saga.boot_id is None:
            self.fail(f"{reason}; no boot id known to confirm a reboot")
        elif self.saga.rebooted:
            self.fail(f"{reason}; rebooted once already")
        else:
            self.update(boot_id_at_reboot=self.saga.boot_id)
            self.move(S.REBOOT_REQUIRED, f"{reason}; rebooting")

    def reset_failed(self, reason: str, *, expired: bool = False) -> None:
        self._failed(reason, expired=expired)
        self.reboot(reason)


def announce(saga: RemediationSaga, transition: machine.Transition[S]) -> tuple[RecordEvent, ...]:
    """A Kubernetes Event for the moves in `RECORDED_STATES`."""
    if transition.to_state not in RECORDED_STATES:
        return ()
    event = RecordEvent(
        id=ids.kube_event(saga.saga_id, saga.sequence, saga.attempt),
        reason=EVENT_REASON,
        message=f"{transition.from_state} -> {transition.to_state}: {transition.reason}"[:1024],
        warning=transition.to_state is not S.DONE,
    )
    return (event,)
