"""`gpuop discover` as an admin runs it: a real process on the recorded H200 host root."""

from __future__ import annotations

import json
from pathlib import Path

from gpuop_sim import recordings
from gpuop_sim.cluster import hosts
from tests.support import container_runtimes as files
from tests.support.processes import gpuop

RECORDED = recordings.H200_HOST_ROOT


async def test_discover_json_reports_the_recorded_h200_and_its_labels() -> None:
    nvml = f"recorded:{RECORDED.parent / 'nvml.json'}"

    code, out, err = await gpuop("discover", "--host-root", str(RECORDED), "--nvml", nvml, "--json")

    assert code == 0, err
    document = json.loads(out)
    assert set(document) == {"inventory", "labels"}
    inventory, labels = document["inventory"], document["labels"]
    [gpu] = inventory["gpus"]
    assert gpu["model_name"] == "NVIDIA H200"
    assert gpu["uuid"] == "GPU-20bce083-dbf9-2d4f-3c35-c858915accc5"
    assert gpu["memory_bytes"] == 150754820096
    assert gpu["compute_capability"] == "9.0"
    assert inventory["driver_version"] == "580.159.04"
    assert inventory["cuda_driver_version"] == "13.0"
    [function] = [f for f in inventory["pci_functions"] if f["vendor_id"] == "10de"]
    assert function["device_id"] == "2335"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert labels["nvidia.com/gpu.count"] == "1"
    assert labels["nvidia.com/gpu.memory"] == "143771"
    assert labels["feature.node.kubernetes.io/pci-10de.present"] == "true"


async def test_discover_prints_tables_for_people() -> None:
    nvml = f"recorded:{RECORDED.parent / 'nvml.json'}"

    code, out, _ = await gpuop("discover", "--host-root", str(RECORDED), "--nvml", nvml)

    assert code == 0
    assert "GPUs (1)" in out
    assert "GPU-20bce083-dbf9-2d4f-3c35-c858915accc5  0000:00:06.0  NVIDIA H200" in out
    assert "580.159.04 (CUDA 13.0)" in out
    assert "nvidia.com/gpu.count=1" in out


async def test_discover_shows_runtimes_cdi_specs_and_readiness(tmp_path: Path) -> None:
    host = hosts.build_host_root(tmp_path / "host", "gpu-1", 2)
    files.containerd_with_handler(host, version=2)
    files.write_spec(host, gpus=2)
    files.write(host, "etc/cdi/broken.yaml", "kind: [\n")

    code, out, err = await gpuop("discover", "--host-root", str(host.path), "--nvml", "sim:2")

    assert code == 0, err
    assert "Container runtimes (1)" in out
    assert "containerd  -        yes             ok" in out
    assert "CDI specs (2)" in out
    assert "/var/run/cdi/nvidia.com-gpu.json  0.5.0        3        valid" in out
    assert "/etc/cdi/broken.yaml              -            0        not YAML" in out
    assert "nvidia.com/cdi.ready=true" in out
    assert "gpuop.io/runtime.nvidia=true" in out


async def test_discover_refuses_a_host_root_that_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-host"

    code, out, err = await gpuop("discover", "--host-root", str(missing), "--nvml", "sim:1")

    assert code == 2
    assert out == ""
    assert f"--host-root {missing}: no such directory" in err
