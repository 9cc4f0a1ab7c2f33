"""Allocate's answer for GPUs: how the container runtime learns which GPUs a container gets.

`GpuAnswers.container_response` is called by `resources.GpuResource.allocate` with the
distinct GPUs or MIG devices behind the allocated ids (replicas of one GPU count once).
By the configured device list strategies it answers with:

    envvar            NVIDIA_VISIBLE_DEVICES=<uuid>,<uuid> (MIG devices by their MIG- UUID)
    cdi               CDI device names: nvidia.com/gpu=<uuid> where the node's complete spec
                      (the driver-manager's, with the driver's files) defines the device, else
                      k8s.device-plugin.nvidia.com/gpu=<uuid>, defined by the spec (device
                      nodes only) `cdi.write_spec` keeps under <host root>/var/run/cdi; the
                      default where the node has the complete spec (`PluginFlags.resolved`)
    passDeviceSpecs   also the device nodes: each target's, and the control nodes present

With only `cdi`, no environment variable is set, as upstream does. For a replica of an
MPS-shared GPU (`mps.MpsDaemon`) the answer also carries the daemon's pipe directory
(`CUDA_MPS_PIPE_DIRECTORY`, mounted with the MPS `shm` directory) and the client limits
`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` and `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`, whatever the
device list strategy. Nothing here does I/O: Allocate has to be fast.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpuop.kubelet.deviceplugin.v1beta1 import api_pb2
from gpuop.services.device_plugin import cdi
from gpuop.services.device_plugin.config import DeviceListStrategy, PluginFlags
from gpuop.services.device_plugin.inventory import Target
from gpuop.services.device_plugin.mps import MpsDaemon

VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
"""What the NVIDIA container runtime reads to choose a container's GPUs."""
DEVICE_PERMISSIONS = "rw"
"""GPU device nodes are read and written, never created, by a container."""


@dataclass(frozen=True)
class GpuAnswers:
    """Builds Allocate answers under one configuration."""

    flags: PluginFlags
    control_nodes: tuple[str, ...]
    """The control device nodes the host has, for `passDeviceSpecs`."""
    cdi_names: Mapping[str, str] = field(default_factory=dict)
    """The complete CDI spec's qualified names, by device name (`GpuInventory.cdi_names`)."""

    def container_response(
        self, targets: Sequence[Target], mps: MpsDaemon | None = None
    ) -> api_pb2.ContainerAllocateResponse:
        """One container's answer for its distinct targets, in allocation order; `mps`: the
        daemon whose clients they make the container."""
        response = api_pb2.ContainerAllocateResponse()
        strategies = self.flags.device_list_strategy
        if DeviceListStrategy.ENVVAR in strategies:
            response.envs[VISIBLE_DEVICES] = ",".join(target.uuid for target in targets)
        if DeviceListStrategy.CDI in strategies:
            response.cdi_devices.extend(
                api_pb2.CDIDevice(
                    name=self.cdi_names.get(target.uuid) or cdi.qualified_name(target)
                )
                for target in targets
            )
        if self.flags.pass_device_specs:
            nodes = dict.fromkeys(
                [node for target in targets for node in target.device_nodes]
                + list(self.control_nodes)
            )
            response.devices.extend(
                api_pb2.DeviceSpec(
                    container_path=node, host_path=node, permissions=DEVICE_PERMISSIONS
                )
                for node in nodes
            )
        if mps is not None:
            response.envs.update(mps.client_environment(targets))
            response.mounts.extend(
                api_pb2.Mount(container_path=inside, host_path=outside)
                for inside, outside in mps.client_mounts().items()
            )
        return response
