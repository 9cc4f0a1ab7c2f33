"""Sagas: one kind-agnostic machinery, one folder per kind, a pure core.

Above `gpuop.events` and `gpuop.policy`, below the upgrade orchestrator service, which does
all the I/O: it keeps one record per node and kind in KV, folds each event of the log into
it (each kind's `folding.step`, the fold replay takes too), writes the returned record with
compare-and-set, then publishes the commands and executes the Kubernetes actions; it runs
`admission.plan` to start nodes. Nothing here reads a clock, the bus or Kubernetes. Import
the modules as namespaces:

    machine       what every saga kind runs on: Kind (states, table, one Phase per state,
                  hooks), Draft (moves checked against the table, deadlines, effects),
                  decide, Decision, Transition
    actions       IssuedCommand and the Kubernetes actions every kind may issue (Cordon,
                  Drain, SetStateLabel, RecordEvent, ...); the upgrade's Decision
    admission     plan / admit: maxParallelUpgrades, maxUnavailable, canary, the nodes
                  left out (skip labels, cordonedNodes: skip)
    tallies       DoneSagas: the done sagas admission counts instead of reading them
    replaying     `gpuop replay`: an exported log folded through a fresh core, compared

One folder per kind, each the same shape (kind, table, phases, record, drafting, its fold):

    upgrade       the driver upgrade (`upgrade.UPGRADE`)
    remediation   GPU health remediation
    mig           MIG reconfiguration
"""

from gpuop.saga import actions, admission, machine, replaying, tallies, upgrade
from gpuop.saga.actions import Decision, IssuedCommand, KubeAction
from gpuop.saga.admission import Admission, NodeStatus, admit, plan
from gpuop.saga.upgrade.core import Admitted, deadline_event, decide, state_changed
from gpuop.saga.upgrade.kind import pending
from gpuop.saga.upgrade.records import NodeSaga, new_saga
from gpuop.saga.upgrade.table import TABLE, IllegalTransition, Transition

__all__ = [
    "TABLE",
    "Admission",
    "Admitted",
    "Decision",
    "IllegalTransition",
    "IssuedCommand",
    "KubeAction",
    "NodeSaga",
    "NodeStatus",
    "Transition",
    "actions",
    "admission",
    "admit",
    "deadline_event",
    "decide",
    "machine",
    "new_saga",
    "pending",
    "plan",
    "replaying",
    "state_changed",
    "tallies",
    "upgrade",
]
