"""End-to-end throughput of small events through `gpuop.bus`, against raw nats-py as a baseline.

Run by `tests.bench.run_all` (`make bench`), or alone:
`.venv/bin/python -m tests.bench.bus [--quick] [--profile FILE]`.

Both paths do the same work against one nats-server started here: serialize heartbeat
envelopes (the same bytes, subjects and `Nats-Msg-Id` headers), publish them pipelined in
chunks, consume them with a durable pull consumer, decode each with `gpuop.events.decode`
and ack it. The clock runs from the first publish until the server reports every message
acked. Runs alternate raw, gpuop, raw, gpuop and the best of each counts, so a noisy
neighbour hurts both sides alike. Absolute rates depend on the machine; the ratio
gpuop/raw is the figure to compare. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import logging
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import nats.errors
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from prometheus_client import CollectorRegistry

from gpuop.bus import ConsumerSpec, Delivery, NatsBus, NatsCluster, NatsServer
from gpuop.bus.streams import DEFAULT_EVENTS_PER_SUBJECT
from gpuop.events import Envelope, bus_subject, decode, new_event
from gpuop.events.hardware import HardwareHeartbeat
from gpuop.observability.metrics import BusMetrics

PREFIX = "gpuop"
STREAM = "GPUOP_EVENTS"
SUBJECTS = ("gpuop.evt.hardware.*.heartbeat",)
NODES = 16
"""The fewest nodes the heartbeats of one run come from; more when a run's events would put
more than `PER_SUBJECT` on one node's subject (`nodes_for`)."""
PER_SUBJECT = DEFAULT_EVENTS_PER_SUBJECT // 2
"""Heartbeats per node in one run at most. The event log keeps `DEFAULT_EVENTS_PER_SUBJECT`
messages per subject and drops the oldest: a run that put more on one subject would lose
messages before the consumers read them, and neither side would ever see all handled."""
PUBLISH_CHUNK = 500
"""Envelopes per `publish_batch` call (and per gathered raw chunk), as a busy service sends."""
MAX_IN_FLIGHT = 256
"""gpuop's default `ConsumerSpec.max_in_flight`; gpuop sets max_ack_pending to 4x this."""
FETCH_BATCH = 64
"""gpuop's fetch loop asks for at most 64 messages; the raw consumer asks for the same."""
MAX_PENDING_PUBLISHES = 4000
"""`publish_async_max_pending`, as `NatsBus` configures its JetStream context."""
TARGET_RATIO = 0.8
BOOT_ID = "6f0e6b1c-3a52-4b8e-9a1d-0c5c2f3e4d5a"
INVENTORY_HASH = "a" * 64
RUN_TIMEOUT = 60.0


def nodes_for(count: int) -> int:
    """Nodes whose heartbeats make `count` events with at most `PER_SUBJECT` per node."""
    return max(NODES, -(-count // PER_SUBJECT))


def heartbeats(count: int, run: int) -> list[Envelope]:
    """`count` small real events over `nodes_for(count)` nodes, with ids unique to `run` (the
    server would drop a repeated `Nats-Msg-Id` inside its duplicate window)."""
    nodes = nodes_for(count)
    return [
        new_event(
            HardwareHeartbeat(
                boot_id=BOOT_ID, inventory_hash=INVENTORY_HASH, uptime_seconds=n, gpu_count=8
            ),
            node=f"bench-node-{n % nodes:03d}",
            source="/gpuop/bench",
            id=f"bench-{run}-{n}",
        )
        for n in range(count)
    ]


def chunks(envelopes: Sequence[Envelope]) -> list[Sequence[Envelope]]:
    return [envelopes[i : i + PUBLISH_CHUNK] for i in range(0, len(envelopes), PUBLISH_CHUNK)]


async def check_kept(js: JetStreamContext, count: int) -> None:
    """Raise when the stream holds fewer than the `count` messages just published: its limits
    dropped some, so no consumer will ever see them all (rather than a run's timeout)."""
    info = await js.stream_info(STREAM)
    if info.state.messages < count:
        raise RuntimeError(
            f"{STREAM} holds {info.state.messages} of the {count} messages published: its"
            f" limits (max_msgs_per_subject {info.config.max_msgs_per_subject}) dropped some"
        )


async def wait_all_acked(js: JetStreamContext, durable: str, count: int) -> None:
    """Until the server has delivered `count` messages to `durable` and holds no unacked one."""
    while True:
        info = await js.consumer_info(STREAM, durable)
        if info.delivered.consumer_seq >= count and info.num_ack_pending == 0:
            return
        await asyncio.sleep(0.002)


@dataclass(frozen=True)
class Run:
    """One measured run: wall-clock seconds, and CPU seconds of this (the client) process."""

    events: int
    seconds: float
    cpu_seconds: float

    @property
    def per_s(self) -> float:
        return self.events / self.seconds

    @property
    def cpu_us_per_event(self) -> float:
        return self.cpu_seconds / self.events * 1e6


async def timed(
    events: int,
    publish: Callable[[], Coroutine[Any, Any, None]],
    all_handled: asyncio.Event,
    acked: Callable[[], Awaitable[None]],
) -> Run:
    """From the first publish until every message is handled and acked."""
    gc.collect()
    cpu_started = time.process_time()
    started = time.perf_counter()
    publisher = asyncio.create_task(publish())
    async with asyncio.timeout(RUN_TIMEOUT):
        await publisher  # first, so that a failed publish is raised rather than waited out
        await all_handled.wait()
        await acked()
    return Run(events, time.perf_counter() - started, time.process_time() - cpu_started)


async def raw_run(url: str, envelopes: Sequence[Envelope], run: int) -> Run:
    """Plain nats-py: publish_async in chunks, pull fetch + decode + ack in one loop."""
    durable = f"bench-raw-{run}"
    nc = await nats.connect(url.split(","))
    try:
        js = nc.jetstream(publish_async_max_pending=MAX_PENDING_PUBLISHES)
        await js.add_consumer(
            STREAM,
            ConsumerConfig(
                durable_name=durable,
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=30.0,
                max_ack_pending=MAX_IN_FLIGHT * 4,
                deliver_policy=DeliverPolicy.NEW,
                filter_subjects=list(SUBJECTS),
            ),
        )
        psub = await js.pull_subscribe_bind(durable=durable, stream=STREAM)
        all_handled = asyncio.Event()

        async def publish() -> None:
            for chunk in chunks(envelopes):
                futures = []
                for envelope in chunk:
                    futures.append(
                        await js.publish_async(
                            bus_subject(envelope, prefix=PREFIX),
                            envelope.to_bytes(),
                            headers={"Nats-Msg-Id": envelope.id},
                        )
                    )
                for ack in await asyncio.gather(*futures):
                    assert not ack.duplicate, "raw publish dropped as a duplicate"
            await check_kept(js, len(envelopes))

        async def consume() -> None:
            handled = 0
            while handled < len(envelopes):
                try:
                    batch = await psub.fetch(FETCH_BATCH, timeout=1.0)
                except nats.errors.TimeoutError:
                    continue
                for msg in batch:
                    decode(msg.data)
                    await msg.ack()
                    handled += 1
            all_handled.set()

        consumer = asyncio.create_task(consume())
        try:
            return await timed(
                len(envelopes),
                publish,
                all_handled,
                lambda: wait_all_acked(js, durable, len(envelopes)),
            )
        finally:
            consumer.cancel()
            await asyncio.gather(consumer, return_exceptions=True)
            await psub.unsubscribe()
            await js.delete_consumer(STREAM, durable)
            await js.purge_stream(STREAM)
    finally:
        await nc.close()


async def gpuop_run(url: str, envelopes: Sequence[Envelope], run: int) -> Run:
    """`NatsBus`: `publish_batch` in chunks, a durable consumer whose handler counts."""
    durable = f"bench-gpuop-{run}"
    bus = NatsBus(url, metrics=BusMetrics(CollectorRegistry()))
    await bus.start()
    try:
        all_handled = asyncio.Event()
        handled = 0

        async def count(delivery: Delivery) -> None:
            nonlocal handled
            handled += 1
            if handled == len(envelopes):
                all_handled.set()

        spec = ConsumerSpec(durable, SUBJECTS, max_in_flight=MAX_IN_FLIGHT, deliver_new_only=True)
        subscription = await bus.consume(spec, count)

        async def publish() -> None:
            for chunk in chunks(envelopes):
                acks = await bus.publish_batch(chunk)
                assert not any(ack.duplicate for ack in acks), "gpuop publish dropped"
            await check_kept(bus.js, len(envelopes))

        try:
            return await timed(
                len(envelopes),
                publish,
                all_handled,
                lambda: wait_all_acked(bus.js, durable, len(envelopes)),
            )
        finally:
            await subscription.stop()
            await bus.js.delete_consumer(STREAM, durable)
            await bus.js.purge_stream(STREAM)
    finally:
        await bus.close()


Runner = Callable[[str, Sequence[Envelope], int], Awaitable[Run]]


@dataclass
class Runs:
    """Every measured run, per side."""

    raw: list[Run] = field(default_factory=list)
    gpuop: list[Run] = field(default_factory=list)


async def measure(
    events: int, rounds: int, only: str | None = None, *, cluster: bool = False
) -> Runs:
    """`rounds` alternations of raw then gpuop (or one side) against one fresh server, or a
    fresh three-server cluster with every stream on all three (`cluster`)."""
    runs = Runs()
    with tempfile.TemporaryDirectory(prefix="gpuop-bench-") as store:
        server: NatsServer | NatsCluster = (
            NatsCluster(Path(store)) if cluster else NatsServer(Path(store))
        )
        await server.start()
        try:
            setup = NatsBus(
                server.url, metrics=BusMetrics(CollectorRegistry()), replicas=3 if cluster else 1
            )
            await setup.start()  # creates the streams both sides publish to
            await setup.close()
            sides: list[tuple[str, Runner, list[Run]]] = [
                ("raw", raw_run, runs.raw),
                ("gpuop", gpuop_run, runs.gpuop),
            ]
            number = 0
            for _ in range(rounds):
                for name, runner, out in sides:
                    if only is not None and name != only:
                        continue
                    number += 1
                    run = await runner(server.url, heartbeats(events, number), number)
                    out.append(run)
                    print(
                        f"{name:>5}: {events} events in {run.seconds:.3f} s = {run.per_s:,.0f}/s,"
                        f" client CPU {run.cpu_us_per_event:.1f} us/event"
                    )
        finally:
            await server.stop()
    return runs


def summary(
    runs: Runs, mode: str, events: int, rounds: int, *, cluster: bool = False
) -> dict[str, object]:
    """The figures of the best run of each side."""
    gpuop = max(runs.gpuop, key=lambda run: run.per_s)
    raw = max(runs.raw, key=lambda run: run.per_s)
    ratio = gpuop.per_s / raw.per_s
    return {
        "benchmark": "bus-cluster" if cluster else "bus",
        "about": (
            "Small events published, pull-consumed, decoded and acked end to end, through"
            " gpuop.bus and through raw nats-py doing the same work; best of each side's runs."
            " cpu_us_per_event is this client process's CPU time (the server's is not counted)."
            + (
                " On a three-server JetStream cluster, every stream with three replicas."
                if cluster
                else ""
            )
        ),
        "mode": mode,
        "events": events,
        "nodes": nodes_for(events),
        "rounds": rounds,
        "gpuop_events_per_s": round(gpuop.per_s),
        "raw_events_per_s": round(raw.per_s),
        "ratio": round(ratio, 3),
        "target": f"ratio >= {TARGET_RATIO}",
        "target_met": ratio >= TARGET_RATIO,
        "gpuop_cpu_us_per_event": round(min(r.cpu_us_per_event for r in runs.gpuop), 1),
        "raw_cpu_us_per_event": round(min(r.cpu_us_per_event for r in runs.raw), 1),
        "gpuop_runs_per_s": [round(r.per_s) for r in runs.gpuop],
        "raw_runs_per_s": [round(r.per_s) for r in runs.raw],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="5,000 events per run, not 20,000")
    parser.add_argument(
        "--smoke", action="store_true", help="4,000 events, one round: does it still run"
    )
    parser.add_argument("--events", type=int, help="events per run (overrides --quick)")
    parser.add_argument("--rounds", type=int, default=2, help="raw+gpuop rounds; best counts")
    parser.add_argument("--only", choices=("raw", "gpuop"), help="run one side (for --profile)")
    parser.add_argument("--profile", type=Path, help="write a cProfile of the runs to this file")
    parser.add_argument(
        "--cluster", action="store_true", help="on three servers, every stream R3 (not one)"
    )
    args = parser.parse_args(argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    # a smoke run still puts more on the bus than `NODES` nodes' subjects hold each
    events = args.events or (4_000 if args.smoke else 5_000 if args.quick else 20_000)
    if args.smoke:
        args.rounds = 1
    # `NatsBus.close()` logs the disconnect it causes as a warning; keep stderr for real trouble
    logging.getLogger("gpuop.bus").setLevel(logging.ERROR)

    if args.profile is not None:
        profiler = cProfile.Profile()
        profiler.enable()
        asyncio.run(measure(events, args.rounds, only=args.only, cluster=args.cluster))
        profiler.disable()
        profiler.dump_stats(args.profile)
        print(f"profile written to {args.profile}", file=sys.stderr)
        return 0

    runs = asyncio.run(measure(events, args.rounds, only=args.only, cluster=args.cluster))
    if not runs.gpuop or not runs.raw:
        return 0  # one side only: the per-run lines above are the result
    print(json.dumps(summary(runs, mode, events, args.rounds, cluster=args.cluster)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
