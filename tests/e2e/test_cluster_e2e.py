"""Sixteen-node rollouts on a three-server JetStream cluster (every stream and bucket with
three replicas), through what a cluster must survive:

- one server SIGKILLed in the middle of the rollout, never to come back;
- the leaders of the event stream and of the saga bucket made to step down;
- one server cut off by a partition for 20 s (it runs in a network namespace joined by a
  veth pair whose link goes down), then back.

Each time every process survives, every node ends upgrade-done, no driver command is carried
out twice (the driver-managers' logs and the exported log), the invariants hold on the log,
and `gpuop replay` of it decides the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections import Counter
from pathlib import Path

import pytest

from gpuop.bus import NatsCluster
from gpuop.events import Command
from gpuop.events import driver as dm
from gpuop.events.upgrade import UpgradeState
from gpuop.saga import replaying
from gpuop.saga.actions import STATE_LABEL
from tests.support import invariants, partitions
from tests.support.rollouts import (
    ALLOWED_UNAVAILABLE,
    ROLLOUT_TIMEOUT,
    every_node_done,
    log_of,
    upgrade_policy,
)
from tests.support.stack import Stack, stack

pytestmark = [pytest.mark.nats, pytest.mark.slow]

S = UpgradeState
IN_WINDOW = frozenset(S) - {S.UPGRADE_REQUIRED, S.UPGRADE_DONE, S.UPGRADE_FAILED}
PARTITION = 20.0
"""Seconds the cut-off server stays cut off."""
CARRIED_OUT = re.compile(r"\b(install|unload|load|validate|rollback|reboot) (\S+): ")
"""A driver-manager's line for a command it carried out (a replayed answer says otherwise)."""


def exited(running: Stack) -> list[str]:
    processes = {**running.agents, **running.replicas}
    return sorted(name for name, process in processes.items() if process.returncode is not None)


def carried_out_twice(running: Stack) -> dict[str, int]:
    """Driver commands some driver-manager carried out more than once, by id."""
    counts: Counter[str] = Counter()
    for log in running.work.glob("driver-manager-*.log"):
        counts.update(m.group(2) for m in CARRIED_OUT.finditer(log.read_text(errors="replace")))
    return {command: n for command, n in counts.items() if n > 1}


async def _kill_a_server(cluster: NatsCluster, running: Stack) -> None:
    leader = await running.bus.stream_leader("GPUOP_EVENTS")
    await cluster.members[int(leader.rsplit("-", 1)[1])].kill()


async def _step_down(cluster: NatsCluster, running: Stack) -> None:
    for stream in ("GPUOP_EVENTS", "KV_gpuop_sagas"):
        await running.bus.step_down(stream)
        await asyncio.sleep(3.0)


FAULTS = {"server-killed": _kill_a_server, "leaders-moved": _step_down, "partition": None}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("fault", list(FAULTS))
async def test_a_sixteen_node_rollout_on_a_cluster_survives(fault: str, tmp_path: Path) -> None:
    with contextlib.ExitStack() as links:
        hosts = prefixes = None
        cut_off = None
        if fault == "partition":
            cut_off = links.enter_context(partitions.link(subnet=78))
            hosts = [cut_off.host_ip, cut_off.host_ip, cut_off.inner_ip]
            prefixes = [(), (), cut_off.prefix]
        cluster = NatsCluster(tmp_path / "nats", hosts=hosts, prefixes=prefixes)
        async with (
            cluster,
            stack(
                tmp_path, cluster.url, nodes_count=16, gpus=2, seed=40, nats_replicas=3
            ) as running,
        ):
            await running.start_replica()
            await running.start_replica()
            await running.start_rollout(upgrade_policy())

            async def in_full_swing() -> bool:
                labels = (await running.labels()).values()
                states = [found.get(STATE_LABEL) for found in labels]
                return states.count(S.UPGRADE_DONE) >= 2 and any(s in IN_WINDOW for s in states)

            await running.wait_until("nodes done and nodes in their window", in_full_swing, 240)
            if cut_off is not None:
                cut_off.cut()
                await asyncio.sleep(PARTITION)
                assert exited(running) == []
                cut_off.heal()
            else:
                await FAULTS[fault](cluster, running)  # type: ignore[misc]
            await running.wait_until(
                f"every node upgrade-done after {fault}",
                lambda: every_node_done(running),
                ROLLOUT_TIMEOUT,
            )
            assert exited(running) == []
            lines = await running.export()
            assert carried_out_twice(running) == {}

    log = log_of(lines, tmp_path / "rollout.jsonl")
    walk = invariants.check(log, ALLOWED_UNAVAILABLE)
    assert not walk.violations, "\n".join(walk.violations)
    assert set(walk.paths) == set(running.node_names)
    for node in running.node_names:
        path = invariants.states(walk, node)
        assert path[-1] is S.UPGRADE_DONE and S.UPGRADE_FAILED not in path, (node, path)
    asked = {e.envelope.id for e in log if isinstance(e.payload, Command)}
    answered = Counter(
        getattr(e.payload, "command_id", None)
        for e in log
        if isinstance(e.payload, dm.DriverResult)
    )
    driver_asked = {
        e.envelope.id
        for e in log
        if isinstance(e.payload, Command)
        and type(e.payload).__module__ == dm.__name__
        and not isinstance(e.payload, dm.RebootNode)  # answered by a new boot id
    }
    assert driver_asked <= asked
    assert sorted(c for c in driver_asked if answered[c] != 1) == []
    assert running.unclean_exits() == {}
    replayed = replaying.replay(log)
    comparison = replaying.compare(replaying.recorded_outputs(log), replayed.outputs)
    assert comparison.identical, comparison.report()
