"""`gpuop upgrade start` refuses a GPU driver version the source has only in other kernel
modules than the policy's `kernelModuleType` names (a format-1 package serving either, as
driver-manager selects), naming the flavours there are and leaving the policy as it was; with
`auto`, which each node resolves from GPUs start does not see, a source without the flavour
the version's branch recommends is noted and the rollout starts (`gpuop upgrade plan` checks
each node). Against the simulated API server with the real CRD and a real signed source of
format-2 packages."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpuop.events.driver import Flavour
from gpuop.host import packaging
from gpuop.kube import client, customobjects
from gpuop.policy import specs
from gpuop_sim import ApiServer
from gpuop_sim.host import keys
from tests.support.cli_runs import add_package, cli
from tests.support.rollouts import install_crd

OLD, NEW = "580.159.04", "580.200.01"
KERNEL = "6.1.0-44-amd64"
RESOURCE = customobjects.GPU_CLUSTER_POLICIES


def flavoured(source: Path, version: str, flavour: Flavour) -> None:
    """A format-2 package of `version` for KERNEL with the `flavour` modules, indexed and
    signed."""
    add_package(source, version, flavour, KERNEL, keys.SIGNING_KEY)


class Cluster:
    def __init__(self, kube: client.Kube, kubeconfig: Path, source: Path) -> None:
        self.kube = kube
        self.kubeconfig = kubeconfig
        self.source = source

    async def with_policy(self, kernel_module_type: str | None) -> None:
        gpu: dict[str, Any] = {
            "version": OLD,
            "source": str(self.source),
            "publicKeys": [keys.PUBLIC_KEY],
        }
        if kernel_module_type is not None:
            gpu["kernelModuleType"] = kernel_module_type
        body = {
            "apiVersion": specs.API_VERSION,
            "kind": specs.KIND,
            "metadata": {"name": "default"},
            "spec": {"driver": {"gpu": gpu}, "upgradePolicy": {"maxParallelUpgrades": 1}},
        }
        await customobjects.create(self.kube, RESOURCE, body)

    async def start(self, *argv: str) -> tuple[int, str, str]:
        return await cli("upgrade", "start", *argv, "--kubeconfig", str(self.kubeconfig))

    async def gpu(self) -> dict[str, Any]:
        policy = await customobjects.get(self.kube, RESOURCE, "default")
        gpu: dict[str, Any] = policy["spec"]["driver"]["gpu"]
        return gpu


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    source = tmp_path / "drivers"
    flavoured(source, OLD, Flavour.PROPRIETARY)
    async with ApiServer() as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        async with await client.connect(kubeconfig) as kube:
            await install_crd(kube)
            yield Cluster(kube, kubeconfig, source)


async def test_a_version_only_in_the_other_modules_is_refused_naming_the_flavours(
    cluster: Cluster,
) -> None:
    flavoured(cluster.source, NEW, Flavour.OPEN)
    await cluster.with_policy("proprietary")
    code, out, err = await cluster.start("--version", NEW)
    assert code == 1, out + err
    assert (
        f"driver source {cluster.source} has no gpu {NEW} package of the proprietary kernel "
        "modules for any kernel (it has: open); the policy is unchanged"
    ) in err
    assert (await cluster.gpu())["version"] == OLD


async def test_a_version_in_the_policys_modules_starts_the_rollout(cluster: Cluster) -> None:
    flavoured(cluster.source, NEW, Flavour.OPEN)
    flavoured(cluster.source, NEW, Flavour.PROPRIETARY)
    await cluster.with_policy("proprietary")
    code, _, err = await cluster.start("--version", NEW)
    assert code == 0, err
    assert err == ""
    assert (await cluster.gpu())["version"] == NEW


async def test_a_format_1_package_serves_the_policys_modules(cluster: Cluster) -> None:
    built = packaging.build_package(cluster.source, "gpu", NEW, KERNEL)
    packaging.add_to_index(cluster.source, built, keys.SIGNING_KEY)
    await cluster.with_policy("open")
    code, _, err = await cluster.start("--version", NEW)
    assert code == 0, err
    assert (await cluster.gpu())["version"] == NEW


async def test_auto_without_the_recommended_modules_is_noted_and_started(
    cluster: Cluster,
) -> None:
    flavoured(cluster.source, NEW, Flavour.PROPRIETARY)  # a Volta fleet's source, say
    await cluster.with_policy(None)  # kernelModuleType auto: open for branch 580
    code, _, err = await cluster.start("--version", NEW)
    assert code == 0, err
    assert (
        f"driver source {cluster.source} has no gpu {NEW} package of the open kernel modules "
        "for any kernel (it has: proprietary), which kernelModuleType auto picks"
    ) in err
    assert "gpuop upgrade plan checks each node's" in err
    assert (await cluster.gpu())["version"] == NEW
