"""The CDI spec the `cdi` strategy's names resolve through, and the names Allocate answers
with: the node's complete spec's (`nvidia.com/gpu`, the driver-manager's) where it defines
the device, by default where the node has one; the `envvar` strategy kept when configured."""

from __future__ import annotations

import json
from pathlib import Path

from gpuop.host import cdi as host_cdi
from gpuop.host.roots import HostRoot
from gpuop.kubelet.deviceplugin.v1beta1 import api_pb2
from gpuop.services.device_plugin import cdi
from gpuop.services.device_plugin.config import DevicePluginConfig
from gpuop.services.device_plugin.inventory import EMPTY, GpuInventory
from gpuop.services.device_plugin.resources import gpu_resources
from tests.support.device_plugin import config, sim_inventory, strategies


def test_the_spec_names_every_gpu_and_mig_device_by_uuid(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidiactl").touch()
    inventory = sim_inventory(root, gpus=2, mig={1: ["3g.71gb", "3g.71gb"]})
    path = cdi.write_spec(root, inventory)
    assert path == tmp_path / "var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json"
    spec = json.loads(path.read_text())
    assert spec["cdiVersion"] == "0.5.0"
    assert spec["kind"] == "k8s.device-plugin.nvidia.com/gpu"
    names = [device["name"] for device in spec["devices"]]
    gpu0, gpu1 = (gpu.whole.uuid for gpu in inventory.gpus)
    migs = [mig.uuid for mig in inventory.gpus[1].mig_devices]
    assert names == [gpu0, gpu1, *migs]
    edits = {d["name"]: d["containerEdits"]["deviceNodes"] for d in spec["devices"]}
    assert edits[gpu1] == [{"path": "/dev/nvidia1"}]
    assert edits[migs[0]][0] == {"path": "/dev/nvidia1"}
    assert spec["containerEdits"] == {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "deviceNodes": [{"path": "/dev/nvidiactl"}],
    }
    assert [p.name for p in path.parent.iterdir()] == [path.name], "no temporary file left"


def test_mig_capability_nodes_come_from_the_driver(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    inventory = sim_inventory(root, gpus=1, mig={0: ["3g.71gb"]})
    mig = inventory.gpus[0].mig_devices[0]
    gi = tmp_path / "proc/driver/nvidia/capabilities/gpu0/mig/gi1"
    (gi / "ci0").mkdir(parents=True)
    (gi / "access").write_text("DeviceFileMinor: 12\nDeviceFileMode: 292\n")
    (gi / "ci0" / "access").write_text("DeviceFileMinor: 13\n")
    again = sim_inventory(root, gpus=1, mig={0: ["3g.71gb"]})
    assert mig.device_nodes == ("/dev/nvidia0",)
    assert again.gpus[0].mig_devices[0].device_nodes == (
        "/dev/nvidia0",
        "/dev/nvidia-caps/nvidia-cap12",
        "/dev/nvidia-caps/nvidia-cap13",
    )


def test_no_gpu_removes_the_spec(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    path = cdi.write_spec(root, sim_inventory(root, gpus=1))
    assert path.is_file()
    cdi.write_spec(root, EMPTY)
    assert not path.exists()


def complete_spec(root: HostRoot, uuids: list[str]) -> None:
    """The driver-manager's spec as it writes it: the GPUs by index, UUID and all."""
    devices = [
        host_cdi.Device((str(i), uuid), (f"/dev/nvidia{i}",)) for i, uuid in enumerate(uuids)
    ]
    driver = host_cdi.DriverFiles("535.261.03", ())
    spec = host_cdi.spec(host_cdi.with_all(devices), driver, ())
    host_cdi.write(host_cdi.spec_path(root), host_cdi.encode(spec))


def answer(
    inventory: GpuInventory, document: DevicePluginConfig
) -> api_pb2.ContainerAllocateResponse:
    [resource] = gpu_resources(inventory, document).resources
    return resource.answers.container_response([gpu.whole for gpu in inventory.gpus])


def test_where_the_node_has_the_complete_spec_cdi_names_are_the_default(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    uuids = [gpu.whole.uuid for gpu in sim_inventory(root, gpus=2).gpus]
    complete_spec(root, uuids[:1])  # the second GPU is not in it (yet)

    response = answer(sim_inventory(root, gpus=2), config())

    assert [d.name for d in response.cdi_devices] == [
        f"nvidia.com/gpu={uuids[0]}",
        f"k8s.device-plugin.nvidia.com/gpu={uuids[1]}",
    ]
    assert "NVIDIA_VISIBLE_DEVICES" not in response.envs


def test_a_configured_envvar_strategy_is_kept_beside_the_complete_spec(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    uuids = [gpu.whole.uuid for gpu in sim_inventory(root, gpus=2).gpus]
    complete_spec(root, uuids)
    inventory = sim_inventory(root, gpus=2)

    response = answer(inventory, strategies("envvar"))
    assert list(response.cdi_devices) == []
    assert response.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids)

    both = answer(inventory, strategies("envvar", "cdi"))
    assert [d.name for d in both.cdi_devices] == [f"nvidia.com/gpu={u}" for u in uuids]
    assert both.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids)


def test_without_the_complete_spec_the_default_stays_envvar(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    cdi_dir = tmp_path / "var/run/cdi"
    cdi_dir.mkdir(parents=True)
    (cdi_dir / "nvidia.com-gpu.json").write_text("{not json")  # unusable: as if none

    inventory = sim_inventory(root, gpus=1)
    response = answer(inventory, config())

    assert inventory.cdi_names == {}
    assert list(response.cdi_devices) == []
    assert response.envs["NVIDIA_VISIBLE_DEVICES"] == inventory.gpus[0].whole.uuid
