"""A rollout on a three-server JetStream cluster (every stream and bucket with three replicas)
whose server leading each stream and bucket is SIGKILLed in turn, at its own point of the
rollout: the event log when a node is being cordoned, the command stream when a node reloads
its driver, the saga bucket when a node validates, the config bucket when a node is done, the
IPAM bucket when most are. Each killed server stays down until another leads what it led,
then starts again (so the next kill leaves a quorum).

Every node ends upgrade-done or upgrade-failed with its reason, no process exits, no node
is left waiting on nothing (the orchestrator's `Stalled` condition, where it was written, is
False at the end: a stall it reported was re-armed and ended), and the invariants hold on
the log. It runs in CI's slow stage: six nodes, a few minutes at most.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gpuop.bus import BusError, NatsCluster
from gpuop.events.upgrade import NodeUpgradeStateChanged, UpgradeState
from gpuop.policy import ConditionType, specs
from gpuop.saga.actions import STATE_LABEL
from tests.support import invariants
from tests.support.rollouts import ROLLOUT_TIMEOUT, log_of, upgrade_policy
from tests.support.stack import Stack, stack
from tests.support.waiting import eventually

pytestmark = [pytest.mark.nats, pytest.mark.slow]

S = UpgradeState
NODES = 6
PARALLEL = 3
PROGRESS = (
    S.UPGRADE_REQUIRED, S.CORDON_REQUIRED, S.WAIT_FOR_JOBS_REQUIRED, S.POD_DELETION_REQUIRED,
    S.DRAIN_REQUIRED, S.OPERANDS_PAUSE_REQUIRED, S.DRIVER_RELOAD_REQUIRED,
    S.VALIDATION_REQUIRED, S.UNCORDON_REQUIRED, S.UPGRADE_DONE,
)  # fmt: skip
"""A node's way through its saga, to say how far it got; a side path (reboot, rollback)
counts as the reload it replaces, a failure as the end."""
RANK = {state: rank for rank, state in enumerate(PROGRESS)} | {
    S.REBOOT_REQUIRED: PROGRESS.index(S.DRIVER_RELOAD_REQUIRED),
    S.ROLLBACK_REQUIRED: PROGRESS.index(S.DRIVER_RELOAD_REQUIRED),
    S.UPGRADE_FAILED: len(PROGRESS) - 1,
}
KILLS = (
    ("GPUOP_EVENTS", S.CORDON_REQUIRED, 1),
    ("GPUOP_COMMANDS", S.DRIVER_RELOAD_REQUIRED, 1),
    ("KV_gpuop_sagas", S.VALIDATION_REQUIRED, 1),
    ("KV_gpuop_config", S.UPGRADE_DONE, 1),
    ("KV_gpuop_ipam", S.UPGRADE_DONE, NODES - 2),
)
"""Whose leader is killed, once how many nodes got at least how far."""
OUTAGE = 3.0
"""Seconds a killed server stays down after another took over what it led."""


async def _states(running: Stack) -> list[UpgradeState | None]:
    labels = await running.labels()
    return [S(found[STATE_LABEL]) if STATE_LABEL in found else None for found in labels.values()]


async def _leader(running: Stack, stream: str, other_than: str = "") -> str:
    """`stream`'s leader once it has one other than `other_than` (a loaded cluster may take
    seconds to elect)."""

    async def elected() -> str | None:
        try:
            leader = await running.bus.stream_leader(stream)
        except BusError:
            return None  # between leaders
        return leader if leader and leader != other_than else None

    return await eventually(elected, timeout=60)


async def _kill_leader_of(cluster: NatsCluster, running: Stack, stream: str) -> None:
    leader = await _leader(running, stream)
    member = cluster.members[int(leader.rsplit("-", 1)[1])]  # members are gpuop-<index>
    await member.kill()
    await _leader(running, stream, other_than=leader)
    await asyncio.sleep(OUTAGE)
    await member.start()
    await cluster.wait_for_leader(timeout=60)


async def _every_node_ended(running: Stack) -> bool:
    return all(state in (S.UPGRADE_DONE, S.UPGRADE_FAILED) for state in await _states(running))


@pytest.mark.timeout(420)
async def test_a_rollout_ends_every_node_while_each_leader_is_killed_in_turn(
    tmp_path: Path,
) -> None:
    async with (
        NatsCluster(tmp_path / "nats") as cluster,
        stack(
            tmp_path, cluster.url, nodes_count=NODES, gpus=1, seed=43, nats_replicas=3
        ) as running,
    ):
        await running.start_replica()
        await running.start_replica()
        policy = upgrade_policy(max_parallel=PARALLEL) | {"maxUnavailable": PARALLEL}
        await running.start_rollout(policy)
        for stream, state, count in KILLS:

            async def reached(state: S = state, count: int = count) -> bool:
                ranks = [RANK[s] for s in await _states(running) if s is not None]
                return sum(rank >= RANK[state] for rank in ranks) >= count

            await running.wait_until(f"{count} node(s) at {state}", reached, ROLLOUT_TIMEOUT)
            await _kill_leader_of(cluster, running, stream)
        await running.wait_until("every node ended", lambda: _every_node_ended(running), 240)
        assert [name for name, p in running.replicas.items() if p.returncode is not None] == []
        assert [name for name, p in running.agents.items() if p.returncode is not None] == []
        lines = await running.export()
        policy = await running.kube.call(
            running.kube.custom_objects.get_cluster_custom_object,
            specs.GROUP, specs.VERSION, specs.PLURAL, "default",
        )  # fmt: skip

    # no node is left waiting on nothing: a stall reported on the way (the condition is written
    # once one was) was re-armed and has ended; it is printed for the record
    conditions = {c["type"]: c for c in policy["status"]["conditions"]}
    stalled = conditions.get(ConditionType.STALLED)
    if stalled is not None:
        print(f"a stall was reported during the rollout: {stalled}")
        assert stalled["status"] == "False", stalled
    log = log_of(lines, tmp_path / "rollout.jsonl")
    walk = invariants.check(log, PARALLEL)
    assert not walk.violations, "\n".join(walk.violations)
    for node in running.node_names:
        path = invariants.states(walk, node)
        assert path[-1] in (S.UPGRADE_DONE, S.UPGRADE_FAILED), (node, path)
        if path[-1] is S.UPGRADE_FAILED:
            failed = [
                e.payload
                for e in log
                if isinstance(e.payload, NodeUpgradeStateChanged)
                and e.envelope.subject == node
                and e.payload.to_state is S.UPGRADE_FAILED
            ]
            assert failed and all(f.reason for f in failed), (node, failed)
