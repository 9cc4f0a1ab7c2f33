"""The upgrade's draft: the machinery's `Draft` with the helpers the upgrade phases share.

Used only inside one call of `gpuop.saga.upgrade.core.decide`, by the phases
(`gpuop.saga.upgrade.phases`) and by `gpuop.saga.upgrade.compensation`. Every move goes
through `Draft.move` (`gpuop.saga.machine`),
which checks it against the upgrade's table, counts it, announces it (`announce`: the state
label, and for some states a Kubernetes Event), and enters the new state's phase. States with
nothing to wait for are passed through in the same decision (no wait-for-jobs selector, drain
disabled, nothing to uncordon), so they still appear as moves.

A Kubernetes Event is recorded only for the moves an administrator acts on or looks for in
`kubectl describe node` (`RECORDED_STATES`: the upgrade started, a reboot, a rollback, a
failure, done), not for every move as upstream's library does: each Event is a request to
the API server, and the complete trail of every move, with its reason, is the log of public
`NodeUpgradeStateChanged` events on the bus.
"""

from __future__ import annotations

from gpuop.events.driver import Component
from gpuop.events.upgrade import UpgradeState
from gpuop.policy import UpgradePolicy
from gpuop.saga import machine
from gpuop.saga.actions import EVENT_REASON, KubeAction, RecordEvent, SetStateLabel
from gpuop.saga.upgrade.effects import event_id, label_id
from gpuop.saga.upgrade.records import NodeSaga, ordered
from gpuop.saga.upgrade.table import Transition

S = UpgradeState
_WARNING_STATES = frozenset({S.UPGRADE_FAILED, S.ROLLBACK_REQUIRED, S.REBOOT_REQUIRED})
RECORDED_STATES = frozenset({S.CORDON_REQUIRED, S.UPGRADE_DONE, *_WARNING_STATES})
"""The states whose entry is recorded as a Kubernetes Event on the node: the upgrade started
(admitted, cordoning), it ended (done or failed), or the node is rebooted or rolled back."""


class Draft(machine.Draft[NodeSaga, UpgradeState]):
    """An upgrade saga being decided on; `decision()` is the result."""

    @property
    def policy(self) -> UpgradePolicy:
        return self.spec.upgrade_policy

    def touch(self, component: Component) -> None:
        """`component`'s running driver was changed and is not validated yet."""
        self.update(touched=ordered((*self.saga.touched, component)))

    def installable(self) -> frozenset[Component]:
        """Components with a source to install from (the others must be on the host)."""
        return frozenset(c for c, t in self.saga.targets.items() if t.source is not None)

    def rollback_components(self) -> tuple[Component, ...]:
        """Touched components with a previous version to go back to."""
        saga = self.saga
        return tuple(c for c in saga.touched if c in saga.previous_versions)


def announce(saga: NodeSaga, transition: Transition) -> tuple[KubeAction, ...]:
    """The state label of the move, and its Kubernetes Event for `RECORDED_STATES`."""
    label: KubeAction = SetStateLabel(id=label_id(saga), value=transition.to_state)
    if transition.to_state not in RECORDED_STATES:
        return (label,)
    event = RecordEvent(
        id=event_id(saga),
        reason=EVENT_REASON,
        message=(
            f"{transition.from_state} -> {transition.to_state} "
            f"(attempt {transition.attempt}): {transition.reason}"
        )[:1024],
        warning=transition.to_state in _WARNING_STATES,
    )
    return (label, event)
