"""Two driver pools rolling at once through the runtime: each node gets its pool's driver,
the pools share the cluster's budget, and the log replays identically."""

from __future__ import annotations

from gpuop.events import driver as drv
from gpuop.events import upgrade as up
from gpuop.events.upgrade import UpgradeState
from gpuop.policy import validate_spec
from gpuop.saga import replaying
from tests.support.recording import record_rollout
from tests.support.sagas import GPU_NEW, SOURCE

NODES = ("train-1", "train-2", "infer-1", "infer-2", "plain-1")
POOLS = {"train-1": "train", "train-2": "train", "infer-1": "infer", "infer-2": "infer"}


async def test_two_pools_roll_at_once_with_their_own_drivers_and_replay_identically() -> None:
    spec = validate_spec(
        {
            "driver": {
                "gpu": {"version": GPU_NEW, "source": SOURCE},
                "pools": [
                    {"name": "train", "nodeSelector": "pool=train",
                     "gpu": {"version": "575.9", "source": SOURCE}},
                    {"name": "infer", "nodeSelector": "pool=infer",
                     "upgradePolicy": {"maxParallelUpgrades": 2}},
                ],
            },
            "upgradePolicy": {"maxParallelUpgrades": 1, "maxUnavailable": 4},
        }
    )  # fmt: skip
    lines = await record_rollout(spec, NODES, pools=POOLS)
    log = replaying.parse_log(lines)

    installed = {
        entry.envelope.node: entry.payload.version
        for entry in log
        if isinstance(entry.payload, drv.InstallDriver)
    }
    assert installed == {
        "train-1": "575.9", "train-2": "575.9",
        "infer-1": GPU_NEW, "infer-2": GPU_NEW, "plain-1": GPU_NEW,
    }  # fmt: skip
    first_pass = []  # the nodes admitted before any node finished
    for entry in log:
        if isinstance(entry.payload, up.NodeUpgradeStateChanged):
            if entry.payload.to_state is UpgradeState.UPGRADE_DONE:
                break
        elif isinstance(entry.payload, up.NodeAdmitted):
            first_pass.append(entry.envelope.node)
    # every pool at once: train one at a time (the cluster's maxParallelUpgrades), infer two
    # (its own), the default nodes one, four in all (the shared maxUnavailable)
    assert sorted(first_pass) == ["infer-1", "infer-2", "plain-1", "train-1"]
    comparison = replaying.compare(replaying.recorded_outputs(log), replaying.replay(log).outputs)
    assert comparison.identical, comparison.report()
