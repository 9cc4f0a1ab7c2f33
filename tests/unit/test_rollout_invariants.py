"""The checker of the rollout invariants (tests/support/invariants.py) catches each broken
invariant, so the end-to-end tests that rely on it can fail."""

from __future__ import annotations

from gpuop.events import Command, Event, ids, new_command, new_event
from gpuop.events import driver as dm
from gpuop.events import kube as ke
from gpuop.events.driver import Component
from gpuop.events.upgrade import NodeUpgradeStateChanged, UpgradeState
from gpuop.saga.replaying import COMMANDS_STREAM, EVENTS_STREAM, Recorded
from tests.support import invariants

S = UpgradeState
GPU = Component.GPU


class Log:
    """A log written line by line, as an export would have it."""

    def __init__(self) -> None:
        self.entries: list[Recorded] = []
        self.last: dict[str, UpgradeState] = {}
        """Each node's state after its last change written, the next change's from_state."""

    def add(self, node: str, payload: Event | Command, id: str | None = None) -> None:
        line = len(self.entries) + 1
        if isinstance(payload, Command):
            envelope = new_command(payload, node=node, source="/t", id=id or f"c{line}")
            stream = COMMANDS_STREAM
        else:
            envelope = new_event(payload, node=node, source="/t", id=id)
            stream = EVENTS_STREAM
        self.entries.append(Recorded(line, stream, line, "s", envelope, payload))

    def state(self, node: str, to: UpgradeState, attempt: int = 1, reason: str = "") -> None:
        change = NodeUpgradeStateChanged(
            rollout_id="r", from_state=self.last.get(node), to_state=to, reason=reason,
            attempt=attempt, components=(GPU,), target_versions={GPU: "2.0"},
        )  # fmt: skip
        self.add(node, change)
        self.last[node] = to

    def upgrade(self, node: str) -> None:
        """A clean upgrade of `node`: cordon, drain, reload, validate, uncordon, done."""
        self.state(node, S.CORDON_REQUIRED)
        self.add(node, ke.NodeCordoned(action_id=f"cordon-{node}"))
        self.add(node, ke.DrainCompleted(action_id=f"drain-{node}", evicted=1))
        self.state(node, S.DRIVER_RELOAD_REQUIRED)
        self.add(node, dm.UnloadDriver(component=GPU), ids.step(node, "unload", 1))
        self.add(node, dm.DriverUnloaded(command_id="x", component=GPU, version="1.0"))
        self.add(node, dm.DriverLoaded(command_id="y", component=GPU, version="2.0"))
        self.state(node, S.VALIDATION_REQUIRED)
        self.add(node, dm.DriverValidated(command_id="z", component=GPU, version="2.0", devices=8))
        self.add(node, ke.NodeUncordoned(action_id=f"uncordon-{node}"))
        self.state(node, S.UPGRADE_DONE)


def test_a_clean_log_breaks_nothing() -> None:
    log = Log()
    for node in ("a", "b"):
        log.upgrade(node)
    walk = invariants.check(log.entries, max_unavailable=1)
    assert walk.violations == []
    assert invariants.states(walk, "a")[-1] is S.UPGRADE_DONE and walk.most_cordoned == 1


def test_too_many_cordoned_nodes_are_caught() -> None:
    log = Log()
    log.add("a", ke.NodeCordoned(action_id="1"))
    log.add("b", ke.NodeCordoned(action_id="2"))
    log.state("a", S.UPGRADE_DONE)
    log.state("b", S.UPGRADE_DONE)
    assert "2 nodes cordoned" in invariants.check(log.entries, 1).violations[0]


def test_an_uncordon_before_validation_is_caught() -> None:
    log = Log()
    log.add("a", ke.NodeCordoned(action_id="1"))
    log.add("a", dm.DriverLoaded(command_id="y", component=GPU, version="2.0"))
    log.add("a", ke.NodeUncordoned(action_id="2"))
    log.state("a", S.UPGRADE_DONE)
    assert invariants.check(log.entries, 1).violations == [
        "line 3: a uncordoned before its driver validated"
    ]


def test_a_second_drain_in_one_attempt_is_caught_but_not_in_the_next() -> None:
    log = Log()
    log.state("a", S.DRAIN_REQUIRED, attempt=1)
    log.add("a", ke.DrainCompleted(action_id="1", evicted=0))
    log.add("a", ke.DrainCompleted(action_id="2", evicted=0))
    log.state("a", S.DRAIN_REQUIRED, attempt=2)
    log.add("a", ke.DrainCompleted(action_id="3", evicted=0))
    log.state("a", S.UPGRADE_DONE, attempt=2)
    assert invariants.check(log.entries, 1).violations == ["line 3: a drained again in attempt 1"]


def test_one_step_issued_under_two_ids_is_caught() -> None:
    log = Log()
    log.state("a", S.DRIVER_RELOAD_REQUIRED)
    log.add("a", dm.UnloadDriver(component=GPU), "first")
    log.add("a", dm.UnloadDriver(component=GPU), "second")
    log.state("a", S.UPGRADE_DONE)
    (violation,) = invariants.check(log.entries, 1).violations
    assert "unload" in violation and "2 ids" in violation


def test_nodes_left_midway_or_failed_without_a_reason_are_caught() -> None:
    log = Log()
    log.state("a", S.DRAIN_REQUIRED)
    log.state("b", S.UPGRADE_FAILED)
    log.state("c", S.UPGRADE_FAILED, reason="DriverValidationFailed gpu: no devices")
    assert sorted(invariants.check(log.entries, 3).violations) == [
        "a ended in drain-required, neither done nor failed",
        "b ended upgrade-failed without a reason",
    ]


def test_a_state_change_missing_from_the_log_is_caught() -> None:
    log = Log()
    log.upgrade("a")
    log.state("b", S.CORDON_REQUIRED)
    log.last["b"] = S.DRAIN_REQUIRED  # the change to drain-required never reached the log
    log.state("b", S.UPGRADE_DONE)
    assert invariants.check(log.entries, 2).violations == [
        f"line {len(log.entries)}: b moved from drain-required but the log last had it in "
        "cordon-required: a state change is missing"
    ]


def test_a_cordon_or_uncordon_only_observed_counts_as_one() -> None:
    # leaders that acted and died before saying so: the next observation of the node shows it
    log = Log()
    log.state("a", S.CORDON_REQUIRED)
    log.add("a", ke.NodeObserved(ready=True, unschedulable=True))
    log.state("b", S.CORDON_REQUIRED)
    log.add("b", ke.NodeCordoned(action_id="1"))
    log.state("a", S.UNCORDON_REQUIRED)
    log.add("a", ke.NodeObserved(ready=True, unschedulable=False))
    log.state("a", S.UPGRADE_DONE)
    log.state("c", S.CORDON_REQUIRED)
    log.add("c", ke.NodeCordoned(action_id="2"))
    log.state("b", S.UPGRADE_DONE)
    log.state("c", S.UPGRADE_DONE)
    assert invariants.check(log.entries, 2).violations == []
    assert invariants.check(log.entries, 1).violations == [
        "line 4: 2 nodes cordoned (['a', 'b']), maxUnavailable is 1",
        "line 9: 2 nodes cordoned (['b', 'c']), maxUnavailable is 1",
    ]
