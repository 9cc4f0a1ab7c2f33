"""`gpuop demo --kubeconfig FILE` on the real control plane: the demo registers KWOK GPU
nodes and its workloads there, rolls the upgrade with the real scheduler, eviction API and
Leases, and takes away what it made; a cluster that already has a policy is refused."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpuop.policy import crd
from tests.support.control_plane import REPO, ControlPlane
from tests.support.processes import gpuop

EXAMPLE = REPO / "deploy" / "examples" / "gpuclusterpolicy.yaml"

pytestmark = [pytest.mark.real_cluster, pytest.mark.nats]


@pytest.fixture
def fresh_plane(tmp_path: Path) -> Iterator[ControlPlane]:
    with ControlPlane(tmp_path / "control-plane") as running:
        yield running


@pytest.mark.timeout(420)
async def test_the_demo_rolls_kwok_nodes_it_registers_and_cleans_up(
    fresh_plane: ControlPlane,
) -> None:
    kubeconfig = str(fresh_plane.admin_kubeconfig)
    code, out, err = await gpuop(
        "demo", "--kubeconfig", kubeconfig, "--headless", "--nodes", "3", "--gpus", "2",
        timeout=360,
    )  # fmt: skip
    print(out[-3000:], err[-3000:], file=sys.stderr)

    assert code == 0, err[-3000:]
    outcome = json.loads(out.strip().splitlines()[-1])
    assert (outcome["nodes"], outcome["done"], outcome["failed"]) == (3, 3, 0), outcome
    nodes = fresh_plane.call("GET", "/api/v1/nodes")["items"]
    assert [n["metadata"]["name"] for n in nodes if "gpuop-demo" in n["metadata"]["name"]] == []
    policies = fresh_plane.call("GET", "/apis/gpuop.io/v1alpha1/gpuclusterpolicies")["items"]
    assert policies == []
    namespaces = {
        n["metadata"]["name"]: n["status"]["phase"]
        for n in fresh_plane.call("GET", "/api/v1/namespaces")["items"]
    }
    assert namespaces.get("ml-serving", "Terminating") == "Terminating", namespaces


async def test_the_demo_refuses_a_cluster_that_already_has_a_policy(
    fresh_plane: ControlPlane,
) -> None:
    definition = crd.build()
    fresh_plane.call("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", definition)
    policy = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    policy["metadata"]["name"] = "production"
    status = 0
    for _ in range(100):
        status, _ = fresh_plane.request(
            "/apis/gpuop.io/v1alpha1/gpuclusterpolicies", method="POST", body=policy
        )
        if status == 201:
            break
        await asyncio.sleep(0.1)  # the apiserver serves a new CRD a moment after creating it
    assert status == 201
    code, _, err = await gpuop(
        "demo", "--kubeconfig", str(fresh_plane.admin_kubeconfig), "--headless"
    )

    assert code != 0
    assert "already has GPUClusterPolicy production" in err, err
    nodes = fresh_plane.call("GET", "/api/v1/nodes")["items"]
    assert nodes == []
