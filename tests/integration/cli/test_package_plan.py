"""The fleet's driver matrix: `gpuop package plan` lists the packages (version, flavour,
kernel, architecture) the nodes need and a driver source lacks, with the build command of
each; `gpuop package build --missing` builds exactly those (the build itself a stub that
records what it was asked for: real module builds are the slow suite's); `gpuop upgrade
start` refuses a version whose matrix is incomplete. Against the simulated API server with
the real CRD and real format-2 packages in a driver source directory."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpuop.events.driver import Flavour
from gpuop.host import building, packaging
from gpuop.kube import client, customobjects
from gpuop_sim import ApiServer
from tests.support.cli_runs import add_package, cli, gpu_node, policy_object
from tests.support.rollouts import install_crd

OLD, NEW = "535.216.01", "535.261.03"
KERNEL_A, KERNEL_B = "6.1.0-44-amd64", "6.1.0-57-amd64"
ARM_KERNEL = "6.1.0-57-arm64"
RESOURCE = customobjects.GPU_CLUSTER_POLICIES


def policy(version: str, source: Path | str) -> dict[str, Any]:
    """NEW's or OLD's open modules from `source`, the proprietary ones in pool `legacy`."""
    gpu = {"version": version, "source": str(source), "allowUnsigned": True}
    legacy: dict[str, Any] = {"name": "legacy", "nodeSelector": "pool=legacy"}
    legacy["gpu"] = {**gpu, "kernelModuleType": "proprietary"}
    spec = {
        "driver": {"gpu": {**gpu, "kernelModuleType": "open"}, "pools": [legacy]},
        "upgradePolicy": {"maxParallelUpgrades": 1, "maxUnavailable": "100%"},
    }
    return policy_object(spec)


@dataclass
class Fleet:
    kubeconfig: Path
    source: Path
    server: ApiServer
    built: list[dict[str, Any]] = field(default_factory=list)

    async def with_policy(self, body: dict[str, Any]) -> None:
        async with await client.connect(self.kubeconfig) as kube:
            await customobjects.create(kube, RESOURCE, body)

    async def gpu_version(self) -> str:
        async with await client.connect(self.kubeconfig) as kube:
            found = await customobjects.get(kube, RESOURCE, "default")
        return str(found["spec"]["driver"]["gpu"]["version"])

    async def run(self, *argv: str) -> tuple[int, str, str]:
        return await cli(*argv, "--kubeconfig", str(self.kubeconfig))


@pytest.fixture
async def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Fleet]:
    """Three amd64 nodes: two on KERNEL_A, one on KERNEL_B in the proprietary pool `legacy`;
    the build replaced by a stub that records its arguments and writes the package."""
    source = tmp_path / "drivers"
    source.mkdir()
    async with ApiServer() as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        server.seed(gpu_node("gpu-node-1", KERNEL_A, OLD))
        server.seed(gpu_node("gpu-node-2", KERNEL_A, OLD))
        server.seed(gpu_node("gpu-node-3", KERNEL_B, OLD, pool="legacy"))
        async with await client.connect(kubeconfig) as kube:
            await install_crd(kube)
        built = Fleet(kubeconfig, source, server)

        def stub_build(**asked: Any) -> packaging.BuiltPackage:
            built.built.append(asked)
            add_package(asked["out"], asked["version"], asked["flavour"], asked["kernel_release"])
            return packaging.BuiltPackage("gpu", asked["version"], "k", asked["out"], "0" * 64)

        monkeypatch.setattr(building, "build_from_debian", stub_build)
        yield built


async def test_plan_lists_each_missing_package_with_the_command_that_builds_it(
    fleet: Fleet,
) -> None:
    add_package(fleet.source, NEW, Flavour.OPEN, KERNEL_A)
    add_package(fleet.source, NEW, Flavour.OPEN, KERNEL_B)  # the pool wants proprietary
    await fleet.with_policy(policy(NEW, fleet.source))
    code, out, err = await fleet.run("package", "plan", "--source", str(fleet.source))
    assert code == 0, err
    assert f"driver source {fleet.source} lacks 1 of the 2 package(s) the fleet needs" in out
    assert (
        f"gpu {NEW} proprietary for kernel {KERNEL_B} (amd64) (the source has it for this "
        "kernel: open): nodes gpu-node-3"
    ) in out
    assert (
        f"gpuop package build --from-debian --version {NEW} --flavour proprietary "
        f"--kernel {KERNEL_B} --out {fleet.source}"
    ) in out
    assert "gpu-node-1" not in out


async def test_plan_says_a_complete_source_lacks_nothing(fleet: Fleet) -> None:
    add_package(fleet.source, NEW, Flavour.OPEN, KERNEL_A)
    add_package(fleet.source, NEW, Flavour.PROPRIETARY, KERNEL_B)
    await fleet.with_policy(policy(NEW, fleet.source))
    code, out, err = await fleet.run("package", "plan", "--json", "--source", str(fleet.source))
    assert code == 0, err
    document = json.loads(out)
    assert document["missing"] == [] and document["needed"] == 2


async def test_a_file_url_source_is_planned_and_built_as_its_directory(fleet: Fleet) -> None:
    add_package(fleet.source, NEW, Flavour.OPEN, KERNEL_A)
    await fleet.with_policy(policy(NEW, fleet.source))
    code, out, err = await fleet.run("package", "plan", "--source", f"file://{fleet.source}")
    assert code == 0, err
    assert f"--kernel {KERNEL_B} --out {fleet.source}\n" in out


async def test_plan_of_an_empty_directory_names_every_package_once(fleet: Fleet) -> None:
    fleet.server.seed(gpu_node("gpu-node-4", ARM_KERNEL, OLD, **{"kubernetes.io/arch": "arm64"}))
    await fleet.with_policy(policy(NEW, "/srv/drivers"))  # --source stands in for it
    code, out, err = await fleet.run("package", "plan", "--json", "--source", str(fleet.source))
    assert code == 0, err
    rows = {
        (p["version"], p["flavour"], p["kernel"], p["arch"]): p for p in json.loads(out)["missing"]
    }
    assert sorted(rows) == [
        (NEW, "open", KERNEL_A, "amd64"),
        (NEW, "open", ARM_KERNEL, "arm64"),
        (NEW, "proprietary", KERNEL_B, "amd64"),
    ]
    assert rows[(NEW, "open", KERNEL_A, "amd64")]["nodes"] == ["gpu-node-1", "gpu-node-2"]
    arm = rows[(NEW, "open", ARM_KERNEL, "arm64")]
    assert arm["notBuildable"] is None
    assert arm["command"].endswith(f"--kernel {ARM_KERNEL} --arch arm64 --out {fleet.source}")


async def test_build_missing_builds_exactly_the_missing_packages(fleet: Fleet) -> None:
    add_package(fleet.source, NEW, Flavour.OPEN, KERNEL_A)
    await fleet.with_policy(policy(NEW, fleet.source))
    code, out, err = await fleet.run("package", "build", "--missing", "--source", str(fleet.source))
    assert code == 0, err
    asked = [(b["version"], b["flavour"], b["kernel_release"], b["out"]) for b in fleet.built]
    assert asked == [(NEW, Flavour.PROPRIETARY, KERNEL_B, fleet.source)]
    assert f"built 1 package(s) into {fleet.source}" in out
    code, out, err = await fleet.run("package", "plan", "--source", str(fleet.source))
    assert code == 0 and "has all 2 package(s) the fleet needs" in out, out + err


async def test_build_missing_cross_builds_an_arm64_nodes_package(fleet: Fleet) -> None:
    add_package(fleet.source, NEW, Flavour.OPEN, KERNEL_A)
    add_package(fleet.source, NEW, Flavour.PROPRIETARY, KERNEL_B)
    fleet.server.seed(gpu_node("gpu-node-4", ARM_KERNEL, OLD, **{"kubernetes.io/arch": "arm64"}))
    await fleet.with_policy(policy(NEW, fleet.source))
    code, _, err = await fleet.run("package", "build", "--missing", "--source", str(fleet.source))
    assert code == 0, err
    asked = [(b["flavour"], b["kernel_release"], b["arch"]) for b in fleet.built]
    assert asked == [(Flavour.OPEN, ARM_KERNEL, "arm64")]


async def test_build_missing_builds_nothing_when_one_package_cannot_be_built(
    fleet: Fleet,
) -> None:
    power = "6.1.0-57-powerpc64le"
    fleet.server.seed(gpu_node("gpu-node-4", power, OLD, **{"kubernetes.io/arch": "ppc64le"}))
    await fleet.with_policy(policy(NEW, fleet.source))
    code, _, err = await fleet.run("package", "build", "--missing", "--source", str(fleet.source))
    assert code == 1
    assert f"gpu {NEW} open for kernel {power} (ppc64le)" in err
    assert "builds amd64, arm64 only" in err
    assert fleet.built == []


async def test_build_missing_refuses_the_flags_of_a_single_build(fleet: Fleet) -> None:
    await fleet.with_policy(policy(NEW, fleet.source))
    argv = ("package", "build", "--missing", "--source", str(fleet.source), "--kernel", KERNEL_A)
    code, _, err = await fleet.run(*argv)
    assert code == 2 and "drop --kernel" in err
    assert fleet.built == []


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("--from-debian", "--version", NEW, "--kernel", KERNEL_A, "--flavour", "open"), "--out"),
        (("--from-debian", "--version", NEW, "--out", "/tmp/x", "--source", "/tmp/x"), "--missing"),
        (("--missing",), "pass --source DIR"),
        (("--missing", "--source", "https://x.example/drivers"), "pass --source DIR"),
    ],
)
async def test_a_build_without_somewhere_to_put_it_is_a_usage_error(
    argv: tuple[str, ...], says: str
) -> None:
    code, _, err = await cli("package", "build", *argv)
    assert code == 2 and says in err


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("http://127.0.0.1:9/drivers", "cannot read its index"),
        ("/nonexistent/drivers", "no such directory"),
    ],
)
async def test_an_unreachable_source_is_one_clear_line(fleet: Fleet, given: str, says: str) -> None:
    await fleet.with_policy(policy(NEW, fleet.source))
    code, out, err = await fleet.run("package", "plan", "--source", given)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and f"driver source {given}" in err and says in err


async def test_a_node_whose_inventory_names_no_kernel_release_is_one_clear_line(
    fleet: Fleet,
) -> None:
    fleet.server.seed(gpu_node("gpu-node-4", "6.1.0 $(reboot)", OLD))
    await fleet.with_policy(policy(NEW, fleet.source))
    code, out, err = await fleet.run("package", "plan", "--source", str(fleet.source))
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "node gpu-node-4's inventory names kernel" in err


async def test_start_refuses_a_version_whose_matrix_is_incomplete(fleet: Fleet) -> None:
    fleet.server.seed(gpu_node("gpu-node-5", KERNEL_B, OLD))
    add_package(fleet.source, NEW, Flavour.OPEN, KERNEL_A)  # offered, not for KERNEL_B
    await fleet.with_policy(policy(OLD, fleet.source))
    code, out, err = await fleet.run("upgrade", "start", "--version", NEW)
    assert code == 1, out + err
    assert "lack 1 package(s) the nodes need; the policy is unchanged" in err
    assert f"gpu {NEW} open for kernel {KERNEL_B} (amd64): nodes gpu-node-5" in err
    assert (
        f"gpuop package build --from-debian --version {NEW} --flavour open "
        f"--kernel {KERNEL_B} --out {fleet.source}"
    ) in err
    assert "gpu-node-3" not in err  # its pool keeps its own version
    assert await fleet.gpu_version() == OLD


async def test_start_goes_on_when_the_matrix_is_complete(fleet: Fleet) -> None:
    fleet.server.seed(gpu_node("gpu-node-5", KERNEL_B, OLD))
    add_package(fleet.source, NEW, Flavour.OPEN, KERNEL_A)
    add_package(fleet.source, NEW, Flavour.OPEN, KERNEL_B)
    await fleet.with_policy(policy(OLD, fleet.source))
    code, _, err = await fleet.run("upgrade", "start", "--version", NEW)
    assert code == 0, err
    assert await fleet.gpu_version() == NEW
