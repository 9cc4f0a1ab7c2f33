"""A KV watch's first listing (every key as it is, then None) is complete on a real
nats-server, while other clients write: the IPAM claims decide who holds an address by
what such a listing shows (`network_manager.addressing`), so a listing that ended before the
server's first deliveries arrived, which a busy client saw, would miss the earlier claim."""

from __future__ import annotations

import asyncio

import pytest

from gpuop.bus import Buckets, NatsBus, NatsServer
from gpuop.bus.protocol import KeyValue, KvEntry

pytestmark = pytest.mark.nats

CLIENTS = 20
ROUNDS = 30


async def listing(kv: KeyValue, pattern: str) -> list[KvEntry]:
    found: list[KvEntry] = []
    watch = kv.watch(pattern)
    try:
        async for entry in watch:
            if entry is None:
                break
            found.append(entry)
    finally:
        await watch.aclose()  # type: ignore[attr-defined]
    return found


async def test_a_listing_after_a_write_shows_it_and_every_key_before_it(
    nats_server: NatsServer,
) -> None:
    buses = [NatsBus(nats_server.url, name=f"lister-{n}") for n in range(CLIENTS)]
    for bus in buses:
        await bus.start()
    try:
        kvs = [await bus.kv(Buckets.IPAM) for bus in buses]
        await kvs[0].put("claim.first.a", b"the earliest")

        async def write_then_list(n: int, round_: int) -> list[str]:
            key = f"claim.n{n}.a{round_}"
            await kvs[n].create(key, b"mine")
            seen = [entry.key for entry in await listing(kvs[n], "claim.*.>")]
            assert key in seen and "claim.first.a" in seen, (key, seen)
            return seen

        for round_ in range(ROUNDS):
            await asyncio.gather(*(write_then_list(n, round_) for n in range(CLIENTS)))
    finally:
        for bus in buses:
            await bus.close()
