"""`gpuop upgrade start` reads the driver source's index before it edits the policy: a version
the source does not offer is refused (exit 1) naming the versions there are, and the policy
is left as it was; a version it offers starts the rollout. Against the simulated API server
with the real CRD, and real sources: a directory, and the same directory served over http
(its index signed, as a node requires over plain http)."""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuop.host import packaging, signing
from gpuop.kube import client, customobjects
from gpuop.policy import specs
from gpuop_sim import ApiServer
from gpuop_sim.host import keys
from tests.support.cli_runs import cli
from tests.support.rollouts import install_crd

OLD, NEW, ABSENT = "580.159.04", "580.200.01", "580.210.02"
KERNEL = "6.1.0-44-amd64"
RESOURCE = customobjects.GPU_CLUSTER_POLICIES


def policy(source: str) -> dict[str, Any]:
    return {
        "apiVersion": specs.API_VERSION,
        "kind": specs.KIND,
        "metadata": {"name": "default"},
        "spec": {
            "driver": {"gpu": {"version": OLD, "source": source, "publicKeys": [keys.PUBLIC_KEY]}},
            "upgradePolicy": {"maxParallelUpgrades": 1},
        },
    }


@pytest.fixture
def drivers(tmp_path: Path) -> Path:
    """A source with the GPU driver's OLD and NEW for one kernel, signed."""
    source = tmp_path / "drivers"
    packaging.build_driver_source(
        source, [("gpu", NEW, KERNEL), ("gpu", OLD, KERNEL)], signing_key=keys.SIGNING_KEY
    )
    return source


@pytest.fixture
def served(drivers: Path) -> Iterator[str]:
    """`drivers` over plain http on loopback."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(drivers))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class Cluster:
    def __init__(self, kube: client.Kube, kubeconfig: Path) -> None:
        self.kube = kube
        self.kubeconfig = kubeconfig

    async def start(self, *argv: str) -> tuple[int, str, str]:
        return await cli("upgrade", "start", *argv, "--kubeconfig", str(self.kubeconfig))

    async def policy(self) -> dict[str, Any]:
        return await customobjects.get(self.kube, RESOURCE, "default")


@pytest.fixture
async def cluster(tmp_path: Path, drivers: Path) -> AsyncIterator[Cluster]:
    async with ApiServer() as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        async with await client.connect(kubeconfig) as kube:
            await install_crd(kube)
            await customobjects.create(kube, RESOURCE, policy(str(drivers)))
            yield Cluster(kube, kubeconfig)


async def test_a_version_the_policys_source_lacks_is_refused_naming_what_it_has(
    cluster: Cluster, drivers: Path
) -> None:
    before = await cluster.policy()
    code, out, err = await cluster.start("--version", ABSENT)
    assert code == 1, out + err
    assert f"driver source {drivers} has no gpu {ABSENT} package (it has: {OLD}, {NEW})" in err
    assert "the policy is unchanged" in err
    after = await cluster.policy()
    assert after["spec"] == before["spec"]
    assert after["metadata"].get("annotations") == before["metadata"].get("annotations")


async def test_a_version_the_source_offers_starts_the_rollout(cluster: Cluster) -> None:
    code, out, err = await cluster.start("--version", NEW)
    assert code == 0, err
    assert f"gpu driver {OLD} -> {NEW}" in out and err == ""
    assert (await cluster.policy())["spec"]["driver"]["gpu"]["version"] == NEW


async def test_the_source_given_is_the_one_read_over_http(cluster: Cluster, served: str) -> None:
    code, _, err = await cluster.start("--version", ABSENT, "--source", served)
    assert code == 1
    assert f"driver source {served} has no gpu {ABSENT} package (it has: {OLD}, {NEW})" in err
    assert (await cluster.policy())["spec"]["driver"]["gpu"]["version"] == OLD
    code, _, err = await cluster.start("--version", NEW, "--source", served)
    assert code == 0, err
    gpu = (await cluster.policy())["spec"]["driver"]["gpu"]
    assert (gpu["version"], gpu["source"], gpu["publicKeys"]) == (NEW, served, [keys.PUBLIC_KEY])


async def test_an_index_a_node_would_not_trust_is_refused(cluster: Cluster, drivers: Path) -> None:
    stranger = signing.SecretKey.generate()
    packaging.sign_driver_source(drivers, stranger)
    code, _, err = await cluster.start("--version", NEW)
    assert code == 1
    assert f"driver source {drivers}:" in err and "the policy is unchanged" in err
    assert (await cluster.policy())["spec"]["driver"]["gpu"]["version"] == OLD


async def test_a_source_unreachable_from_here_is_noted_and_left_to_the_nodes(
    cluster: Cluster, tmp_path: Path
) -> None:
    only_on_nodes = tmp_path / "only-on-the-nodes"
    code, _, err = await cluster.start("--version", ABSENT, "--source", str(only_on_nodes))
    assert code == 0, err
    assert f"driver source {only_on_nodes} not checked" in err
    assert "each node checks it before its cordon" in err
    assert (await cluster.policy())["spec"]["driver"]["gpu"]["version"] == ABSENT


async def with_parameters(cluster: Cluster, wanted: dict[str, Any]) -> None:
    await customobjects.patch(
        cluster.kube,
        RESOURCE,
        "default",
        {"spec": {"driver": {"gpu": {"kernelModuleParameters": wanted}}}},
    )


async def test_a_parameter_the_modules_do_not_declare_is_refused_naming_the_nearest(
    cluster: Cluster, drivers: Path
) -> None:
    await with_parameters(
        cluster, {"nvidia": {"NVreg_EnableGpuFirmwre": 0}, "nvidia_uvm": {"uvm_disable_hmm": 2}}
    )
    before = await cluster.policy()
    code, out, err = await cluster.start("--version", NEW)
    assert code == 1, out + err
    assert f"kernelModuleParameters: the gpu {NEW} modules of {drivers} would not take" in err
    assert (
        "nvidia: no parameter NVreg_EnableGpuFirmwre; did you mean NVreg_EnableGpuFirmware" in err
    )
    assert "nvidia_uvm.uvm_disable_hmm: is a bool: Y or N (or 1 or 0), not 2" in err
    assert (await cluster.policy())["spec"] == before["spec"]


async def test_declared_parameters_of_the_right_type_start_the_rollout(cluster: Cluster) -> None:
    wanted = {"nvidia": {"NVreg_EnableGpuFirmware": 0, "NVreg_RegistryDwords": "RMUseSwI2c=0x01"}}
    await with_parameters(cluster, wanted)
    code, _, err = await cluster.start("--version", NEW)
    assert code == 0, err
    gpu = (await cluster.policy())["spec"]["driver"]["gpu"]
    assert (gpu["version"], gpu["kernelModuleParameters"]) == (NEW, wanted)
