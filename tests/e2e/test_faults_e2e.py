"""Rollouts through faults of the processes around the orchestrator, end to end (`stack`),
checked on the recorded event log (`invariants`):

- the nats-server stops for ten seconds in the middle of a 16-node rollout and comes back on
  the same store: every service rides it out, the rollout completes, and no event is missing
  from the log (every node's state changes follow on from each other, every driver command
  has its answer);
- node agents die mid-step: the driver-manager SIGKILLed while an install is unpacked but not
  yet in place, and while a new driver is loaded but not yet reported; the device plugin and
  telemetry SIGKILLed around their pause; each is started again, each step resumes or is
  retried, and nothing is installed twice.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from gpuop.bus import NatsServer
from gpuop.events import Command
from gpuop.events import driver as dm
from gpuop.events.upgrade import UpgradeState
from gpuop.host import packages, system
from gpuop.saga import replaying
from gpuop.saga.actions import STATE_LABEL
from gpuop.services.driver_manager.installing import STAGING
from tests.support import invariants
from tests.support.rollouts import (
    ALLOWED_UNAVAILABLE,
    ROLLOUT_TIMEOUT,
    every_node_done,
    log_of,
    upgrade_policy,
)
from tests.support.stack import NEW, Stack, stack

pytestmark = [pytest.mark.nats, pytest.mark.slow]

S = UpgradeState
OUTAGE = 10.0
"""Seconds the nats-server is down."""
IN_WINDOW = frozenset(S) - {S.UPGRADE_REQUIRED, S.UPGRADE_DONE, S.UPGRADE_FAILED}


def still_running(running: Stack) -> list[str]:
    """Processes of the stack that exited on their own (none should)."""
    processes = {**running.agents, **running.replicas}
    return sorted(name for name, process in processes.items() if process.returncode is not None)


def unanswered(log: list[replaying.Recorded]) -> list[str]:
    """Driver commands in the log with no answer naming their id."""
    asked = {
        entry.envelope.id: entry.envelope.subject
        for entry in log
        if isinstance(entry.payload, Command) and type(entry.payload).__module__ == dm.__name__
    }
    answered = {getattr(entry.payload, "command_id", None) for entry in log}
    return sorted(f"{node}: {id}" for id, node in asked.items() if id not in answered)


@pytest.mark.timeout(480)
async def test_a_sixteen_node_rollout_rides_out_ten_seconds_without_nats(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    async with stack(tmp_path, nats_server.url, nodes_count=16, gpus=2, seed=30) as running:
        await running.start_replica()
        await running.start_replica()
        await running.start_rollout(upgrade_policy())

        async def in_full_swing() -> bool:
            states = [found.get(STATE_LABEL) for found in (await running.labels()).values()]
            return states.count(S.UPGRADE_DONE) >= 2 and any(s in IN_WINDOW for s in states)

        await running.wait_until("nodes done and nodes in their window", in_full_swing, 180)
        await nats_server.stop()
        await asyncio.sleep(OUTAGE)
        assert still_running(running) == []  # nobody gave up while the bus was gone
        await nats_server.start()
        await running.wait_until(
            "every node upgrade-done after the outage",
            lambda: every_node_done(running),
            ROLLOUT_TIMEOUT,
        )
        assert still_running(running) == []
        lines = await running.export()

    log = log_of(lines, tmp_path / "rollout.jsonl")
    walk = invariants.check(log, ALLOWED_UNAVAILABLE)
    assert not walk.violations, "\n".join(walk.violations)
    assert set(walk.paths) == set(running.node_names)
    for node in running.node_names:
        path = invariants.states(walk, node)
        assert path[-1] is S.UPGRADE_DONE and S.UPGRADE_FAILED not in path, (node, path)
    assert unanswered(log) == []
    assert running.unclean_exits() == {}
    replayed = replaying.replay(log)
    comparison = replaying.compare(replaying.recorded_outputs(log), replayed.outputs)
    assert comparison.identical, comparison.report()


INSTALL_KILLED, LOAD_KILLED, PLUGIN_KILLED, TELEMETRY_KILLED = 0, 1, 2, 3
PAUSE = "install_pause_seconds: 2\nack_wait_seconds: 2\n"
LOAD_PAUSE = "load_pause_seconds: 2\nack_wait_seconds: 2\n"


@pytest.mark.timeout(360)
async def test_node_agents_killed_mid_step_resume_and_install_once(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    faults = {INSTALL_KILLED: PAUSE, LOAD_KILLED: LOAD_PAUSE}
    async with stack(
        tmp_path, nats_server.url, nodes_count=4, gpus=2, seed=31, operands=True,
        driver_manager=faults,
    ) as running:  # fmt: skip
        names = running.node_names
        await running.start_replica()
        await running.start_rollout({**upgrade_policy(max_parallel=2), "maxUnavailable": "50%"})

        def said(agent: str, words: str) -> Callable[[], Awaitable[bool]]:
            async def check() -> bool:
                return words in (running.work / f"{agent}.log").read_text(errors="replace")

            return check

        async def kill_and_restart(
            agent: str, moment: Callable[[], Awaitable[bool]], what: str
        ) -> None:
            await running.wait_until(what, moment, 180)
            await running.kill_agent(agent)
            await asyncio.sleep(0.5)
            await running.restart_agent(agent)

        await asyncio.gather(
            kill_and_restart(
                f"driver-manager-{names[INSTALL_KILLED]}",
                said(f"driver-manager-{names[INSTALL_KILLED]}", "before the rename"),
                "an install unpacked and not yet renamed",
            ),
            kill_and_restart(
                f"driver-manager-{names[LOAD_KILLED]}",
                said(f"driver-manager-{names[LOAD_KILLED]}", "after the load"),
                "a load done and not yet answered",
            ),
            kill_and_restart(
                f"device-plugin-{names[PLUGIN_KILLED]}",
                # its log, not the node's label: the reload can pass in a fraction of a second
                said(f"device-plugin-{names[PLUGIN_KILLED]}", "pausing gpu"),
                "the device plugin paused for the reload",
            ),
            kill_and_restart(
                f"telemetry-{names[TELEMETRY_KILLED]}",
                said(f"telemetry-{names[TELEMETRY_KILLED]}", "pausing"),
                "telemetry paused for the reload",
            ),
        )
        await running.wait_until(
            "every node upgrade-done", lambda: every_node_done(running), ROLLOUT_TIMEOUT
        )
        assert still_running(running) == []
        lines = await running.export()

    log = log_of(lines, tmp_path / "rollout.jsonl")
    walk = invariants.check(log, 2)
    assert not walk.violations, "\n".join(walk.violations)
    for node in names:
        path = invariants.states(walk, node)
        assert path[-1] is S.UPGRADE_DONE and S.UPGRADE_FAILED not in path, (node, path)
    # nothing installed twice: one answer per node, the killed install finished by its rerun
    installs = Counter(e.envelope.subject for e in log if isinstance(e.payload, dm.DriverInstalled))
    assert installs == {node: 1 for node in names}, installs
    killed_log = (tmp_path / f"driver-manager-{names[INSTALL_KILLED]}.log").read_text()
    assert killed_log.count("before the rename") == 2  # killed there once, then finished
    for node in names:
        root = running.roots[node]
        kernel = system.kernel_release(root) or ""
        assert NEW in packages.installed_versions(root, kernel, "gpu")
        assert not any(root.join(STAGING).iterdir()), f"staging debris on {node}"
    loaded_log = (tmp_path / f"driver-manager-{names[LOAD_KILLED]}.log").read_text()
    assert loaded_log.count("after the load") == 2
    assert unanswered(log) == []
    assert running.unclean_exits() == {}
