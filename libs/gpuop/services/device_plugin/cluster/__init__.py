"""The device plugin's cluster role: Dynamic Resource Allocation from the cluster's side.

Node agents hold no Kubernetes token, so this role writes what DRA needs in the API server
for them and tells them what only the API server knows:

    role     the entry point (`run`), the consumer, the watches, publishing on the bus
    slices   each DRA node's ResourceSlices from its inventory, written with compare-and-set
    claims   which node's GPUs each ResourceClaim's allocation holds: `dra.ClaimAllocated`
             and `dra.ClaimReleased`
"""
