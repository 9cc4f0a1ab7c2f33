"""The kubelet protos are wire-compatible with upstream's, and the committed Python stubs
are exactly what `make proto` generates from them."""

from __future__ import annotations

from types import ModuleType

import pytest

from gpuop.kubelet import codegen
from gpuop.kubelet.deviceplugin.v1beta1 import api_pb2 as deviceplugin
from gpuop.kubelet.dra.v1 import api_pb2 as dra_v1
from gpuop.kubelet.dra.v1beta1 import api_pb2 as dra_v1beta1
from gpuop.kubelet.dra_health.v1 import api_pb2 as dra_health
from gpuop.kubelet.pluginregistration.v1 import api_pb2 as pluginregistration
from gpuop.kubelet.podresources.v1 import api_pb2 as podresources

HINT = "proto/kubelet changed: run `make proto` and commit libs/gpuop/kubelet"

# From the kubelet's deviceplugin/v1beta1/api.proto: message -> {field: number}.
DEVICE_PLUGIN = {
    "Empty": {},
    "DevicePluginOptions": {"pre_start_required": 1, "get_preferred_allocation_available": 2},
    "RegisterRequest": {"version": 1, "endpoint": 2, "resource_name": 3, "options": 4},
    "ListAndWatchResponse": {"devices": 1},
    "TopologyInfo": {"nodes": 1},
    "NUMANode": {"ID": 1},
    "Device": {"ID": 1, "health": 2, "topology": 3},
    "PreStartContainerRequest": {"devices_ids": 1},
    "PreStartContainerResponse": {},
    "PreferredAllocationRequest": {"container_requests": 1},
    "ContainerPreferredAllocationRequest": {
        "available_deviceIDs": 1,
        "must_include_deviceIDs": 2,
        "allocation_size": 3,
    },
    "PreferredAllocationResponse": {"container_responses": 1},
    "ContainerPreferredAllocationResponse": {"deviceIDs": 1},
    "AllocateRequest": {"container_requests": 1},
    "ContainerAllocateRequest": {"devices_ids": 1},
    "AllocateResponse": {"container_responses": 1},
    "ContainerAllocateResponse": {
        "envs": 1,
        "mounts": 2,
        "devices": 3,
        "annotations": 4,
        "cdi_devices": 5,
    },
    "Mount": {"container_path": 1, "host_path": 2, "read_only": 3},
    "DeviceSpec": {"container_path": 1, "host_path": 2, "permissions": 3},
    "CDIDevice": {"name": 1},
}
POD_RESOURCES = {
    "ListPodResourcesRequest": {},
    "ListPodResourcesResponse": {"pod_resources": 1},
    "AllocatableResourcesRequest": {},
    "AllocatableResourcesResponse": {"devices": 1, "cpu_ids": 2, "memory": 3},
    "GetPodResourcesRequest": {"pod_name": 1, "pod_namespace": 2},
    "GetPodResourcesResponse": {"pod_resources": 1},
    "PodResources": {"name": 1, "namespace": 2, "containers": 3, "cpu_ids": 4, "memory": 5},
    "ContainerResources": {
        "name": 1,
        "devices": 2,
        "cpu_ids": 3,
        "memory": 4,
        "dynamic_resources": 5,
    },
    "ContainerMemory": {"memory_type": 1, "size": 2, "topology": 3},
    "ContainerDevices": {"resource_name": 1, "device_ids": 2, "topology": 3},
    "TopologyInfo": {"nodes": 1},
    "NUMANode": {"ID": 1},
    "DynamicResource": {"claim_name": 2, "claim_namespace": 3, "claim_resources": 4},
    "ClaimResource": {
        "cdi_devices": 1,
        "driver_name": 2,
        "pool_name": 3,
        "device_name": 4,
        "share_id": 5,
    },
    "CDIDevice": {"name": 1},
}
# From the kubelet's dra/v1/api.proto (v1beta1 is the same without `share_id`).
DRA_V1 = {
    "NodePrepareResourcesRequest": {"claims": 1},
    "NodePrepareResourcesResponse": {"claims": 1},
    "NodePrepareResourceResponse": {"devices": 1, "error": 2},
    "Device": {
        "request_names": 1,
        "pool_name": 2,
        "device_name": 3,
        "cdi_device_ids": 4,
        "share_id": 5,
    },
    "NodeUnprepareResourcesRequest": {"claims": 1},
    "NodeUnprepareResourcesResponse": {"claims": 1},
    "NodeUnprepareResourceResponse": {"error": 1},
    "Claim": {"namespace": 1, "uid": 2, "name": 3},
}
DRA_V1BETA1 = {
    **DRA_V1,
    "Device": {"request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4},
}
DRA_HEALTH = {
    "NodeWatchResourcesRequest": {},
    "DeviceIdentifier": {"pool_name": 1, "device_name": 2},
    "DeviceHealth": {
        "device": 1,
        "health": 2,
        "last_updated_time": 3,
        "health_check_timeout_seconds": 4,
        "message": 5,
    },
    "NodeWatchResourcesResponse": {"devices": 1},
}
PLUGIN_REGISTRATION = {
    "PluginInfo": {"type": 1, "name": 2, "endpoint": 3, "supported_versions": 4},
    "RegistrationStatus": {"plugin_registered": 1, "error": 2},
    "RegistrationStatusResponse": {},
    "InfoRequest": {},
}


@pytest.mark.parametrize(
    ("module", "package", "messages"),
    [
        (deviceplugin, "v1beta1", DEVICE_PLUGIN),
        (podresources, "v1", POD_RESOURCES),
        (dra_v1, "k8s.io.kubelet.pkg.apis.dra.v1", DRA_V1),
        (dra_v1beta1, "k8s.io.kubelet.pkg.apis.dra.v1beta1", DRA_V1BETA1),
        (dra_health, "v1", DRA_HEALTH),
        (pluginregistration, "pluginregistration", PLUGIN_REGISTRATION),
    ],
)
def test_every_message_has_upstreams_fields_and_numbers(
    module: ModuleType, package: str, messages: dict[str, dict[str, int]]
) -> None:
    descriptor = module.DESCRIPTOR
    assert descriptor.package == package
    assert set(descriptor.message_types_by_name) == set(messages)
    for name, fields in messages.items():
        found = descriptor.message_types_by_name[name].fields
        assert {field.name: field.number for field in found} == fields, name


def test_the_services_have_upstreams_methods() -> None:
    def methods(module: ModuleType, service: str) -> dict[str, bool]:
        found = module.DESCRIPTOR.services_by_name[service]
        return {m.full_name: m.server_streaming for m in found.methods}

    assert methods(deviceplugin, "Registration") == {"v1beta1.Registration.Register": False}
    assert methods(deviceplugin, "DevicePlugin") == {
        "v1beta1.DevicePlugin.GetDevicePluginOptions": False,
        "v1beta1.DevicePlugin.ListAndWatch": True,
        "v1beta1.DevicePlugin.GetPreferredAllocation": False,
        "v1beta1.DevicePlugin.Allocate": False,
        "v1beta1.DevicePlugin.PreStartContainer": False,
    }
    assert set(methods(podresources, "PodResourcesLister")) == {
        "v1.PodResourcesLister.List",
        "v1.PodResourcesLister.GetAllocatableResources",
        "v1.PodResourcesLister.Get",
    }
    for dra in (dra_v1, dra_v1beta1):
        package = dra.DESCRIPTOR.package
        assert methods(dra, "DRAPlugin") == {
            f"{package}.DRAPlugin.NodePrepareResources": False,
            f"{package}.DRAPlugin.NodeUnprepareResources": False,
        }
    assert methods(dra_health, "DRAResourceHealth") == {
        "v1.DRAResourceHealth.NodeWatchResources": True
    }
    assert methods(pluginregistration, "Registration") == {
        "pluginregistration.Registration.GetInfo": False,
        "pluginregistration.Registration.NotifyRegistrationStatus": False,
    }


def test_every_api_proto_loads_side_by_side() -> None:
    assert deviceplugin.DESCRIPTOR.name == "kubelet/deviceplugin/v1beta1/api.proto"
    assert podresources.DESCRIPTOR.name == "kubelet/podresources/v1/api.proto"
    assert dra_v1.DESCRIPTOR.name == "kubelet/dra/v1/api.proto"
    assert dra_v1beta1.DESCRIPTOR.name == "kubelet/dra/v1beta1/api.proto"
    assert dra_health.DESCRIPTOR.name == "kubelet/dra-health/v1/api.proto"
    assert pluginregistration.DESCRIPTOR.name == "kubelet/pluginregistration/v1/api.proto"


def test_a_message_survives_the_wire() -> None:
    response = deviceplugin.ContainerAllocateResponse(
        envs={"NVIDIA_VISIBLE_DEVICES": "GPU-1"},
        cdi_devices=[deviceplugin.CDIDevice(name="k8s.device-plugin.nvidia.com/gpu=GPU-1")],
    )
    assert deviceplugin.ContainerAllocateResponse.FromString(response.SerializeToString()) == (
        response
    )


def test_the_committed_stubs_are_what_make_proto_generates() -> None:
    root = codegen.repository_root()
    rendered = codegen.render(root / "proto")
    target = root / "libs" / "gpuop"
    committed = {
        str(path.relative_to(target))
        for path in (target / "kubelet").rglob("*")
        if path.is_file() and path.suffix in (".py", ".pyi") and "api_pb2" in path.name
    }
    assert committed == {name for name in rendered if "api_pb2" in name}, HINT
    differing = [
        name
        for name, text in rendered.items()
        if not (target / name).is_file() or (target / name).read_text() != text
    ]
    assert not differing, f"{HINT} (out of date: {differing})"
