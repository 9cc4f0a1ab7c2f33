"""Kubernetes access for gpuop, and the only way gpuop reaches the API server.

Everything goes through the official client's asyncio flavour (`kubernetes.aio`) and a
kubeconfig (or the pod's service account), the same against a real cluster as against
`gpuop_sim`. Objects are the plain camelCase dicts of the wire; every failure is one of
`gpuop.kube.errors`; every wait reads a `gpuop.clocks.Clock`. Import the modules as namespaces
(`from gpuop.kube import nodes` then `await nodes.cordon(kube, "node-1")`)::

    client         connect(), Kube: the ApiClient, API groups, call() (retried as
                   client-go does: RetryPolicy) and open()
    errors         KubeError and its tree, mapped from Status bodies in one place
    clocks         Clock, SystemClock, VirtualClock
    watching       ListWatch: list+watch with resume, bookmarks and relist on 410
    informers      Informer: one ListWatch read in the background, shared by many readers
    nodes          cordon/uncordon remembering the initial state, labels, annotations
    pods           GPU pod selection, pods on a node, deleting one incarnation
    budgets        which PodDisruptionBudget refused an eviction
    draining       drain_node(): kubectl drain with a deadline
    leases         LeaderElection on a coordination.k8s.io/v1 Lease
    customobjects  GPUClusterPolicy and other custom objects: get, list, watch, patch status
    recording      EventRecorder: core/v1 Events on nodes
    conditions     the GPUHealthy Node condition and the gpu-unhealthy taint
"""
