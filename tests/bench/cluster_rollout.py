"""Rollout makespan on a three-server JetStream cluster, with no server lost and with one
SIGKILLed for good in the middle of the rollout, measured in one run.

Both rollouts run the whole stack as the end-to-end suite does (`tests/support/stack.py`:
the simulated cluster, every node agent and two orchestrator replicas as processes, every
stream and bucket with three replicas) on a fresh cluster each. The clock runs from
`gpuop upgrade start` until every node is upgrade-done. The server killed is the leader of
the event stream, once two nodes are done and others are in their maintenance window. The
ratio lost/none is the figure; absolute seconds on a shared 2-core machine are noise.

Run by `tests.bench.run_all` (`make bench`), or alone:
`.venv/bin/python -m tests.bench.cluster_rollout [--quick]` (8 nodes instead of 16). The
last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from gpuop.bus import NatsCluster
from gpuop.events.upgrade import UpgradeState
from gpuop.saga.actions import STATE_LABEL
from tests.support.rollouts import ROLLOUT_TIMEOUT, every_node_done, upgrade_policy
from tests.support.stack import stack

S = UpgradeState
IN_WINDOW = frozenset(S) - {S.UPGRADE_REQUIRED, S.UPGRADE_DONE, S.UPGRADE_FAILED}


async def makespan(nodes: int, lose_a_server: bool) -> float:
    """Seconds from the rollout's start until every node is done."""
    with tempfile.TemporaryDirectory(prefix="gpuop-bench-cluster-") as workdir:
        work = Path(workdir)
        cluster = NatsCluster(work / "nats")
        async with (
            cluster,
            stack(
                work, cluster.url, nodes_count=nodes, gpus=2, seed=50, nats_replicas=3
            ) as running,
        ):
            await running.start_replica()
            await running.start_replica()
            started = time.monotonic()
            await running.start_rollout(upgrade_policy(max_parallel=2))
            if lose_a_server:

                async def in_full_swing() -> bool:
                    labels = (await running.labels()).values()
                    states = [found.get(STATE_LABEL) for found in labels]
                    return states.count(S.UPGRADE_DONE) >= 2 and any(s in IN_WINDOW for s in states)

                await running.wait_until("nodes done and in their window", in_full_swing, 300)
                leader = await running.bus.stream_leader("GPUOP_EVENTS")
                await cluster.members[int(leader.rsplit("-", 1)[1])].kill()
            await running.wait_until(
                "every node upgrade-done", lambda: every_node_done(running), ROLLOUT_TIMEOUT
            )
            return time.monotonic() - started


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="8 nodes instead of 16")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="3 nodes, the rollout with a server lost only: does it still run",
    )
    args = parser.parse_args(argv)
    logging.getLogger("gpuop").setLevel(logging.ERROR)
    # the kill waits for two nodes done and one in its window: three nodes at the least
    nodes = 3 if args.smoke else 8 if args.quick else 16
    none_lost = None if args.smoke else asyncio.run(makespan(nodes, lose_a_server=False))
    if none_lost is not None:
        print(f"no server lost: {nodes} nodes in {none_lost:.1f} s", flush=True)
    one_lost = asyncio.run(makespan(nodes, lose_a_server=True))
    print(f"one server lost: {nodes} nodes in {one_lost:.1f} s", flush=True)
    result = {
        "benchmark": "cluster-rollout",
        "about": (
            "Rollout makespan on a three-server JetStream cluster (every stream and bucket R3),"
            " the whole stack as processes, maxParallelUpgrades 2: with no server lost, and"
            " with the event stream's leader SIGKILLed for good mid-rollout."
        ),
        "mode": "smoke" if args.smoke else "quick" if args.quick else "full",
        "nodes": nodes,
        "none_lost_seconds": None if none_lost is None else round(none_lost, 1),
        "one_lost_seconds": round(one_lost, 1),
        "ratio": None if none_lost is None else round(one_lost / none_lost, 3),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
