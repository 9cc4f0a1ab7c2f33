"""The CDI spec the `cdi` strategy's names resolve through."""

from __future__ import annotations

import json
from pathlib import Path

from gpuop.host.roots import HostRoot
from gpuop.services.device_plugin import cdi
from gpuop.services.device_plugin.inventory import EMPTY
from tests.support.device_plugin import sim_inventory


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
