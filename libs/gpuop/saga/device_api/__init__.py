"""The device-API switch, the fourth saga kind: a node's GPUs move between the kubelet's
device plugin API (`nvidia.com/gpu`) and Dynamic Resource Allocation, as the policy's
`deviceAPI` says for the node.

On the machinery every kind shares (`gpuop.saga.machine`); no other kind's module is
touched. Import the modules as namespaces:

    states    DeviceApiState, TABLE
    records   DeviceApiSaga (the KV record), new_saga, the steps and their outcomes
    steps     the deadlines of the steps (the upgrade's where they share a step)
    drafting  the kind's Draft (compensation in one place) and its announcements
    phases    one module per state; PHASES
    kind      DEVICE_API (the Kind), begin, decide, pending
    folding   the fold the runtime and `gpuop replay` share; KIND

The flow (`states`): admission under the shared `maxUnavailable` budget, cordon, the pods
holding the node's GPUs evicted (device-plugin resources and ResourceClaims alike),
`SetDeviceApi` to the node's device plugin and its `DeviceApiApplied` answer, a validation
pod given one GPU through the new API (a ResourceClaim for DRA), uncordon; a failure after
the switch switches back to the API of the start, then uncordons and fails.
"""

from gpuop.saga.device_api import drafting, folding, kind, phases, records, states, steps
from gpuop.saga.device_api.kind import DEVICE_API, begin, decide, pending
from gpuop.saga.device_api.records import DeviceApiSaga, new_saga
from gpuop.saga.device_api.states import DeviceApiState

__all__ = [
    "DEVICE_API",
    "DeviceApiSaga",
    "DeviceApiState",
    "begin",
    "decide",
    "drafting",
    "folding",
    "kind",
    "new_saga",
    "pending",
    "phases",
    "records",
    "states",
    "steps",
]
