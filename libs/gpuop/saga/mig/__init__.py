"""MIG reconfiguration, the third saga kind: a node's `nvidia.com/mig.config` label names a
layout of mig-parted's config file, and the node is re-carved to it.

On the machinery every kind shares (`gpuop.saga.machine`); the driver upgrade's modules are
untouched. Import the modules as namespaces:

    states    MigState, TABLE, and `nvidia.com/mig.config.state` (`config_state`)
    plans     MigPlan: a request resolved against the policy's configs and the node's GPUs
              (the layouts, the GPUs re-carved, the layout each had at the start)
    records   MigSaga (the KV record), new_saga, the steps and their outcomes
    steps     the deadlines of the steps, from the policy's `mig.deadlines`
    actions   the Kubernetes actions: the state label, the eviction of named pods, Events
    drafting  the kind's Draft (compensation in one place) and its announcements
    phases    one module per state; PHASES
    kind      MIG (the Kind), begin, decide, pending, next_request

The flow (`states`): admission under the shared `maxUnavailable` budget, the operands
paused (the hold on the GPUs: the device plugin advertises them Unhealthy; the node is not
cordoned), the pods holding the re-carved GPUs listed by the device plugin and only they
evicted, `ApplyMigLayout` to the driver-manager (which regenerates the CDI spec), its answer
verified against the request, the operands resumed (the device plugin advertises the new
MIG devices), `success`; a failure restores the layout recorded at the start and ends
`failed` with its reason.
"""

from gpuop.saga.mig import actions, drafting, kind, phases, plans, records, states, steps
from gpuop.saga.mig.kind import MIG, begin, decide, next_request, pending
from gpuop.saga.mig.plans import MigPlan, plan
from gpuop.saga.mig.records import MigSaga, new_saga
from gpuop.saga.mig.states import ConfigState, MigState

__all__ = [
    "MIG",
    "ConfigState",
    "MigPlan",
    "MigSaga",
    "MigState",
    "actions",
    "begin",
    "decide",
    "drafting",
    "kind",
    "new_saga",
    "next_request",
    "pending",
    "phases",
    "plan",
    "plans",
    "records",
    "states",
    "steps",
]
