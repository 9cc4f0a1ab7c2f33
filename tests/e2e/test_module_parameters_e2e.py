"""Module parameters end to end (real processes, real nats-server, the simulated cluster:
`tests.support.stack`).

The policy asks for a new driver with parameters: the upgrade loads the modules with them.
A change of the parameters alone (the same version) reloads every node's modules with the
new ones through the upgrade saga. A change to a value the module's type refuses (past
`gpuop upgrade start`'s check: an edit of the policy) fails each node's load, and the
rollback loads the modules with the parameters they ran with before. A replay of the log
decides the same."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuop.bus import NatsServer
from gpuop.events.upgrade import SagaStarted, UpgradeState
from gpuop.host import modules, parameters
from gpuop.host.roots import HostRoot
from gpuop.kube import customobjects
from gpuop.saga import replaying
from gpuop.saga.actions import STATE_LABEL
from tests.support.rollouts import log_of
from tests.support.stack import NEW, Stack, stack

pytestmark = [pytest.mark.nats, pytest.mark.slow]

NODES, GPUS = 2, 1
TIMEOUT = 120.0
FIRST = {"nvidia": {"NVreg_EnableGpuFirmware": 1}}
SECOND = {"nvidia": {"NVreg_EnableGpuFirmware": 0}, "nvidia_uvm": {"uvm_disable_hmm": "Y"}}
REFUSED = {"nvidia": {"NVreg_EnableGpuFirmware": "off"}}
UPGRADE_POLICY = {
    "maxParallelUpgrades": 1,
    "maxUnavailable": 1,
    "drain": {"enable": True, "force": True, "deleteEmptyDir": True},
    "retry": {"maxAttempts": 1},
}


def shown(root: HostRoot) -> dict[str, dict[str, str]]:
    found = {m: parameters.shown(root, m) for m in ("nvidia", "nvidia_uvm")}
    return {m: p for m, p in found.items() if p}


def words(wanted: dict[str, dict[str, Any]]) -> dict[str, dict[str, str]]:
    return {m: {k: str(v) for k, v in p.items()} for m, p in wanted.items()}


async def set_parameters(running: Stack, wanted: dict[str, dict[str, Any] | None]) -> None:
    patch = {"spec": {"driver": {"gpu": {"kernelModuleParameters": wanted}}}}
    await customobjects.patch(running.kube, customobjects.GPU_CLUSTER_POLICIES, "default", patch)


async def settle(running: Stack, state: UpgradeState, wanted: dict[str, Any], what: str) -> None:
    async def settled() -> bool:
        labels = await running.labels()
        states = {found.get(STATE_LABEL) for found in labels.values()}
        return states == {state.value} and all(
            shown(root) == words(wanted) for root in running.roots.values()
        )

    await running.wait_until(what, settled, TIMEOUT)


@pytest.mark.timeout(400)
async def test_a_change_of_the_parameters_reloads_the_modules_and_a_refused_one_rolls_back(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    async with stack(tmp_path, nats_server.url, nodes_count=NODES, gpus=GPUS, seed=5) as running:
        await running.start_rollout(UPGRADE_POLICY)
        await set_parameters(running, FIRST)  # before any replica decides
        await running.start_replica()
        await settle(running, UpgradeState.UPGRADE_DONE, FIRST, "the upgrade with the first")
        assert all(modules.module_version(r, "nvidia") == NEW for r in running.roots.values())

        await set_parameters(running, {"nvidia": None, **SECOND})  # a merge patch: replaced
        await settle(running, UpgradeState.UPGRADE_DONE, SECOND, "the reload with the second")

        await set_parameters(running, {"nvidia_uvm": None, **REFUSED})
        await settle(running, UpgradeState.UPGRADE_FAILED, SECOND, "the rollback to the second")
        lines = await running.export()

    log = log_of(lines, tmp_path / "rollout.jsonl")
    comparison = replaying.compare(replaying.recorded_outputs(log), replaying.replay(log).outputs)
    assert comparison.identical, comparison.report()
    started: dict[str, list[SagaStarted]] = {}
    for record in log:
        if isinstance(record.payload, SagaStarted):
            started.setdefault(record.envelope.subject or "", []).append(record.payload)
    assert len(started) == NODES
    for sagas in started.values():
        assert [s.running_parameters for s in sagas] == [None, words(FIRST), words(SECOND)]
