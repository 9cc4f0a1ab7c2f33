"""The kubelet's gRPC contracts, as Python stubs generated from `proto/kubelet`, and what
every client and server on a kubelet socket shares.

    deviceplugin.v1beta1   Registration (served by the kubelet) and DevicePlugin (served
                           by a device plugin): `api_pb2` messages, `api_pb2_grpc` stubs
    podresources.v1        PodResourcesLister (served by the kubelet): what each
                           container was allocated
    pluginregistration.v1  Registration (served by a kubelet plugin on its socket in
                           `plugins_registry`): the kubelet asks what the plugin is
    dra.v1, dra.v1beta1    DRAPlugin (served by a DRA kubelet plugin): prepare and
                           unprepare ResourceClaims
    dra_health.v1          DRAResourceHealth (served by a DRA kubelet plugin): device
                           health streamed to the kubelet
    constants              API version, health strings, socket paths under a host root
    sockets                gRPC addresses of unix sockets of any path length
    statuses               ending an RPC with a gRPC status
    codegen                `python -m gpuop.kubelet.codegen` (`make proto`) regenerates
                           the stubs; a test fails when the committed ones drift

The device plugin service serves DevicePlugin and calls Registration; the simulated kubelet
(`gpuop_sim.cluster.kubelet_grpc`) serves Registration and PodResourcesLister; telemetry calls
PodResourcesLister; the device plugin's DRA plugin serves Registration (pluginregistration),
DRAPlugin and DRAResourceHealth. The generated modules are committed and excluded from ruff;
mypy reads the `.pyi` stubs beside them.
"""
