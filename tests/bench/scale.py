"""Scale of the upgrade orchestrator: its memory with 5,000 node sagas, and the Kubernetes API
requests it makes per upgraded node.

Run by `tests.bench.run_all` (`make bench`), or alone:
`.venv/bin/python -m tests.bench.scale [--quick]`.

(a) memory, in a fresh subprocess so that nothing else is counted: the orchestrator's
    runtime as `tests/bench/rollout.py` drives it (`SagaStore` on `gpuop.bus.InMemoryBus`,
    `Runner`, `Outbox`, the intake consumer, admission passes, deadlines armed as the
    controller arms them) with 5,000 node sagas, instant fake node agents and a fake
    Kubernetes; a rollout runs through 1,000 of them (`--quick`) or all. Resident memory
    comes from /proc/self/status (VmRSS, and VmHWM for the peak); Python's own allocations
    from `tracemalloc`, in a second subprocess run alongside, because tracing slows the run
    and takes memory of its own. The in-memory bus keeps, in the orchestrator's process, what
    nats-server keeps in production (every message, every KV revision, the consumers'
    state); its size is measured object by object and taken out of `a_orchestrator_mb` (the
    figure held to the target) and `a_python_orchestrator_mb`.
(b) API requests: the real orchestrator (`leading.lead`: Lease, policy and node watches,
    the controller, the executor through the official client) against the simulated
    cluster (`gpuop_sim.SimCluster`, GPU workloads under PodDisruptionBudgets), on the
    in-memory bus, with fake node agents that answer every driver and operand command at
    once (`tests/integration/upgrade_orchestrator/fleets.py`). The policy waits for the
    training Job's pods, deletes GPU pods and drains. Every request the API server serves
    from the orchestrator's start until every node is upgrade-done is counted by verb,
    resource and scope (`SimCluster.requests`) and divided by the nodes upgraded;
    `b_pod_lists_unfiltered` counts LISTs and WATCHes of pods across all namespaces without
    a `spec.nodeName` field selector, the ones whose cost grows with the cluster.

(c) API requests on the real control plane (`tests.support.control_plane`, from `make
    cluster-tools`): the same orchestrator, fake agents and workloads on KWOK nodes, acting
    as the chart's ServiceAccount; kube-apiserver's audit log counts its requests by verb
    and resource. The policy does not wait for the training Job there: KWOK's Job pods do
    not finish.

Nothing is asserted here; tests/integration/upgrade_orchestrator/test_api_requests.py holds
the request count per node to a bound. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuop.bus import Buckets, ConsumerSpec, Delivery, InMemoryBus
from gpuop.events import ids, new_event, subjects
from gpuop.events import kube as observed
from gpuop.events.driver import Component
from gpuop.events.upgrade import SagaStarted, UpgradeState
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import Decision, KubeAction, NodeStatus
from gpuop.services.upgrade_orchestrator import intake
from gpuop.services.upgrade_orchestrator.acting import Outbox
from gpuop.services.upgrade_orchestrator.deadlines import DeadlineScheduler
from gpuop.services.upgrade_orchestrator.publishing import SOURCE
from gpuop.services.upgrade_orchestrator.running import Runner
from gpuop.services.upgrade_orchestrator.store import SagaStore
from tests.bench.rollout import RESYNC
from tests.support import fleets
from tests.support.clocks import StillClock
from tests.support.control_plane import ControlPlane, missing_tools
from tests.support.orchestrator import FakeKube, answers
from tests.support.sagas import BOOT_A, GPU_OLD, OFED_OLD, T0, policy, saga_for

ROOT = Path(__file__).resolve().parents[2]

AGENT_SOURCE = "/gpuop/bench-agent"
SAGAS = 5_000
SMOKE_SAGAS = 500
REAL_FIGURES = ("nodes", "seconds", "requests", "requests_per_node", "breakdown")
"""What (c) reports; a smoke run without the real control plane reports each as None."""
MAX_PARALLEL = 100
TARGET_MB = 200.0
TARGET_REQUESTS = 20.0
RUN_TIMEOUT = 900.0


class AnsweringKube(FakeKube):
    """`FakeKube` that keeps nothing: its record of every action would count as ours."""

    async def execute(self, node: str, action: KubeAction) -> observed.KubeEvent | None:
        outcome = await super().execute(node, action)
        self.done.clear()
        return outcome


def proc_status_mb(field: str) -> float:
    """A memory line of /proc/self/status (`VmRSS`, `VmHWM`), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def deep_size(root: object) -> int:
    """Bytes held by `root` and what it reaches through containers and the bus's own
    records (shared objects once); asyncio objects count for themselves only, so the event
    loop they point to is not counted."""
    seen: set[int] = set()
    stack = [root]
    total = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, type):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset):
            stack.extend(obj)
        elif type(obj).__module__.startswith("gpuop.bus") and hasattr(obj, "__dict__"):
            stack.append(vars(obj))
        elif type(obj).__module__.startswith("gpuop.bus") and hasattr(obj, "__slots__"):
            stack.extend(getattr(obj, slot) for slot in obj.__slots__ if hasattr(obj, slot))
    return total


def server_side_mb(bus: InMemoryBus) -> float:
    """What `bus` keeps on behalf of nats-server: streams, KV buckets, durable consumers."""
    held = (bus._streams, bus._buckets, bus._durables)
    return deep_size(held) / 2**20


async def hold_sagas(nodes: int, roll: int) -> dict[str, Any]:
    """(a): build `nodes` sagas in the runtime, roll `roll` of them; what memory it took."""
    gc.collect()
    baseline = proc_status_mb("VmRSS")
    bus = InMemoryBus()
    await bus.start()
    spec: GPUClusterPolicySpec = policy(max_parallel_upgrades=MAX_PARALLEL, max_unavailable="100%")
    clock = StillClock(T0)
    store = SagaStore(await bus.kv(Buckets.SAGAS))
    outbox = Outbox(bus, AnsweringKube(), clock=clock)
    deadlines = DeadlineScheduler(bus, clock=clock)
    names = [f"bench-node-{n:04d}" for n in range(nodes)]
    done: set[str] = set()
    changed = asyncio.Event()
    finished = asyncio.Event()

    def on_change(decision: Decision) -> None:
        changed.set()
        if decision.saga.state is UpgradeState.UPGRADE_DONE:
            done.add(decision.saga.node)
            if len(done) >= roll:
                finished.set()

    runner = Runner(bus, store, outbox, deadlines, lambda: spec, clock=clock, on_change=on_change)

    async def agent(delivery: Delivery) -> None:
        for event in answers(delivery.payload, delivery.envelope.id):
            envelope = new_event(event, node=delivery.envelope.node, source=AGENT_SOURCE,
                                 causationid=delivery.envelope.id, now=clock.now())  # fmt: skip
            await bus.publish(envelope)

    agents = await bus.consume(
        ConsumerSpec(durable="agents", subjects=(subjects.stream_filter(subjects.Kind.COMMAND),)),
        agent,
    )
    consumer = await intake.start(bus, runner)
    statuses = {name: NodeStatus() for name in names}
    running: dict[Component, str | None] = {Component.GPU: GPU_OLD, Component.OFED: OFED_OLD}
    try:
        await runner.record_policy(spec)
        for name in names:  # as the controller starts sagas
            saga = saga_for(spec, node=name)
            await store.create(saga)
            deadlines.schedule(saga)
            started = SagaStarted(
                rollout_id=saga.rollout_id, saga_id=saga.saga_id, running_versions=running,
                boot_id=BOOT_A, operands=saga.operands,
            )  # fmt: skip
            await bus.publish(
                new_event(started, node=name, source=SOURCE, now=T0,
                          id=ids.step(saga.saga_id, "started", 1))
            )  # fmt: skip
        gc.collect()
        built = proc_status_mb("VmRSS")
        built_tasks = len(asyncio.all_tasks())
        began = time.perf_counter()
        async with asyncio.timeout(RUN_TIMEOUT):
            while not finished.is_set():
                changed.clear()
                await runner.admit(statuses)
                waiter = asyncio.ensure_future(changed.wait())
                await asyncio.wait(
                    [waiter, asyncio.ensure_future(finished.wait())],
                    timeout=RESYNC,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                waiter.cancel()
        seconds = time.perf_counter() - began
        await outbox.idle()
        gc.collect()
        rolled = proc_status_mb("VmRSS")
        peak = proc_status_mb("VmHWM")
        tasks = len(asyncio.all_tasks())
        traced = tracemalloc.get_traced_memory() if tracemalloc.is_tracing() else (0, 0)
        overhead = tracemalloc.get_tracemalloc_memory() / 2**20 if tracemalloc.is_tracing() else 0
        server_side = server_side_mb(bus)
    finally:
        await consumer.stop()
        await agents.stop()
        await outbox.close()
        await deadlines.close()
        await bus.close()
    return {
        "sagas": nodes,
        "rolled": len(done),
        "seconds": round(seconds, 1),
        "baseline_rss_mb": round(baseline, 1),
        "built_rss_mb": round(built, 1),
        "rolled_rss_mb": round(rolled, 1),
        "peak_rss_mb": round(peak, 1),
        "server_side_mb": round(server_side, 1),
        "tasks_built": built_tasks,
        "tasks_rolled": tasks,
        "traced_current_mb": round(traced[0] / 2**20, 1),
        "traced_peak_mb": round(traced[1] / 2**20, 1),
        "tracemalloc_overhead_mb": round(overhead, 1),
    }


def memory_children(nodes: int, roll: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run (a) in two fresh interpreters at once, plain and under `tracemalloc`; the last
    line each prints is its result."""
    argv = [sys.executable, __file__, "--memory-child", str(nodes), str(roll)]
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}  # `tests` from a script's child
    runs = [
        subprocess.Popen(
            command, cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for command in (argv, [*argv, "--traced"])
    ]
    results = []
    for run in runs:
        out, err = run.communicate(timeout=RUN_TIMEOUT)
        if run.returncode != 0:
            raise RuntimeError(f"memory run failed:\n{err.decode()[-4000:]}")
        results.append(json.loads(out.decode().strip().splitlines()[-1]))
    return results[0], results[1]


async def count_requests(nodes: int, gpus: int) -> dict[str, Any]:
    """(b): a rollout over a simulated cluster; the API requests it cost."""
    with tempfile.TemporaryDirectory(prefix="gpuop-scale-") as tmp:
        run = await fleets.rollout(Path(tmp), nodes=nodes, gpus=gpus, timeout=RUN_TIMEOUT)
    requests = run.requests

    def per_node(*verbs: str, resource: str, scope: str | None = None) -> float:
        found = sum(
            count
            for kind, count in requests.items()
            if kind.verb in verbs and kind.resource == resource and scope in (None, kind.scope)
        )
        return round(found / run.upgraded, 2)

    total = sum(requests.values())
    return {
        "nodes": nodes,
        "upgraded": run.upgraded,
        "seconds": round(run.seconds, 1),
        "requests": total,
        "requests_per_node": round(total / run.upgraded, 2),
        "reads_per_node": round(
            sum(c for k, c in requests.items() if k.verb in ("GET", "LIST")) / run.upgraded, 2
        ),
        "node_patches_per_node": per_node("PATCH", resource="nodes"),
        "events_per_node": per_node("POST", resource="events"),
        "evictions_per_node": per_node("POST", resource="pods/eviction"),
        "pod_lists_all_namespaces_per_node": per_node("LIST", resource="pods", scope="cluster"),
        "pod_watches_per_node": per_node("WATCH", resource="pods"),
        "node_gets_per_node": per_node("GET", resource="nodes"),
        "status_patches_per_node": per_node("PATCH", resource="gpuclusterpolicies/status"),
        "lease_requests_per_node": per_node("GET", "POST", "PUT", "PATCH", resource="leases"),
        "pod_lists_unfiltered": run.unfiltered_pod_lists,
        "breakdown": [
            f"{kind.verb} {kind.resource} ({kind.scope}): {count}"
            for kind, count in requests.most_common()
        ],
    }


async def count_real_requests(nodes: int, gpus: int) -> dict[str, Any]:
    """(c): the same rollout on the real control plane, counted by kube-apiserver's audit
    log for the orchestrator's ServiceAccount alone."""
    with tempfile.TemporaryDirectory(prefix="gpuop-scale-real-") as tmp:
        work = Path(tmp)
        with ControlPlane(work / "control-plane") as plane:
            seconds, requests = await fleets.rollout_on_plane(
                work, plane, nodes=nodes, gpus=gpus, timeout=RUN_TIMEOUT
            )
    total = sum(requests.values())
    return {
        "nodes": nodes,
        "seconds": round(seconds, 1),
        "requests": total,
        "requests_per_node": round(total / nodes, 2),
        "breakdown": [
            f"{verb} {resource}: {count}" for (verb, resource), count in requests.most_common()
        ],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a shorter rollout, fewer nodes")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="500 sagas, 2 nodes, (c) only with the real control plane built: does it still run",
    )
    parser.add_argument("--memory-child", nargs=2, type=int, metavar=("SAGAS", "ROLL"),
                        help=argparse.SUPPRESS)  # fmt: skip
    parser.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.getLogger("gpuop").setLevel(logging.WARNING)
    if args.memory_child:
        if args.traced:
            tracemalloc.start()
        print(json.dumps(asyncio.run(hold_sagas(*args.memory_child))))
        return 0
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    sagas = SMOKE_SAGAS if args.smoke else SAGAS
    roll = 100 if args.smoke else 1_000 if args.quick else SAGAS
    nodes, gpus = (2, 8) if args.smoke else (8, 8) if args.quick else (40, 8)

    memory, traced = memory_children(sagas, roll)
    orchestrator_mb = memory["rolled_rss_mb"] - memory["server_side_mb"]
    print(f"(a) {sagas} sagas, {memory['rolled']} rolled in {memory['seconds']} s: RSS "
          f"{memory['rolled_rss_mb']} MB (peak {memory['peak_rss_mb']} MB), of which the "
          f"in-memory bus's server side {memory['server_side_mb']} MB; Python objects "
          f"{traced['traced_current_mb']} MB (peak {traced['traced_peak_mb']} MB)")  # fmt: skip
    requests = asyncio.run(count_requests(nodes, gpus))
    print(f"(b) {requests['upgraded']} nodes upgraded in {requests['seconds']} s: "
          f"{requests['requests_per_node']} requests per node")  # fmt: skip
    for line in requests["breakdown"]:
        print(f"    {line}")
    if args.smoke and missing_tools():
        # CI's slow stage runs smokes before it builds the control plane: (c) waits for it
        print(f"(c) left out: no real control plane ({', '.join(missing_tools())} missing)")
        real: dict[str, Any] = {key: None for key in REAL_FIGURES}
    else:
        real = asyncio.run(count_real_requests(nodes, gpus))
        print(f"(c) {real['nodes']} KWOK nodes upgraded on kube-apiserver in {real['seconds']} s:"
              f" {real['requests_per_node']} requests per node by its audit log")  # fmt: skip
        for line in real["breakdown"]:
            print(f"    {line}")
    met = orchestrator_mb <= TARGET_MB and requests["requests_per_node"] <= TARGET_REQUESTS
    met = met and requests["pod_lists_unfiltered"] == 0
    print(
        json.dumps(
            {
                "benchmark": "scale",
                "about": (
                    "(a) The orchestrator's runtime on the in-memory bus holding 5,000 node"
                    " sagas through a rollout with instant fake agents: resident memory, less"
                    " what the in-memory bus keeps for nats-server; (b) the real orchestrator"
                    " against the simulated cluster: Kubernetes API requests per upgraded node;"
                    " (c) the same on the real kube-apiserver with KWOK nodes, from its audit"
                    " log (the policy there does not wait for the training Job)."
                ),
                "mode": mode,
                "target": (
                    f"(a) a_orchestrator_mb <= {TARGET_MB:g}, (b) requests_per_node <="
                    f" {TARGET_REQUESTS:g} and no LIST of every pod"
                ),
                "target_met": met,
                "a_sagas": memory["sagas"],
                "a_rolled": memory["rolled"],
                "a_seconds": memory["seconds"],
                "a_orchestrator_mb": round(orchestrator_mb, 1),
                "a_rss_mb": memory["rolled_rss_mb"],
                "a_peak_rss_mb": memory["peak_rss_mb"],
                "a_rss_before_rollout_mb": memory["built_rss_mb"],
                "a_rss_baseline_mb": memory["baseline_rss_mb"],
                "a_bus_server_side_mb": memory["server_side_mb"],
                "a_python_mb": traced["traced_current_mb"],
                "a_python_peak_mb": traced["traced_peak_mb"],
                "a_python_orchestrator_mb": round(
                    traced["traced_current_mb"] - traced["server_side_mb"], 1
                ),
                "a_tasks": memory["tasks_rolled"],
                "b_nodes": requests["nodes"],
                "b_upgraded": requests["upgraded"],
                "b_seconds": requests["seconds"],
                "b_requests": requests["requests"],
                "requests_per_node": requests["requests_per_node"],
                "b_node_patches_per_node": requests["node_patches_per_node"],
                "b_events_per_node": requests["events_per_node"],
                "b_evictions_per_node": requests["evictions_per_node"],
                "b_reads_per_node": requests["reads_per_node"],
                "pod_lists_all_namespaces_per_node": requests["pod_lists_all_namespaces_per_node"],
                "b_pod_watches_per_node": requests["pod_watches_per_node"],
                "b_node_gets_per_node": requests["node_gets_per_node"],
                "b_status_patches_per_node": requests["status_patches_per_node"],
                "b_lease_requests_per_node": requests["lease_requests_per_node"],
                "b_pod_lists_unfiltered": requests["pod_lists_unfiltered"],
                "b_breakdown": requests["breakdown"],
                "c_nodes": real["nodes"],
                "c_seconds": real["seconds"],
                "c_requests": real["requests"],
                "c_requests_per_node_audit_log": real["requests_per_node"],
                "c_breakdown": real["breakdown"],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
