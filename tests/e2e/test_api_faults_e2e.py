"""A rollout while the Kubernetes API server misbehaves, end to end (`stack`): from the
moment the rollout starts, the simulated API server answers 10% of the requests 500
InternalError and 10% 429 TooManyRequests before they run, and ends every watch after two
seconds on average. The orchestrator replicas campaign, lead, watch, drain and label through
it, and discovery labels the upgraded nodes through it; and:

- the rollout of 4 nodes (maxParallelUpgrades 2) completes, every node upgrade-done, with
  the invariants of every rollout holding on the recorded event log;
- no service process exits on its own;
- once the faults stop, every service answers ready, the new driver is labelled on every
  node and the policy's status says so, without anybody restarting anything.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gpuop.bus import NatsServer
from gpuop.kube import customobjects, errors
from gpuop.saga.actions import STATE_LABEL
from gpuop_sim.apiserver.faults import FaultPlan
from tests.support import invariants
from tests.support.rollouts import every_node_done, log_of
from tests.support.stack import DRIVER_LABEL, NEW, Stack, stack

pytestmark = [pytest.mark.nats, pytest.mark.slow]

NODES, GPUS = 4, 1
MAX_PARALLEL, ALLOWED_UNAVAILABLE = 2, 2
ROLLOUT_TIMEOUT = 150.0
HEALTH = re.compile(r"health endpoints on (http://[\d.]+:\d+)")


def turn_on(faults: FaultPlan) -> FaultPlan:
    """10% 500s, 10% 429s asking for 0.2 s, watches ended after 2 s on average."""
    faults.error_rate, faults.throttle_rate, faults.retry_after = 0.1, 0.1, 0.2
    faults.watch_drop_seconds = 2.0
    return faults


def upgrade_policy() -> dict[str, Any]:
    return {
        "maxParallelUpgrades": MAX_PARALLEL,
        "maxUnavailable": "50%",
        "podDeletion": {"force": True, "deleteEmptyDir": True, "timeoutSeconds": 60},
        "drain": {"enable": True, "force": True, "deleteEmptyDir": True, "timeoutSeconds": 60},
        "retry": {"maxAttempts": 3, "backoffSeconds": 2, "maxBackoffSeconds": 2},
    }


async def despite_faults(check: Awaitable[bool]) -> bool:
    """The test's own look at the cluster, which faults may refuse as well: not yet."""
    try:
        return await check
    except errors.KubeError as error:
        if not error.temporary:
            raise
        return False


def exited(running: Stack) -> dict[str, int | None]:
    """Processes of the stack that ended on their own (none should), with their codes."""
    processes = {**running.agents, **running.replicas}
    return {n: p.returncode for n, p in processes.items() if p.returncode is not None}


def health_endpoints(running: Stack) -> dict[str, str]:
    """Each service process's health server, as its log announced it."""
    found = {}
    for log in running.logs:
        announced = HEALTH.search(log.read_text(errors="replace"))
        if announced:
            found[log.stem] = announced.group(1)
    return found


async def not_ready(endpoints: dict[str, str]) -> dict[str, int]:
    """The services whose /readyz does not answer 200, with what it answered."""
    answers = {}
    async with aiohttp.ClientSession() as session:
        for name, url in endpoints.items():
            async with session.get(f"{url}/readyz") as response:
                answers[name] = response.status
    return {name: status for name, status in answers.items() if status != 200}


async def policy_ready(running: Stack) -> bool:
    policy = await customobjects.get(running.kube, customobjects.GPU_CLUSTER_POLICIES, "default")
    conditions = (policy.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


@pytest.mark.timeout(300)
async def test_a_rollout_completes_while_the_api_server_fails_and_every_service_recovers(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    faults = FaultPlan(seed=10)  # off while the stack starts and the test creates the policy
    async with stack(
        tmp_path, nats_server.url, nodes_count=NODES, gpus=GPUS, seed=4, faults=faults
    ) as running:
        await running.start_replica()
        await running.start_replica()  # a standby, campaigning through the faults
        await running.start_rollout(upgrade_policy())
        turn_on(faults)

        await running.wait_until(
            "every node upgrade-done",
            lambda: despite_faults(every_node_done(running)),
            ROLLOUT_TIMEOUT,
        )
        during = exited(running)
        statuses = [record.status for record in running.cluster.server.request_log]
        faults.off()

        async def new_driver_labelled() -> bool:
            labels = await running.labels()
            return all(found.get(DRIVER_LABEL) == NEW for found in labels.values())

        await running.wait_until("the new driver labels", new_driver_labelled, 30)
        await running.wait_until("the policy ready", lambda: policy_ready(running), 30)
        endpoints = health_endpoints(running)
        unready = await not_ready(endpoints)
        labels = await running.labels()
        lines = await running.export()
        after = exited(running)

    assert during == {} and after == {}
    assert statuses.count(500) > 0 and statuses.count(429) > 0
    assert faults.watches_dropped > 0
    assert {n: found.get(STATE_LABEL) for n, found in labels.items()} == dict.fromkeys(
        running.node_names, "upgrade-done"
    )
    assert len(endpoints) == len(running.agents) + len(running.replicas)
    assert unready == {}
    log = log_of(lines, tmp_path / "rollout.jsonl")
    walk = invariants.check(log, ALLOWED_UNAVAILABLE)
    assert not walk.violations, "\n".join(walk.violations)
    assert set(walk.paths) == set(running.node_names)
    assert running.unclean_exits() == {}
