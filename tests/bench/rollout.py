"""Rollout speed of the upgrade orchestrator's runtime with simulated nodes.

Run by `tests.bench.run_all` (`make bench`), or alone:
`.venv/bin/python -m tests.bench.rollout [--quick]`.

The real runtime (`Runner`, `Outbox`, `DeadlineScheduler`, `SagaStore`, the intake
consumer) runs on `gpuop.bus.InMemoryBus`, with a fake Kubernetes that succeeds every action
at once (as in tests/unit/upgrade_orchestrator) and fake node agents that answer every
command, at once or after a fixed simulated duration. Admission runs the way the
controller runs it: after every decision that changed a saga (and at least every
`RESYNC` seconds). Four figures:

(a) throughput: 1,000 nodes, instant steps, maxParallelUpgrades 100; wall seconds until
    every saga is upgrade-done, and node upgrades per second;
(b) scheduling overhead: every agent command takes a fixed simulated time (`STEP_SECONDS`);
    the makespan over the ideal makespan (waves x per-node duration) is `makespan_ratio`,
    and what each step of a wave cost beyond its simulated time is `b_overhead_ms_per_step`;
(c) reaction latency: wall time from publishing a step-completed event (`DriverLoaded`,
    `DriverUnloaded`, `DriverInstalled`) to the publish of the next command for that node,
    p50 and p99, measured during (b);
(d) admission cost: a store of 1,000 and of 5,000 sagas, nearly all upgrade-done (a slot's
    worth under way, as many waiting), and `ADMISSION_PASSES` passes timed in CPU per
    pass: `Runner.admit` on the store's index, and, for comparison, the full read that
    admission made before the index (list and read every saga from KV, plan over all of
    them). The index's pass should cost about the same at both sizes.

The deadlines are armed as in the service but on a clock that never reaches them, so no
step times out. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpuop.bus import Buckets, ConsumerSpec, Delivery, InMemoryBus, PublishAck
from gpuop.events import Envelope, ids, new_event, subjects
from gpuop.events import driver as dm
from gpuop.events.driver import Component
from gpuop.events.upgrade import SagaStarted, UpgradeState
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import Decision, NodeStatus, admission
from gpuop.services.upgrade_orchestrator import intake
from gpuop.services.upgrade_orchestrator.acting import Outbox
from gpuop.services.upgrade_orchestrator.deadlines import DeadlineScheduler
from gpuop.services.upgrade_orchestrator.publishing import SOURCE
from gpuop.services.upgrade_orchestrator.running import Runner
from gpuop.services.upgrade_orchestrator.store import SagaStore
from tests.support.clocks import StillClock
from tests.support.orchestrator import FakeKube, answers
from tests.support.sagas import BOOT_A, GPU_OLD, OFED_OLD, T0, policy, saga_for

ROOT = Path(__file__).resolve().parents[2]

AGENT_SOURCE = "/gpuop/bench-agent"
RESYNC = 0.5
"""Seconds between admission passes when nothing changed (the controller's resync)."""
RUN_TIMEOUT = 600.0
STEP_SECONDS = 1.0
"""(b)'s simulated agent step. Real steps take seconds to minutes (a driver install tens of
seconds); the orchestrator's own cost per step does not grow with the step, so it is also
reported in absolute terms as `b_overhead_ms_per_step`."""
TARGET_SECONDS = 60.0
TARGET_RATIO = 1.10
TARGET_P99_MS = 100.0
ADMISSION_SIZES = (1_000, 5_000)
SMOKE_ADMISSION_SIZES = (100, 500)
"""(d): sagas in the store."""
ADMISSION_PASSES = 200
"""(d): passes timed per size and path (fewer with `--quick`)."""
ADMISSION_PARALLEL = 100
"""(d): maxParallelUpgrades; as many sagas are under way, and as many wait."""
COMPLETIONS = (dm.DriverLoaded, dm.DriverUnloaded, dm.DriverInstalled)
"""Agent answers after which the core's next step is another agent command."""


@dataclass
class Result:
    nodes: int
    max_parallel: int
    step_seconds: float
    seconds: float
    commands_per_node: float
    """Commands per node that the saga waits on (the steps that take `step_seconds`)."""
    cpu_seconds: float
    admission_passes: int
    latencies: list[float] = field(default_factory=list)

    @property
    def waves(self) -> int:
        return math.ceil(self.nodes / self.max_parallel)

    @property
    def ideal(self) -> float:
        return self.waves * self.commands_per_node * self.step_seconds


async def rollout(nodes: int, max_parallel: int, step_seconds: float) -> Result:
    """Roll a GPU driver upgrade over `nodes` simulated nodes until every one is done."""
    bus = InMemoryBus()
    await bus.start()
    spec: GPUClusterPolicySpec = policy(max_parallel_upgrades=max_parallel, max_unavailable="100%")
    clock = StillClock(T0)
    store = SagaStore(await bus.kv(Buckets.SAGAS))
    outbox = Outbox(bus, FakeKube(), clock=clock)
    deadlines = DeadlineScheduler(bus, clock=clock)
    names = [f"bench-node-{n:04d}" for n in range(nodes)]
    done: set[str] = set()
    changed = asyncio.Event()
    finished = asyncio.Event()
    completed: dict[str, float] = {}
    latencies: list[float] = []
    commands: dict[str, int] = {}

    def on_change(decision: Decision) -> None:
        changed.set()
        if decision.saga.state is UpgradeState.UPGRADE_DONE:
            done.add(decision.saga.node)
            if len(done) == nodes:
                finished.set()

    runner = Runner(bus, store, outbox, deadlines, lambda: spec, clock=clock, on_change=on_change)

    # figure (c): observe every publish; a command for a node ends the wait that the node's
    # last step completion started
    publish = bus.publish

    async def observed(envelope: Envelope, *, republish: bool = False) -> PublishAck:
        if envelope.source == SOURCE and _is_command(envelope):
            at = time.perf_counter()
            started = completed.pop(envelope.node, None)
            if started is not None:
                latencies.append(at - started)
        return await publish(envelope, republish=republish)

    bus.publish = observed  # type: ignore[method-assign]

    tasks: set[asyncio.Task[None]] = set()

    async def report(delivery: Delivery) -> None:
        events = answers(delivery.payload, delivery.envelope.id)
        if not events:
            return
        node = delivery.envelope.node
        commands[node] = commands.get(node, 0) + 1
        if step_seconds:
            await asyncio.sleep(step_seconds)
        for event in events:
            envelope = new_event(event, node=delivery.envelope.node, source=AGENT_SOURCE,
                                 causationid=delivery.envelope.id, now=clock.now())  # fmt: skip
            if isinstance(event, COMPLETIONS):
                completed[delivery.envelope.node] = time.perf_counter()
            await bus.publish(envelope)

    async def agent(delivery: Delivery) -> None:
        if not step_seconds:
            await report(delivery)
            return
        task = asyncio.create_task(report(delivery))  # a node works on its own
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    agents = await bus.consume(
        ConsumerSpec(durable="agents", subjects=(subjects.stream_filter(subjects.Kind.COMMAND),)),
        agent,
    )
    consumer = await intake.start(bus, runner)
    following = asyncio.create_task(store.follow(), name="saga-watch")  # as the controller
    statuses = {name: NodeStatus() for name in names}
    running: dict[Component, str | None] = {Component.GPU: GPU_OLD, Component.OFED: OFED_OLD}
    try:
        await runner.record_policy(spec)
        for name in names:  # as the controller starts sagas: saga in KV, then SagaStarted
            saga = saga_for(spec, node=name)
            await store.create(saga)
            started = SagaStarted(
                rollout_id=saga.rollout_id, saga_id=saga.saga_id, running_versions=running,
                boot_id=BOOT_A, operands=saga.operands,
            )  # fmt: skip
            await bus.publish(
                new_event(started, node=name, source=SOURCE, now=T0,
                          id=ids.step(saga.saga_id, "started", 1))
            )  # fmt: skip
        gc.collect()
        passes = 0
        cpu_began = time.process_time()
        began = time.perf_counter()
        async with asyncio.timeout(RUN_TIMEOUT):
            while not finished.is_set():
                changed.clear()
                await runner.admit(statuses)
                passes += 1
                waiter = asyncio.ensure_future(changed.wait())
                await asyncio.wait(
                    [waiter, asyncio.ensure_future(finished.wait())],
                    timeout=RESYNC,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                waiter.cancel()
        seconds = time.perf_counter() - began
        cpu_seconds = time.process_time() - cpu_began
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)
        await consumer.stop()
        await agents.stop()
        for task in tasks:
            task.cancel()
        await outbox.close()
        await deadlines.close()
        await bus.close()
    per_node = sum(commands.values()) / max(len(commands), 1)
    return Result(
        nodes, max_parallel, step_seconds, seconds, per_node, cpu_seconds, passes, latencies
    )


@dataclass
class AdmissionCost:
    sagas: int
    passes: int
    index_cpu_seconds: float
    full_read_cpu_seconds: float

    @property
    def index_ms_per_pass(self) -> float:
        return self.index_cpu_seconds / self.passes * 1e3

    @property
    def full_read_ms_per_pass(self) -> float:
        return self.full_read_cpu_seconds / self.passes * 1e3


async def admission_cost(sagas: int, passes: int) -> AdmissionCost:
    """Time admission passes over a store of `sagas` sagas, nearly all done (figure (d))."""
    bus = InMemoryBus()
    await bus.start()
    spec = policy(max_parallel_upgrades=ADMISSION_PARALLEL, max_unavailable="100%")
    clock = StillClock(T0)
    store = SagaStore(await bus.kv(Buckets.SAGAS))
    outbox = Outbox(bus, FakeKube(), clock=clock)
    deadlines = DeadlineScheduler(bus, clock=clock)
    runner = Runner(bus, store, outbox, deadlines, lambda: spec, clock=clock)
    names = [f"bench-node-{n:04d}" for n in range(sagas)]
    try:
        for n, name in enumerate(names):
            saga = saga_for(spec, node=name)
            if n < ADMISSION_PARALLEL:  # under way: every slot taken, so nothing is admitted
                saga = saga.model_copy(update={"state": UpgradeState.DRAIN_REQUIRED,
                                               "cordoned": True})  # fmt: skip
            elif n >= 2 * ADMISSION_PARALLEL:
                saga = saga.model_copy(update={"state": UpgradeState.UPGRADE_DONE})
            await store.create(saga)
        statuses = {name: NodeStatus() for name in names}
        gc.collect()
        began = time.process_time()
        for _ in range(passes):
            planned = await runner.admit(statuses, T0)
            assert planned is not None and not planned.nodes, "(d) admits nothing"
        index_cpu = time.process_time() - began
        began = time.process_time()
        for _ in range(passes):  # admission as it was: list and read every saga from KV
            every = [entry.saga for entry in await store.all()]
            full = admission.plan(every, statuses, spec, T0)
            assert full == planned, "(d) both paths admit alike"
        full_cpu = time.process_time() - began
    finally:
        await outbox.close()
        await deadlines.close()
        await bus.close()
    return AdmissionCost(sagas, passes, index_cpu, full_cpu)


def _is_command(envelope: Envelope) -> bool:
    return subjects.Kind.COMMAND.value in envelope.type.split(".")


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer nodes for (b) and (c)")
    parser.add_argument(
        "--step-seconds", type=float, default=STEP_SECONDS, help="(b): each agent step"
    )
    parser.add_argument("--timed-nodes", type=int, help="(b) and (c): nodes (default 200/1000)")
    parser.add_argument(
        "--smoke", action="store_true", help="a few nodes and passes: does it still run"
    )
    args = parser.parse_args(argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    logging.getLogger("gpuop").setLevel(logging.WARNING)
    fast_nodes, fast_parallel = (50, 10) if args.smoke else (1_000, 100)
    timed_nodes, timed_parallel = (
        (20, 10) if args.smoke else (200, 50) if args.quick else (1_000, 100)
    )
    timed_nodes = args.timed_nodes or timed_nodes
    step = 0.1 if args.smoke else args.step_seconds

    fast = asyncio.run(rollout(fast_nodes, fast_parallel, 0.0))
    print(f"(a) {fast.nodes} nodes, instant steps: {fast.seconds:.2f} s, "
          f"{fast.nodes / fast.seconds:.1f} nodes/s")  # fmt: skip
    timed = asyncio.run(rollout(timed_nodes, timed_parallel, step))
    ratio = timed.seconds / timed.ideal
    overhead_ms = (timed.seconds - timed.ideal) / (timed.waves * timed.commands_per_node) * 1e3
    print(f"(b) {timed.nodes} nodes, {timed.commands_per_node:g} steps of {step} s: makespan "
          f"{timed.seconds:.2f} s, ideal {timed.ideal:.2f} s, ratio {ratio:.3f}")  # fmt: skip
    p50 = percentile(timed.latencies, 0.50) * 1e3
    p99 = percentile(timed.latencies, 0.99) * 1e3
    print(f"(c) {len(timed.latencies)} reactions: p50 {p50:.2f} ms, p99 {p99:.2f} ms")
    passes = 2 if args.smoke else ADMISSION_PASSES // 4 if args.quick else ADMISSION_PASSES
    sizes = SMOKE_ADMISSION_SIZES if args.smoke else ADMISSION_SIZES
    costs = [asyncio.run(admission_cost(size, passes)) for size in sizes]
    for cost in costs:
        print(f"(d) {cost.sagas} sagas, {cost.passes} passes: index "
              f"{cost.index_ms_per_pass:.3f} ms/pass, full read "
              f"{cost.full_read_ms_per_pass:.3f} ms/pass")  # fmt: skip
    small, large = costs[0], costs[-1]
    met = fast.seconds <= TARGET_SECONDS and ratio <= TARGET_RATIO and p99 <= TARGET_P99_MS
    admission_figures: dict[str, float | int] = {"d_passes": passes}
    for cost in costs:
        admission_figures[f"d_{cost.sagas}_index_cpu_ms_per_pass"] = round(
            cost.index_ms_per_pass, 3
        )
        admission_figures[f"d_{cost.sagas}_full_read_cpu_ms_per_pass"] = round(
            cost.full_read_ms_per_pass, 3
        )
    admission_figures["d_index_growth"] = round(
        large.index_ms_per_pass / small.index_ms_per_pass, 2
    )
    admission_figures["d_full_read_growth"] = round(
        large.full_read_ms_per_pass / small.full_read_ms_per_pass, 2
    )
    print(
        json.dumps(
            {
                "benchmark": "rollout",
                "about": (
                    "The orchestrator's runtime (runner, outbox, intake, saga store) on the"
                    " in-memory bus with fake node agents and a fake Kubernetes: (a) a rollout"
                    " with instant steps, (b) fixed step durations against the ideal makespan"
                    " (waves x per-node duration), (c) wall time from a step-completed event"
                    " to the node's next command, during (b), (d) CPU per admission pass over"
                    " stores of 1,000 and 5,000 sagas, nearly all done: on the store's index,"
                    " and by the full read of KV admission made before it (growth: the"
                    " 5,000-saga pass over the 1,000-saga pass)."
                ),
                "mode": mode,
                "target": (
                    f"(a) <= {TARGET_SECONDS:g} s, (b) makespan_ratio <= {TARGET_RATIO},"
                    f" (c) p99 <= {TARGET_P99_MS:g} ms"
                ),
                "target_met": met,
                "a_nodes": fast.nodes,
                "a_max_parallel": fast.max_parallel,
                "a_seconds": round(fast.seconds, 2),
                "a_node_upgrades_per_s": round(fast.nodes / fast.seconds, 1),
                "a_cpu_seconds": round(fast.cpu_seconds, 2),
                "a_admission_passes": fast.admission_passes,
                "b_nodes": timed.nodes,
                "b_max_parallel": timed.max_parallel,
                "b_waves": timed.waves,
                "b_steps_per_node": timed.commands_per_node,
                "b_step_seconds": step,
                "b_makespan_s": round(timed.seconds, 3),
                "b_ideal_makespan_s": round(timed.ideal, 3),
                "makespan_ratio": round(ratio, 3),
                "b_overhead_ms_per_step": round(overhead_ms, 1),
                "b_cpu_seconds": round(timed.cpu_seconds, 2),
                "b_admission_passes": timed.admission_passes,
                "c_reactions": len(timed.latencies),
                "c_p50_ms": round(p50, 2),
                "c_p99_ms": round(p99, 2),
                **admission_figures,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
