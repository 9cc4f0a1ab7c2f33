"""The rollout end-to-end scenarios and their checks, run on the simulated cluster
(tests/e2e/test_rollout_e2e.py, whose docstring tells them) and on the real control plane
(tests/e2e/test_rollout_real_cluster_e2e.py)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from gpuop.bus import NatsServer
from gpuop.events.upgrade import UpgradeState
from gpuop.host import system
from gpuop.policy import specs
from gpuop.saga import replaying
from gpuop.saga.actions import STATE_LABEL
from gpuop_sim.host.simkernel import SimKernel
from tests.support import invariants
from tests.support.control_plane import ControlPlane
from tests.support.rollouts import (
    ALLOWED_UNAVAILABLE,
    ROLLOUT_TIMEOUT,
    every_node_done,
    log_of,
    upgrade_policy,
)
from tests.support.stack import DRIVER_LABEL, NEW, set_package, stack

NODES, GPUS = 16, 2
IN_USE, DEFECTIVE = 5, 10
"""Indexes of the node whose module is held and of the node with the defective package."""
OTHER_KERNEL = "6.18.44-fc-v657-gpu-lts"
S = UpgradeState


async def roll_sixteen_nodes(
    nats_server: NatsServer, tmp_path: Path, plane: ControlPlane | None = None
) -> None:
    """The sixteen-node rollout and its checks, on the simulated cluster or on `plane`, the
    real control plane (tests/e2e/test_rollout_real_cluster_e2e.py)."""
    async with stack(
        tmp_path, nats_server.url, nodes_count=NODES, gpus=GPUS,
        kernels={DEFECTIVE: OTHER_KERNEL}, seed=16, plane=plane,
    ) as running:  # fmt: skip
        in_use, defective = running.node_names[IN_USE], running.node_names[DEFECTIVE]
        assert system.kernel_release(running.roots[defective]) == OTHER_KERNEL
        set_package(running.source, NEW, OTHER_KERNEL, defective=True)
        SimKernel(running.roots[in_use]).hold("nvidia", "cuda-app:4242")  # until a reboot

        await running.start_replica()
        await running.start_rollout(upgrade_policy())

        async def defective_failed() -> bool:
            labels = await running.labels()
            return labels[defective].get(STATE_LABEL) == S.UPGRADE_FAILED

        await running.wait_until("the defective node failing", defective_failed, ROLLOUT_TIMEOUT)
        set_package(running.source, NEW, OTHER_KERNEL)  # the vendor fixes the build
        await running.wait_until(
            "every node upgrade-done", lambda: every_node_done(running), ROLLOUT_TIMEOUT
        )

        async def new_driver_labelled() -> bool:
            labels = await running.labels()
            return all(found.get(DRIVER_LABEL) == NEW for found in labels.values())

        await running.wait_until("the new driver labels", new_driver_labelled, 30)
        lines = await running.export()

    log = log_of(lines, tmp_path / "rollout.jsonl")
    walk = invariants.check(log, ALLOWED_UNAVAILABLE)
    assert not walk.violations, "\n".join(walk.violations)
    assert set(walk.paths) == set(running.node_names)
    assert walk.most_cordoned == ALLOWED_UNAVAILABLE  # the limit was used, not just kept

    rebooted = invariants.states(walk, in_use)
    assert S.REBOOT_REQUIRED in rebooted and rebooted[-1] is S.UPGRADE_DONE, rebooted
    failed_first = [c for c in walk.paths[defective] if c.to_state is S.UPGRADE_FAILED]
    assert [c.attempt for c in failed_first] == [1], walk.paths[defective]
    assert "0 devices" in failed_first[0].reason, failed_first[0].reason
    assert walk.paths[defective][-1].to_state is S.UPGRADE_DONE
    assert walk.paths[defective][-1].attempt == 2
    for node in running.node_names:
        path = invariants.states(walk, node)
        assert path[-1] is S.UPGRADE_DONE, (node, path)
        assert S.DRAIN_REQUIRED in path, (node, path)
        if node not in (in_use, defective):
            assert S.REBOOT_REQUIRED not in path and S.UPGRADE_FAILED not in path, (node, path)
    assert running.unclean_exits() == {}

    # the log replays to the same decisions; a different policy decides differently
    replayed = replaying.replay(log)
    comparison = replaying.compare(replaying.recorded_outputs(log), replayed.outputs)
    assert comparison.identical, comparison.report()
    assert replayed.nodes == set(running.node_names)
    assert comparison.transitions == sum(len(path) for path in walk.paths.values())
    spec = {
        "driver": {"gpu": {"version": NEW, "source": str(running.source)}},
        "upgradePolicy": {**upgrade_policy(), "rebootOnUnloadFailure": False},
    }
    changed = specs.GPUClusterPolicySpec.model_validate(spec)
    diverged = replaying.compare(
        replaying.recorded_outputs(log), replaying.replay(log, changed).outputs
    )
    assert not diverged.identical
    assert in_use in diverged.divergences, diverged.report()


KILLS = 20
CHAOS_PARALLEL = 1
CHAOS_INSTALL = "install_pause_seconds: 3\n"
"""One node at a time, each install 3 s longer: every kill costs a lease expiry (3 s) and a
takeover, and twenty of them must come before the rollout ends, with room on a fast machine."""
REAL_DRAIN_SECONDS = 240
"""The chaos rollout's drain deadline on the real control plane (see its use)."""
LEADERSHIP = (0.0, 0.3)
"""Seconds a leader lives before its SIGKILL, drawn uniformly: short enough that twenty
takeovers (each waits out the dead leader's Lease) come well before the rollout could end."""


async def roll_through_leader_kills(
    nats_server: NatsServer, tmp_path: Path, plane: ControlPlane | None = None
) -> None:
    """The chaos rollout and its checks, on the simulated cluster or on `plane`."""
    seed = random.randrange(1 << 30)
    chance = random.Random(seed)
    slower = dict.fromkeys(range(NODES), CHAOS_INSTALL)
    async with stack(
        tmp_path, nats_server.url, nodes_count=NODES, gpus=GPUS, seed=20,
        driver_manager=slower, plane=plane,
    ) as running:  # fmt: skip
        await running.start_replica()
        await running.start_replica()
        policy = upgrade_policy(CHAOS_PARALLEL)
        if plane is not None:
            # Twenty takeovers leave the fleet leaderless for about 70 s in all (each waits
            # out a 3 s Lease), and on a real cluster a drain needs leader time across
            # several PDB rounds (evict, 429, the replacement scheduled and Ready, the
            # disruption controller's recount): all of that gap may fall in one node's drain.
            # The durable 60 s drain deadline then fails a node that nothing is wrong with.
            for step in ("drain", "podDeletion"):
                policy[step]["timeoutSeconds"] = REAL_DRAIN_SECONDS
        await running.start_rollout(policy)

        async def someone_leads() -> bool:
            return running.leader() is not None

        kills = 0
        while kills < KILLS and not await every_node_done(running):
            await running.wait_until("a replica leading", someone_leads, 30)
            await asyncio.sleep(chance.uniform(*LEADERSHIP))  # a random moment of its leadership
            leader = running.leader()
            if leader is None:
                continue
            running.kill_replica(leader)
            kills += 1
            await running.start_replica()  # two replicas again
        await running.wait_until(
            f"every node upgrade-done after {kills} kills (seed {seed})",
            lambda: every_node_done(running),
            ROLLOUT_TIMEOUT,
        )
        lines = await running.export()

    assert kills == KILLS, f"the rollout ended after {kills} kills; make it longer (seed {seed})"
    log = log_of(lines, tmp_path / "rollout.jsonl")
    walk = invariants.check(log, CHAOS_PARALLEL)
    assert not walk.violations, f"seed {seed}:\n" + "\n".join(walk.violations)
    assert set(walk.paths) == set(running.node_names)
    for node in running.node_names:
        path = invariants.states(walk, node)
        assert path[-1] is S.UPGRADE_DONE and S.UPGRADE_FAILED not in path, (node, path)
    assert running.unclean_exits() == {}
    replayed = replaying.replay(log)
    comparison = replaying.compare(replaying.recorded_outputs(log), replayed.outputs)
    assert comparison.identical, f"seed {seed}:\n{comparison.report()}"
