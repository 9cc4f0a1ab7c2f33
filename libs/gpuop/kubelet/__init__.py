"""The kubelet's gRPC contracts, as Python stubs generated from `proto/kubelet`, and what
every client and server on a kubelet socket shares.

    deviceplugin.v1beta1   Registration (served by the kubelet) and DevicePlugin (served
                           by a device plugin): `api_pb2` messages, `api_pb2_grpc` stubs
    podresources.v1        PodResourcesLister (served by the kubelet): what each
                           container was allocated
    constants              API version, health strings, socket paths under a host root
    sockets                gRPC addresses of unix sockets of any path length
    statuses               ending an RPC with a gRPC status
    codegen                `python -m gpuop.kubelet.codegen` (`make proto`) regenerates
                           the stubs; a test fails when the committed ones drift

The device plugin service serves DevicePlugin and calls Registration; the simulated kubelet
(`gpuop_sim.cluster.kubelet_grpc`) serves Registration and PodResourcesLister; telemetry calls
PodResourcesLister. The generated modules are committed and excluded from ruff; mypy reads
the `.pyi` stubs beside them.
"""
