"""The device plugin's DRA kubelet plugin (driver `gpu.nvidia.com`): the node side of
Dynamic Resource Allocation, served instead of `nvidia.com/gpu` on nodes switched to DRA.

The allocations come over the bus (the device plugin's cluster role reads ResourceClaims and
publishes `dra.ClaimAllocated` for the node), since node agents hold no Kubernetes token;
the slices are the cluster role's too. This package prepares what the kubelet asks for:

    plugin       `DraPlugin`: the claims (`gpuop.inventory.claims.ClaimHolders`, the same
                 fold the holders read), the checkpoint and the servers of one node
    serving      the gRPC servers: registration, DRAPlugin v1 and v1beta1, DRAResourceHealth
    preparing    NodePrepareResources and NodeUnprepareResources, per claim, idempotent
    checkpoint   what was prepared, on the host, across restarts of this boot
    cdispecs     one CDI spec per claim, with the node's `nvidia.com/gpu` spec's edits
    sharing      the claim's opaque configuration (NVIDIA's `GpuConfig`), strictly
    switching    `SetDeviceApi`: the device plugin API or DRA, and what is reported
    deviceapis   which API the node serves, kept on the host
"""
