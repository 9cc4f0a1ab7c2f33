"""The driver upgrade, the first saga kind: the same shape as every kind's folder.

    kind          UPGRADE (the Kind: table, phases, hooks); `pending` re-issues a stored
                  saga's step after a crash
    table         TABLE: state -> allowed next states, with triggers; IllegalTransition
    phases        one module per upgrade state: enter, on_event, on_deadline; PHASES
    records       NodeSaga (the KV record), new_saga, the targets and outcomes it keeps
    steps         the steps inside each state, their order and their deadlines
    drafting      the upgrade's Draft (the helpers its phases share) and its announcements
    effects       ids and driver commands the phases' effects share
    compensation  what a failure leads to: uncordon, rollback, upgrade-failed, retry
    core          decide(saga, event, policy, now) -> Decision: UPGRADE on the machinery
    folding       the upgrade's fold, shared by the runtime and replay: the inbound set,
                  triggers, a saga from its SagaStarted, one step, a decision's outputs

Import the modules as namespaces (`from gpuop.saga.upgrade import records`): the package
itself imports none, so that the shared modules it builds on (`gpuop.saga.actions`) can
import its records.
"""
