"""Sagas: one kind-agnostic machinery, the driver upgrade as its first kind, a pure core.

Above `gpuop.events` and `gpuop.policy`, below the upgrade orchestrator service, which does
all the I/O: it keeps one `NodeSaga` per node in KV, folds each event of the log into it
(`folding.step`, the fold replay takes too), writes the returned saga with compare-and-set,
then publishes the commands and executes the Kubernetes actions; it runs `admission.plan` to
start nodes. Nothing here reads a clock, the bus or Kubernetes. Import the modules as
namespaces:

    machine       what every saga kind runs on: Kind (states, table, one Phase per state,
                  hooks), Draft (moves checked against the table, deadlines, effects),
                  decide, Decision, Transition; a new kind (GPU remediation, MIG
                  reconfiguration) brings its own states and phases and touches no other's
    upgrade       UPGRADE: the driver upgrade as a kind (its table, phases and hooks);
                  `pending` re-issues a stored saga's step after a crash
    phases        one module per upgrade state: enter, on_event, on_deadline; PHASES
    records       NodeSaga (the KV record), new_saga, the targets and outcomes it keeps
    steps         the steps inside each state, their order and their deadlines
    transitions   TABLE: state -> allowed next states, with triggers; IllegalTransition
    actions       Decision, IssuedCommand and the Kubernetes actions (Cordon, Drain, ...)
    effects       ids and driver commands the phases' effects share
    drafting      the upgrade's Draft (the helpers its phases share) and its announcements
    compensation  what a failure leads to: uncordon, rollback, upgrade-failed, retry
    core          decide(saga, event, policy, now) -> Decision: UPGRADE on the machinery
    admission     plan / admit: maxParallelUpgrades, maxUnavailable, canary, the nodes
                  left out (skip labels, cordonedNodes: skip)
    tallies       DoneSagas: the done sagas admission counts instead of reading them
    folding       one fold from the log to decisions: the inbound set, triggers, a saga
                  from its SagaStarted, one step, a decision's outputs with their ids
    replaying     `gpuop replay`: an exported log folded through a fresh core, compared
"""

from gpuop.saga import (
    actions,
    admission,
    compensation,
    core,
    drafting,
    effects,
    folding,
    machine,
    phases,
    records,
    replaying,
    steps,
    tallies,
    transitions,
    upgrade,
)
from gpuop.saga.actions import Decision, IssuedCommand, KubeAction
from gpuop.saga.admission import Admission, NodeStatus, admit, plan
from gpuop.saga.core import Admitted, deadline_event, decide, state_changed
from gpuop.saga.records import NodeSaga, new_saga
from gpuop.saga.transitions import TABLE, IllegalTransition, Transition
from gpuop.saga.upgrade import pending

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
    "compensation",
    "core",
    "deadline_event",
    "decide",
    "drafting",
    "effects",
    "folding",
    "machine",
    "new_saga",
    "pending",
    "phases",
    "plan",
    "records",
    "replaying",
    "state_changed",
    "steps",
    "tallies",
    "transitions",
    "upgrade",
]
