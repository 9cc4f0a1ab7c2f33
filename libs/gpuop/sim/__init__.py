"""A simulated Kubernetes cluster for tests and the demo: an API server, GPU nodes with
their kubelets, a scheduler, workload controllers and generated GPU workloads.

The API server is faithful to the apiserver semantics gpuop relies on: one global
resourceVersion, 409 conflicts, Status errors, watches with bookmarks and 410, selectors,
the three patch types, finalizers and graceful pod deletion, eviction against
PodDisruptionBudgets, and CRDs served generically with schema validation. The product
reaches it through the official client and a kubeconfig, exactly as it reaches a real
cluster.

Modules, from the bottom up::

    resources   ResourceType, Catalog          errors      Status bodies, field errors
    kinds       built-in types and rules       validation  apimachinery's checks
    schemas     openAPIV3Schema handling       timestamps  clock and time formats
    store       objects, resourceVersion, history, watch fan-out, observers
    registry    write rules; the in-process API (mutate, complete_pod_termination)
    updates     update/patch rules             deletion    delete options, grace, kubelet
    selectors   label/field selectors          patching    JSON, merge, strategic merge
    listing     list options and paging        watching    watch streams
    eviction    pods/eviction                  pdb         disruption controller
    crds        CRD controller                 namespaces  namespace controller
    nodes       unschedulable taint            garbage     ownerReference cascade
    discovery   discovery documents            handlers    HTTP verbs and routing
    server      ApiServer                      threaded    ApiServer in a thread
    kubeconfig  kubeconfig files               cli         `gpuop sim apiserver`
    accounting  requests counted by verb, resource and scope
    faults      500s, 429s and dropped watches, on purpose (FaultPlan)

The simulated cluster around the server (``SimCluster``)::

    wakeups     when controllers run           machines    GPU machines, Node objects
    podstatus   pod status a kubelet reports   heartbeats  what a kubelet posts of its node
    scheduling  the scheduler, GPU accounting  kubelet     one node's kubelet; reboots
    workload_kinds  Deployments, ReplicaSets, Jobs
    controllers what workload controllers share
    replication Deployments and ReplicaSets    jobs        Jobs
    daemons     DaemonSets                     workloads   the generated GPU workloads
    cluster     SimCluster
"""

from gpuop.sim.accounting import RequestKind
from gpuop.sim.cluster import SimCluster
from gpuop.sim.faults import FaultPlan
from gpuop.sim.server import ApiServer, RequestRecord
from gpuop.sim.threaded import ThreadedApiServer

__all__ = [
    "ApiServer",
    "FaultPlan",
    "RequestKind",
    "RequestRecord",
    "SimCluster",
    "ThreadedApiServer",
]
