"""device-plugin: the kubelet device plugin for GPUs and RDMA shared devices.

Serves the kubelet's device plugin API v1beta1 (gRPC over unix sockets in
`<host root>/var/lib/kubelet/device-plugins/`), one server per resource: `nvidia.com/gpu`
with time-slicing or MPS replicas (and the node's MPS control daemons), MIG strategies and
the `envvar` and `cdi` device list strategies, and `rdma/<name>` shared devices. Health
comes from telemetry's `device.health-changed` events and comes back when the
driver-manager validates a driver; a pause command makes it advertise every device
Unhealthy, quit its MPS daemons and let go of NVML. The `--config` file may hold named
configs; each node runs the one its label
`nvidia.com/device-plugin.config` names, switched at run time without a restart. On a node
switched to Dynamic Resource Allocation (`SetDeviceApi`), `nvidia.com/gpu` is advertised
with no device and the DRA kubelet plugin of driver `gpu.nvidia.com` serves the GPUs
instead (`dra`), preparing the claims whose allocations the bus tells it.

    agent        the bus side: restore, consumers, pause/resume confirmations, the config
                 in force; `run`
    consumers    what it subscribes to
    restoring    the health history and the last config selection from the log (the pause
                 state: `gpuop.operands`)
    plugins      the kubelet side: NVML session, resources, health, pause, config switches;
                 `DevicePlugins`
    selecting    which named config the node's label selects, and what it shares
    registering  registration with the kubelet, and again after a kubelet restart
    serving      one DevicePlugin gRPC server per resource
    resources    which resources and device ids: MIG strategies, time-slicing, MPS
    mps          MPS sharing: the control daemons a plan needs, their limits, and what a
                 container of an MPS replica gets
    mpscontrol   runs and supervises nvidia-cuda-mps-control: limits, restarts, pauses
    inventory    the GPUs and MIG devices from NVML, NUMA nodes, link scores
    allocating   Allocate's answer for GPUs: NVIDIA_VISIBLE_DEVICES, CDI names, device
                 nodes, the MPS pipe and client limits
    preferring   GetPreferredAllocation: one NUMA node, best linked, deterministic
    cdi          the CDI spec under <host root>/var/run/cdi
    health       which GPUs are unhealthy, from events
    rdma, hcas   RDMA shared devices and the host's HCAs they select
    config       the --config file: one config, or named ones
    metrics      /metrics instruments
    errors       the exception tree
    cluster      the cluster role: DRA nodes' ResourceSlices, and each ResourceClaim's
                 allocation told to the node whose GPUs it holds
    dra          the DRA kubelet plugin: registration, prepare and unprepare from the
                 claims' allocations on the bus, a CDI spec per claim, its checkpoint,
                 sharing from the claim's config, health; the switch between the two APIs
"""

import importlib

from gpuop.runtime.services import ServiceContext, ServiceDefinition
from gpuop.runtime.settings import Role
from gpuop.services.device_plugin import config


async def main(context: ServiceContext) -> None:
    """Run the role `--role` names until the service stops; each imports only its own."""
    if context.settings.role is Role.CLUSTER:
        role = importlib.import_module(f"{__name__}.cluster.role")
        await role.run(context)
        return
    agent = importlib.import_module(f"{__name__}.agent")
    await agent.run(context, config.load_configs(context.settings.config))


SERVICE = ServiceDefinition(
    name="device-plugin",
    summary="kubelet device plugin for GPUs and RDMA shared devices; DRA slices and claims",
    roles=frozenset({Role.NODE, Role.CLUSTER}),
    main=main,
)
