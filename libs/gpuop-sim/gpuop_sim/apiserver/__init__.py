"""A simulated Kubernetes API server, faithful to the apiserver semantics gpuop relies on:
one global resourceVersion, 409 conflicts, Status errors, watches with bookmarks and 410,
selectors, the three patch types, finalizers and graceful pod deletion, eviction against
PodDisruptionBudgets, and CRDs served generically with schema validation; and to what
kubectl 1.37 asks of kube-apiserver 1.37.2: HTTPS, /version, OpenAPI v2 and v3, access
reviews. The product reaches it through the official client and a kubeconfig, exactly as
it reaches a real cluster; nothing here imports `gpuop.kube`.

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
    discovery   discovery documents, /version  handlers    HTTP verbs and routing
    openapi     /openapi/v2 and v3             definitions meta types' OpenAPI schemas
    authorizing RBAC rules, request attributes reviews     access reviews, whoami
    protobufs   protobuf request bodies of kubectl's typed clients
    certificates  the throwaway CA and the serving certificate (TLS only)
    server      ApiServer                      threaded    ApiServer in a thread
    kubeconfig  kubeconfig files (https URL, CA, token)
    accounting  requests counted by verb, resource and scope
    faults      500s, 429s and dropped watches, on purpose (FaultPlan)
"""
