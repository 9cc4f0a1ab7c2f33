"""`gpuop upgrade ... --pool`: each verb acts on one driver pool of the policy (on the
simulated API server with the real CRD), status and plan show that pool's nodes, and a pool
the policy lacks is a usage error that names the pools it has."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpuop.cli import controls
from gpuop.cli.main import main
from gpuop.kube import client, customobjects
from gpuop.policy import specs
from gpuop_sim import ApiServer
from tests.support.rollouts import install_crd

OLD, NEW, TRAIN_OLD = "580.159.04", "580.200.01", "575.57.08"
DRIVER = "nvidia.com/cuda.driver-version.full"
RESOURCE = customobjects.GPU_CLUSTER_POLICIES
# What the API server stores for a gpu driver whose kernelModuleType is unset (the CRD's default)
AUTO = {"kernelModuleType": "auto"}
NODES = {"gpu-node-1": ("train", TRAIN_OLD), "gpu-node-2": ("train", TRAIN_OLD)}
NODES |= {"gpu-node-3": ("infer", OLD), "gpu-node-4": ("infer", OLD), "gpu-node-5": ("", OLD)}


async def cli(kubeconfig: Path, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()

    def run() -> int:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                return main([*argv, "--kubeconfig", str(kubeconfig)])
            except SystemExit as exit:
                return int(exit.code or 0)

    code = await asyncio.to_thread(run)
    return code, out.getvalue(), err.getvalue()


def policy() -> dict[str, Any]:
    pools = [
        {"name": "train", "nodeSelector": "pool=train", "gpu": {"version": TRAIN_OLD}},
        {
            "name": "infer",
            "nodeSelector": "pool=infer",
            "upgradePolicy": {"maxParallelUpgrades": 2},
        },
    ]
    return {
        "apiVersion": specs.API_VERSION,
        "kind": specs.KIND,
        "metadata": {"name": "default"},
        "spec": {
            "driver": {"gpu": {"version": OLD, "source": "/srv/drivers"}, "pools": pools},
            "upgradePolicy": {"maxParallelUpgrades": 1, "maxUnavailable": "100%"},
        },
    }


class Cluster:
    def __init__(self, kube: client.Kube, kubeconfig: Path) -> None:
        self.kube, self.kubeconfig = kube, kubeconfig

    async def cli(self, *argv: str) -> tuple[int, str, str]:
        return await cli(self.kubeconfig, *argv)

    async def pools(self) -> dict[str, dict[str, Any]]:
        found = await customobjects.get(self.kube, RESOURCE, "default")
        return {p["name"]: p for p in found["spec"]["driver"]["pools"]}


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with ApiServer() as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        for name, (pool, driver) in NODES.items():
            labels = {"nvidia.com/gpu.present": "true", DRIVER: driver}
            if pool:
                labels["pool"] = pool
            server.seed(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": name, "labels": labels},
                    "spec": {},
                    "status": {"conditions": [{"type": "Ready", "status": "True"}]},
                }
            )
        async with await client.connect(kubeconfig) as kube:
            await install_crd(kube)
            await customobjects.create(kube, RESOURCE, policy())
            yield Cluster(kube, kubeconfig)


async def test_start_pause_resume_and_abort_act_on_one_pool(cluster: Cluster) -> None:
    code, out, err = await cluster.cli(
        "upgrade", "start", "--pool", "train", "--version", NEW, "--max-parallel", "2", "--json"
    )
    assert code == 0, err
    assert json.loads(out)["summary"] == f"pool train: gpu driver {TRAIN_OLD} -> {NEW}"
    pools = await cluster.pools()
    assert pools["train"]["gpu"] == {"version": NEW, **AUTO}
    assert pools["train"]["upgradePolicy"]["maxParallelUpgrades"] == 2
    assert pools["infer"] == policy()["spec"]["driver"]["pools"][1] | {
        "upgradePolicy": {"maxParallelUpgrades": 2, "paused": False}
    }  # the other pool is left as it was (the API server filled in its defaults)
    spec = (await customobjects.get(cluster.kube, RESOURCE, "default"))["spec"]
    assert spec["driver"]["gpu"]["version"] == OLD  # and so are the defaults

    code, out, _ = await cluster.cli("upgrade", "pause", "--pool", "infer")
    assert code == 0 and "pool infer paused" in out
    assert (await cluster.pools())["infer"]["upgradePolicy"]["paused"] is True
    assert (await cluster.pools())["train"]["upgradePolicy"]["paused"] is False
    code, out, _ = await cluster.cli("upgrade", "pause", "--pool", "infer", "--json")
    assert code == 0 and json.loads(out)["changed"] is False
    code, out, _ = await cluster.cli("upgrade", "resume", "--pool", "infer")
    assert code == 0 and "pool infer resumed" in out

    code, _, err = await cluster.cli("upgrade", "abort", "--pool", "infer")
    assert code == 1 and "the last start was for pool train" in err
    code, out, err = await cluster.cli("upgrade", "abort", "--json")
    assert code == 0, err
    assert json.loads(out)["summary"].startswith(f"pool train back to gpu {TRAIN_OLD}")
    assert (await cluster.pools())["train"]["gpu"] == {"version": TRAIN_OLD, **AUTO}
    found = await customobjects.get(cluster.kube, RESOURCE, "default")
    assert controls.LAST_START not in (found["metadata"].get("annotations") or {})


async def test_status_and_plan_show_one_pools_nodes(cluster: Cluster) -> None:
    await customobjects.patch(
        cluster.kube, RESOURCE, "default", {"spec": {"driver": {"gpu": {"version": NEW}}}}
    )
    code, out, err = await cluster.cli("upgrade", "status", "--json")
    assert code == 0, err
    document = json.loads(out)
    rows = {n["node"]: (n["pool"], n["state"]) for n in document["nodes"]}
    assert rows == {
        "gpu-node-1": ("train", "upgrade-done"),  # runs its pool's driver already
        "gpu-node-2": ("train", "upgrade-done"),
        "gpu-node-3": ("infer", "upgrade-required"),  # the pool leaves gpu to the default
        "gpu-node-4": ("infer", "upgrade-required"),
        "gpu-node-5": (None, "upgrade-required"),
    }
    assert [p["name"] for p in document["policy"]["pools"]] == ["train", "infer"]

    code, out, _ = await cluster.cli("upgrade", "status", "--pool", "infer")
    assert code == 0
    assert "pool infer: gpu 580.200.01, maxParallelUpgrades 2, nodes: pool=infer" in out
    assert "gpu-node-3" in out and "gpu-node-1" not in out and "gpu-node-5" not in out
    code, out, _ = await cluster.cli("upgrade", "status", "--pool", "default", "--json")
    assert [n["node"] for n in json.loads(out)["nodes"]] == ["gpu-node-5"]

    code, out, err = await cluster.cli("upgrade", "plan", "--json")
    assert code == 0, err
    first = json.loads(out)["waves"][0]["nodes"]
    assert sorted(first) == ["gpu-node-3", "gpu-node-4", "gpu-node-5"]  # infer two at once
    code, out, _ = await cluster.cli("upgrade", "plan", "--pool", "infer", "--json")
    assert json.loads(out)["nodes"]["selected"] == 2


async def test_a_pool_the_policy_lacks_is_a_usage_error(cluster: Cluster) -> None:
    for argv in (
        ("upgrade", "status", "--pool", "gpu-b"),
        ("upgrade", "pause", "--pool", "gpu-b"),
        ("upgrade", "start", "--pool", "gpu-b", "--version", NEW),
    ):
        code, _, err = await cluster.cli(*argv)
        assert code == 2, argv
        assert "--pool gpu-b" in err and "train, infer" in err, err
    code, _, err = await cluster.cli(
        "upgrade", "start", "--pool", "train", "--version", NEW, "--selector", "x=y"
    )
    assert code == 2 and "a pool's nodes are its nodeSelector" in err


async def test_start_in_a_pool_keeps_its_gpu_entrys_source_keys_and_module_type(
    cluster: Cluster,
) -> None:
    """The pools list is patched whole: the pool's `gpu` keeps all it had but the version."""
    own = {
        "version": TRAIN_OLD,
        "source": "https://drivers.example/train",
        "publicKeys": ["RWQ" + "A" * 53],
        "kernelModuleType": "open",
    }
    pools = [
        {**p, "gpu": own} if p["name"] == "train" else p
        for p in policy()["spec"]["driver"]["pools"]
    ]
    await customobjects.patch(
        cluster.kube, RESOURCE, "default", {"spec": {"driver": {"pools": pools}}}
    )
    code, _, err = await cluster.cli("upgrade", "start", "--pool", "train", "--version", NEW)
    assert code == 0, err
    assert (await cluster.pools())["train"]["gpu"] == {**own, "version": NEW}

    code, _, err = await cluster.cli(
        "upgrade", "start", "--pool", "train", "--version", NEW, "--source", "/srv/train"
    )
    assert code == 0, err
    assert (await cluster.pools())["train"]["gpu"] == {
        **own,
        "version": NEW,
        "source": "/srv/train",
    }

    code, _, err = await cluster.cli("upgrade", "abort", "--pool", "train")
    assert code == 0, err
    # abort undoes the last start: the entry as it was, its own source back
    assert (await cluster.pools())["train"]["gpu"] == {**own, "version": NEW}
