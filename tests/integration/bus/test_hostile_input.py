"""Arbitrary bytes and arbitrary JSON on a consumed subject never crash a consumer: each
message ends handled and acked, acked as an unknown type, or dead-lettered with a reason."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from gpuop.bus import Bus, ConsumerSpec, Delivery, InMemoryBus, NatsBus, NatsServer
from gpuop.events import REGISTRY
from gpuop.observability.metrics import BusMetrics
from tests import hostile
from tests.support.buses import dead_letters, heartbeat, wait_until

NODES = ["n1", "n2", "gpu-3.example.com"]


@st.composite
def envelope_like(draw: st.DrawFn) -> bytes:
    """Documents that look like envelopes, with any field wrong, missing or foreign."""
    document = hostile.document_of(heartbeat(draw(st.sampled_from(NODES)), 1))
    if draw(st.booleans()):
        document["type"] = draw(st.sampled_from(sorted(REGISTRY)))
    return draw(st.one_of(hostile.mutated(document), hostile.newer_version(document)))


hostile_bytes = st.one_of(hostile.garbage, envelope_like())


async def _exercise(
    bus: Bus, metrics: CollectorRegistry, messages: list[tuple[str, bytes]]
) -> None:
    handled: list[Delivery] = []

    async def handler(delivery: Delivery) -> None:
        handled.append(delivery)

    sub = await bus.consume(ConsumerSpec("hostile", ["gpuop.evt.hardware.*.heartbeat"]), handler)
    try:
        for node, data in messages:
            token = node.replace(".", "_")
            await bus.publish_raw(f"gpuop.evt.hardware.{token}.heartbeat", data)
        for node in NODES:
            await bus.publish(heartbeat(node, 424242))

        async def sentinels_seen() -> bool:
            return sum(
                1 for d in handled if d.payload.model_dump().get("uptime_seconds") == 424242
            ) == len(NODES)

        await wait_until(sentinels_seen, timeout=30)
        total = len(messages) + len(NODES)

        async def all_settled() -> bool:
            return _settled(metrics) >= total

        await wait_until(all_settled, timeout=30)
        letters = await dead_letters(bus)
    finally:
        await sub.stop()
    outcomes = _outcomes(metrics)
    assert outcomes.get("retried", 0) == 0
    assert outcomes.get("acked", 0) == len(handled)
    assert outcomes.get("dead_lettered", 0) == len(letters)
    assert sum(outcomes.values()) == total
    assert all(letter.headers["Gpuop-Dlq-Reason"] for letter in letters)


def _outcomes(metrics: CollectorRegistry) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in metrics.collect():
        if family.name == "gpuop_bus_consumed":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    out[sample.labels["outcome"]] = (
                        out.get(sample.labels["outcome"], 0) + sample.value
                    )
    return out


def _settled(metrics: CollectorRegistry) -> float:
    return sum(_outcomes(metrics).values())


messages_strategy = st.lists(
    st.tuples(st.sampled_from(NODES), hostile_bytes), min_size=1, max_size=25
)


@settings(max_examples=80, deadline=None)
@given(messages=messages_strategy)
def test_hostile_messages_in_memory_end_acked_or_dead_lettered(
    messages: list[tuple[str, bytes]],
) -> None:
    async def run() -> None:
        metrics = CollectorRegistry()
        bus = InMemoryBus(metrics=BusMetrics(metrics))
        await bus.start()
        try:
            await _exercise(bus, metrics, messages)
        finally:
            await bus.close()

    asyncio.run(run())


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=st.lists(st.tuples(st.sampled_from(NODES), hostile_bytes), min_size=50, max_size=120)
)
def test_hostile_messages_on_nats_end_acked_or_dead_lettered(
    messages: list[tuple[str, bytes]],
) -> None:
    async def run() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            async with NatsServer(Path(tmp)) as server:
                metrics = CollectorRegistry()
                bus = NatsBus(server.url, metrics=BusMetrics(metrics))
                await bus.start()
                try:
                    await _exercise(bus, metrics, messages)
                finally:
                    await bus.close()

    asyncio.run(run())
