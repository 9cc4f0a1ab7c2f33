"""The one transition table of the node upgrade saga, and the check every move obeys.

`TABLE` maps each state to the states it may move to, each edge with the trigger that takes
it. The machinery (`gpuop.saga.machine.Draft.move`) checks every move a phase makes against
it, so a move absent from this table is a bug that raises `IllegalTransition` instead of
reaching a node;
a test walks every edge through the core. The main line is upstream's (its label values);
the other edges are gpuop's compensation:

- a failure while the node's drivers are untouched goes to `uncordon-required`, which
  resumes the operands and uncordons (unless the node was cordoned before), and then ends
  in `upgrade-failed`; with nothing to undo it goes to `upgrade-failed` at once;
- a failure once a driver was unloaded (or the node rebooted) goes to `rollback-required`
  when the policy allows, which restores and validates the previous drivers and only then
  uncordons, still ending in `upgrade-failed`; otherwise straight to `upgrade-failed`,
  cordoned;
- a node removed from the cluster ends in `upgrade-failed` from any state;
- `upgrade-failed` goes back to `upgrade-required` when its retry backoff passes.

A new rollout starts a new saga (a new record), so `upgrade-done` has no way out here.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gpuop.events.upgrade import UpgradeState
from gpuop.saga import machine
from gpuop.saga.machine import IllegalTransition

S = UpgradeState

_FAILED_CLEAN = "a step failed with the drivers untouched and nothing to undo, or node removed"
_COMPENSATE = "a step failed with the drivers untouched: resume operands and uncordon"
_ROLL_BACK = "a step failed with a driver still touched and rollback allowed"

TABLE: Mapping[UpgradeState, Mapping[UpgradeState, str]] = MappingProxyType(
    {
        S.UPGRADE_REQUIRED: {
            S.CORDON_REQUIRED: "admitted to a slot (or already cordoned)",
            S.UPGRADE_FAILED: "node removed",
        },
        S.CORDON_REQUIRED: {
            S.WAIT_FOR_JOBS_REQUIRED: "the node is unschedulable",
            S.UNCORDON_REQUIRED: _COMPENSATE,
            S.ROLLBACK_REQUIRED: _ROLL_BACK,
            S.UPGRADE_FAILED: _FAILED_CLEAN,
        },
        S.WAIT_FOR_JOBS_REQUIRED: {
            S.POD_DELETION_REQUIRED: "no selector, no selected job left, or the wait's deadline",
            S.UPGRADE_FAILED: "node removed",
        },
        S.POD_DELETION_REQUIRED: {
            S.DRAIN_REQUIRED: "GPU pods deleted, or some stayed and drain is enabled",
            S.UNCORDON_REQUIRED: _COMPENSATE,
            S.ROLLBACK_REQUIRED: _ROLL_BACK,
            S.UPGRADE_FAILED: _FAILED_CLEAN,
        },
        S.DRAIN_REQUIRED: {
            S.OPERANDS_PAUSE_REQUIRED: "drained, or drain disabled",
            S.UNCORDON_REQUIRED: _COMPENSATE,
            S.ROLLBACK_REQUIRED: _ROLL_BACK,
            S.UPGRADE_FAILED: _FAILED_CLEAN,
        },
        S.OPERANDS_PAUSE_REQUIRED: {
            S.DRIVER_RELOAD_REQUIRED: "every operand confirmed its pause",
            S.UNCORDON_REQUIRED: _COMPENSATE,
            S.ROLLBACK_REQUIRED: _ROLL_BACK,
            S.UPGRADE_FAILED: _FAILED_CLEAN,
        },
        S.DRIVER_RELOAD_REQUIRED: {
            S.VALIDATION_REQUIRED: "every component installed, unloaded and loaded",
            S.REBOOT_REQUIRED: "unload failed in use and the policy allows a reboot",
            S.ROLLBACK_REQUIRED: "a step failed after an unload and rollback is allowed",
            S.UNCORDON_REQUIRED: "install or first unload failed: resume operands and uncordon",
            S.UPGRADE_FAILED: "a step failed after an unload without rollback, or node removed",
        },
        S.REBOOT_REQUIRED: {
            S.DRIVER_RELOAD_REQUIRED: "a new boot id: reload again on the fresh boot",
            S.VALIDATION_REQUIRED: "a new boot id and the node already runs every target",
            S.ROLLBACK_REQUIRED: "no new boot id before the deadline, rollback allowed",
            S.UPGRADE_FAILED: "no new boot id before the deadline without rollback, or removed",
        },
        S.ROLLBACK_REQUIRED: {
            S.VALIDATION_REQUIRED: "every touched component runs its previous version again",
            S.UPGRADE_FAILED: "the rollback failed or ran past its deadline, or node removed",
        },
        S.VALIDATION_REQUIRED: {
            S.UNCORDON_REQUIRED: "every component validated (the new drivers or the restored)",
            S.ROLLBACK_REQUIRED: "the new driver failed validation and rollback is allowed",
            S.UPGRADE_FAILED: "validation failed without rollback, or the restored driver "
            "failed, or node removed",
        },
        S.UNCORDON_REQUIRED: {
            S.UPGRADE_DONE: "uncordoned (or left cordoned as found) after the new driver validated",
            S.UPGRADE_FAILED: "compensation finished (the attempt had failed), the uncordon "
            "deadline passed, or node removed",
        },
        S.UPGRADE_DONE: {},
        S.UPGRADE_FAILED: {
            S.UPGRADE_REQUIRED: "the retry backoff passed and attempts are left",
        },
    }
)
"""State -> the states it may move to -> the trigger of that move."""


Transition = machine.Transition[UpgradeState]
"""One move of an upgrade saga."""


def allowed(from_state: UpgradeState, to_state: UpgradeState) -> bool:
    """Whether the table has the move."""
    return to_state in TABLE[from_state]


def require(from_state: UpgradeState, to_state: UpgradeState) -> None:
    """Raise `IllegalTransition` unless the table has the move."""
    if not allowed(from_state, to_state):
        raise IllegalTransition(f"no transition {from_state} -> {to_state} in the table")


__all__ = ["TABLE", "IllegalTransition", "Transition", "allowed", "edges", "require"]


def edges() -> frozenset[tuple[UpgradeState, UpgradeState]]:
    """Every move of the table."""
    return frozenset((a, b) for a, nexts in TABLE.items() for b in nexts)
