"""`gpuop upgrade plan` checks that the driver source has the GPU driver in the kernel modules
each node is to run (the policy's `kernelModuleType`, `auto` resolved per node from
discovery's inventory when the plan reads the event log, else by the version's branch), as
driver-manager selects a package (a format-1 package serves either): a node whose kernel has
builds of the other modules only is refused by name, with its kernel and the flavours there
are. Against the simulated API server with the real CRD, a real NATS server for the
inventories, and real format-2 packages (modules `modinfo` reads)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpuop.bus import NatsBus, NatsServer
from gpuop.events import new_event
from gpuop.events.driver import Flavour
from gpuop.events.hardware import HardwareDiscovered
from gpuop.host import packaging
from gpuop.kube import client, customobjects
from gpuop.policy import specs
from gpuop_sim import ApiServer
from tests.support.cli_runs import add_package, cli
from tests.support.inventories import one_gpu
from tests.support.rollouts import install_crd
from tests.support.sagas import T0

OLD, NEW = "580.159.04", "580.200.01"
KERNEL_A, KERNEL_B = "6.1.0-41-amd64", "6.1.0-44-amd64"
DRIVER = "nvidia.com/cuda.driver-version.full"
KERNELS = {"gpu-node-1": KERNEL_A, "gpu-node-2": KERNEL_A, "gpu-node-3": KERNEL_B}
VOLTA, HOPPER = "1db4", "2335"
"""PCI device ids: V100 (proprietary modules only), H200 (either; open from branch 560)."""


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


def policy(source: Path, kernel_module_type: str | None = None) -> dict[str, Any]:
    gpu: dict[str, Any] = {"version": NEW, "source": str(source), "allowUnsigned": True}
    if kernel_module_type is not None:
        gpu["kernelModuleType"] = kernel_module_type
    return {
        "apiVersion": specs.API_VERSION,
        "kind": specs.KIND,
        "metadata": {"name": "default"},
        "spec": {
            "driver": {"gpu": gpu},
            "upgradePolicy": {"maxParallelUpgrades": 1, "maxUnavailable": "100%"},
        },
    }


def flavoured(source: Path, kernel: str, flavour: Flavour) -> None:
    """A format-2 package of NEW built for `kernel` with the `flavour` modules, indexed."""
    add_package(source, NEW, flavour, kernel)


def inventory(kernel: str, device_id: str) -> HardwareDiscovered:
    """What discovery reports for a node with one NVIDIA GPU of `device_id` running OLD."""
    return one_gpu(device_id, kernel=kernel, driver=OLD)


async def publish_inventories(url: str, devices: dict[str, str]) -> None:
    bus = NatsBus(url, name="discovery")
    await bus.start()
    await bus.publish_batch(
        [
            new_event(inventory(KERNELS[name], device), node=name, source="test", now=T0)
            for name, device in devices.items()
        ]
    )
    await bus.close()


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


async def test_plan_refuses_a_kernel_whose_packages_have_the_other_modules(
    kubeconfig: Path, tmp_path: Path
) -> None:
    source = tmp_path / "drivers"
    flavoured(source, KERNEL_A, Flavour.PROPRIETARY)
    flavoured(source, KERNEL_B, Flavour.OPEN)
    await with_policy(kubeconfig, policy(source, "proprietary"))
    code, out, err = await cli("upgrade", "plan", "--kubeconfig", str(kubeconfig))
    assert code == 1, out + err
    assert "refusing the rollout" in err
    assert (
        f"no gpu {NEW} proprietary package for kernel {KERNEL_B} (it has for it: open): "
        f"nodes gpu-node-3 ({KERNEL_B})"
    ) in err
    assert "gpu-node-1" not in err and "gpu-node-2" not in err


async def test_plan_takes_a_format_1_package_for_either_flavour(
    kubeconfig: Path, tmp_path: Path
) -> None:
    source = tmp_path / "drivers"
    packaging.build_driver_source(source, [("gpu", NEW, KERNEL_A), ("gpu", NEW, KERNEL_B)])
    flavoured(source, KERNEL_A, Flavour.OPEN)
    await with_policy(kubeconfig, policy(source, "proprietary"))
    code, out, err = await cli("upgrade", "plan", "--json", "--kubeconfig", str(kubeconfig))
    assert code == 0, err
    assert json.loads(out)["packages"]["missingPackages"] == []


async def test_plan_resolves_auto_per_node_from_its_inventory(
    kubeconfig: Path, tmp_path: Path, nats_server: NatsServer
) -> None:
    source = tmp_path / "drivers"
    flavoured(source, KERNEL_A, Flavour.OPEN)
    flavoured(source, KERNEL_B, Flavour.OPEN)
    await with_policy(kubeconfig, policy(source))  # kernelModuleType auto

    # without the inventories, branch 580's rule: open, which the source has everywhere
    code, out, err = await cli("upgrade", "plan", "--json", "--kubeconfig", str(kubeconfig))
    assert code == 0, err
    assert json.loads(out)["packages"]["missingPackages"] == []

    # with them, gpu-node-2's Volta GPU needs the proprietary modules the source lacks
    await publish_inventories(
        nats_server.url, {"gpu-node-1": HOPPER, "gpu-node-2": VOLTA, "gpu-node-3": HOPPER}
    )
    code, out, err = await cli(
        "upgrade", "plan", "--kubeconfig", str(kubeconfig), "--nats", nats_server.url
    )
    assert code == 1, out + err
    assert (
        f"no gpu {NEW} proprietary package for kernel {KERNEL_A} (it has for it: open): "
        f"nodes gpu-node-2 ({KERNEL_A})"
    ) in err
    assert "gpu-node-1" not in err and "gpu-node-3" not in err
