"""`gpuop upgrade plan` refuses a rollout whose driver source has no package for some node's
kernel, naming the nodes and kernels, against the simulated API server with the real CRD and
a real driver source directory (stand-in packages, `index.json` read by the driver-manager's
own source code)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpuop.host import packaging
from gpuop.kube import client, customobjects
from gpuop.policy import specs
from gpuop_sim import ApiServer
from tests.support.cli_runs import cli
from tests.support.rollouts import install_crd

OLD, NEW = "580.159.04", "580.200.01"
KERNEL_A, KERNEL_B = "6.1.0-41-amd64", "6.1.0-44-amd64"
DRIVER = "nvidia.com/cuda.driver-version.full"
KERNELS = {"gpu-node-1": KERNEL_A, "gpu-node-2": KERNEL_A, "gpu-node-3": KERNEL_B}


def node(name: str, kernel: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true", DRIVER: OLD}},
        "spec": {},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "nodeInfo": {"kernelVersion": kernel},
        },
    }


def policy(source: str, *, allow_unsigned: bool = True) -> dict[str, Any]:
    gpu: dict[str, Any] = {"version": NEW, "source": source}
    if allow_unsigned:
        gpu["allowUnsigned"] = True
    return {
        "apiVersion": specs.API_VERSION,
        "kind": specs.KIND,
        "metadata": {"name": "default"},
        "spec": {
            "driver": {"gpu": gpu},
            "upgradePolicy": {"maxParallelUpgrades": 1, "maxUnavailable": "100%"},
        },
    }


@pytest.fixture
async def kubeconfig(tmp_path: Path) -> AsyncIterator[Path]:
    async with ApiServer() as server:
        path = server.write_kubeconfig(tmp_path / "kubeconfig")
        for name, kernel in KERNELS.items():
            server.seed(node(name, kernel))
        async with await client.connect(path) as kube:
            await install_crd(kube)
            yield path


async def with_policy(kubeconfig: Path, body: dict[str, Any]) -> None:
    async with await client.connect(kubeconfig) as kube:
        await customobjects.create(kube, customobjects.GPU_CLUSTER_POLICIES, body)


async def test_plan_refuses_a_rollout_without_a_package_for_a_nodes_kernel(
    kubeconfig: Path, tmp_path: Path
) -> None:
    source = tmp_path / "drivers"
    packaging.build_driver_source(source, [("gpu", NEW, KERNEL_A), ("gpu", OLD, KERNEL_B)])
    await with_policy(kubeconfig, policy(str(source)))
    code, out, err = await cli("upgrade", "plan", "--kubeconfig", str(kubeconfig))
    assert code == 1, out + err
    assert "refusing the rollout" in err
    assert f"no gpu {NEW} package for kernel {KERNEL_B}: nodes gpu-node-3 ({KERNEL_B})" in err
    assert "gpu-node-1" not in err and "gpu-node-2" not in err


async def test_plan_goes_on_when_every_nodes_kernel_has_a_package(
    kubeconfig: Path, tmp_path: Path
) -> None:
    source = tmp_path / "drivers"
    packaging.build_driver_source(source, [("gpu", NEW, KERNEL_A), ("gpu", NEW, KERNEL_B)])
    await with_policy(kubeconfig, policy(str(source)))
    code, out, err = await cli("upgrade", "plan", "--json", "--kubeconfig", str(kubeconfig))
    assert code == 0, err
    plan = json.loads(out)
    assert plan["packages"]["missingPackages"] == []
    assert plan["packages"]["uncheckedSources"] == {}
    assert sorted(n for w in plan["waves"] for n in w["nodes"]) == sorted(KERNELS)


async def test_plan_refuses_an_index_the_nodes_would_not_trust(
    kubeconfig: Path, tmp_path: Path
) -> None:
    source = tmp_path / "drivers"
    packaging.build_driver_source(source, [("gpu", NEW, KERNEL_A), ("gpu", NEW, KERNEL_B)])
    await with_policy(kubeconfig, policy(str(source), allow_unsigned=False))
    code, _, err = await cli("upgrade", "plan", "--kubeconfig", str(kubeconfig))
    assert code == 1
    assert f"driver source {source}:" in err and "sign" in err


async def test_plan_notes_a_source_it_cannot_reach_and_plans_anyway(
    kubeconfig: Path, tmp_path: Path
) -> None:
    missing = tmp_path / "only-on-the-nodes"
    await with_policy(kubeconfig, policy(str(missing)))
    code, out, err = await cli("upgrade", "plan", "--kubeconfig", str(kubeconfig))
    assert code == 0, err
    assert f"not checked: driver source directory {missing} does not exist" in out
