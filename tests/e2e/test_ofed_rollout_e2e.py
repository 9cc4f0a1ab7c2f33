"""A combined GPU + OFED rollout end to end (real processes, real nats-server, the simulated
cluster): both drivers of a node are reloaded in one maintenance window, and a node whose
ConnectX port carries the default route is protected: its OFED unload fails with the
management-interface reason, the GPU driver it already unloaded is rolled back, and the node
ends upgrade-failed with that reason, uncordoned; every other node is done.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuop.bus import NatsServer
from gpuop.events import driver as dm
from gpuop.events.upgrade import UpgradeState
from gpuop.host.roots import HostRoot
from gpuop.kube import nodes
from gpuop.saga import replaying
from gpuop.saga.actions import STATE_LABEL
from gpuop_sim.cluster import nics
from tests.support import invariants
from tests.support.rollouts import log_of
from tests.support.stack import OFED_NEW, stack

pytestmark = [pytest.mark.nats, pytest.mark.slow]

NODES, GPUS = 3, 1
PROTECTED = 1
"""Index of the node whose ConnectX port carries the default route."""
S = UpgradeState
ROLLOUT_TIMEOUT = 180.0


def with_connectx(index: int, root: HostRoot) -> None:
    nics.add_connectx(root, "0000:41:00.0", "eth1")
    if index == PROTECTED:
        nics.route_default_via(root, "eth1")


def upgrade_policy() -> dict[str, Any]:
    return {
        "maxParallelUpgrades": 0,
        "maxUnavailable": "100%",
        "podDeletion": {"force": True, "deleteEmptyDir": True, "timeoutSeconds": 60},
        "drain": {"enable": True, "force": True, "deleteEmptyDir": True, "timeoutSeconds": 60},
        "retry": {"maxAttempts": 1},
    }


@pytest.mark.timeout(300)
async def test_gpu_and_ofed_roll_together_and_the_management_nic_is_protected(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    async with stack(
        tmp_path, nats_server.url, nodes_count=NODES, gpus=GPUS, ofed=True,
        prepare=with_connectx, seed=8,
    ) as running:  # fmt: skip
        protected = running.node_names[PROTECTED]
        await running.start_replica()
        await running.start_rollout(upgrade_policy(), ofed=OFED_NEW)

        async def settled() -> bool:
            labels = await running.labels()
            wanted = {n: S.UPGRADE_DONE.value for n in running.node_names}
            wanted[protected] = S.UPGRADE_FAILED.value
            return {n: found.get(STATE_LABEL) for n, found in labels.items()} == wanted

        await running.wait_until("the rollout settling", settled, ROLLOUT_TIMEOUT)
        node = await nodes.get(running.kube, protected)
        lines = await running.export()

    log = log_of(lines, tmp_path / "rollout.jsonl")
    walk = invariants.check(log, NODES)
    assert not walk.violations, "\n".join(walk.violations)
    refused = [
        r.payload
        for r in log
        if isinstance(r.payload, dm.DriverUnloadFailed) and r.envelope.subject == protected
    ]
    assert [(f.component, f.reason) for f in refused] == [
        (dm.Component.OFED, dm.UnloadFailureReason.MANAGEMENT_INTERFACE)
    ]
    assert "eth1" in refused[0].message
    failed = walk.paths[protected][-1]
    assert failed.to_state is S.UPGRADE_FAILED and "default route" in failed.reason, failed
    assert not node["spec"].get("unschedulable")  # rolled back, validated, uncordoned
    for name in running.node_names:
        if name == protected:
            continue
        loaded = [
            (r.payload.component, r.payload.version)
            for r in log
            if isinstance(r.payload, dm.DriverLoaded) and r.envelope.subject == name
        ]
        assert sorted(loaded) == sorted([(dm.Component.GPU, "580.200.01"), (dm.Component.OFED,
                                         OFED_NEW)]), (name, loaded)  # fmt: skip
    replayed = replaying.replay(log)
    comparison = replaying.compare(replaying.recorded_outputs(log), replayed.outputs)
    assert comparison.identical, comparison.report()
    assert running.unclean_exits() == {}
