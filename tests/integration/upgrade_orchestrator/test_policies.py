"""The orchestrator's policy watcher against the simulated API server with the real CRD: an
invalid spec leaves no usable policy and a Valid=False condition naming the field; fixing it
makes the policy usable and Valid=True."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpuop.kube import client, customobjects
from gpuop.policy import specs
from gpuop.services.upgrade_orchestrator.policies import PolicyWatcher
from gpuop_sim import ApiServer
from tests.support.rollouts import install_crd

REPO = Path(__file__).resolve().parents[3]
NAME = "default"


def body(retry: dict[str, int]) -> dict[str, Any]:
    return {
        "apiVersion": specs.API_VERSION,
        "kind": specs.KIND,
        "metadata": {"name": NAME},
        "spec": {"driver": {"gpu": {"version": "580.1"}}, "upgradePolicy": {"retry": retry}},
    }


@pytest.fixture
async def bare(tmp_path: Path) -> AsyncIterator[client.Kube]:
    """An API server without the CRD."""
    async with ApiServer() as server:
        connected = await client.connect(server.write_kubeconfig(tmp_path / "kubeconfig"))
        async with connected:
            yield connected


@pytest.fixture
async def kube(bare: client.Kube) -> client.Kube:
    await install_crd(bare)
    return bare


async def valid_condition(kube: client.Kube, wanted: str) -> dict[str, Any]:
    async with asyncio.timeout(10):
        while True:
            policy = await customobjects.get(kube, customobjects.GPU_CLUSTER_POLICIES, NAME)
            conditions = (policy.get("status") or {}).get("conditions") or []
            for condition in conditions:
                if condition["type"] == "Valid" and condition["status"] == wanted:
                    return dict(condition)
            await asyncio.sleep(0.05)


async def test_an_invalid_policy_is_refused_with_the_field_named_until_fixed(
    kube: client.Kube,
) -> None:
    resource = customobjects.GPU_CLUSTER_POLICIES
    await kube.call(
        kube.custom_objects.create_cluster_custom_object,
        specs.GROUP, specs.VERSION, specs.PLURAL,
        body({"backoffSeconds": 600, "maxBackoffSeconds": 60}),
    )  # fmt: skip
    watcher = PolicyWatcher(kube)
    task = asyncio.create_task(watcher.run(), name="policy-watch")
    try:
        invalid = await valid_condition(kube, "False")
        assert "retry" in invalid["message"], invalid
        assert watcher.spec is None and watcher.in_force is None

        await customobjects.patch(
            kube, resource, NAME, {"spec": {"upgradePolicy": {"retry": {"maxBackoffSeconds": 900}}}}
        )
        await valid_condition(kube, "True")
        assert watcher.spec is not None
        assert watcher.spec.upgrade_policy.retry.max_backoff_seconds == 900
        assert watcher.in_force == watcher.spec
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_the_watcher_waits_for_the_crd_to_be_installed(bare: client.Kube) -> None:
    watcher = PolicyWatcher(bare)
    task = asyncio.create_task(watcher.run(retry_delay=0.1), name="policy-watch")
    try:
        await asyncio.sleep(0.3)
        assert not task.done()
        await install_crd(bare)
        await bare.call(
            bare.custom_objects.create_cluster_custom_object,
            specs.GROUP, specs.VERSION, specs.PLURAL, body({"maxBackoffSeconds": 900}),
        )  # fmt: skip
        await valid_condition(bare, "True")
        assert watcher.name == NAME
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
