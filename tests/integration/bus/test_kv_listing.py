"""A KV watch's first listing (every key as it is, then None) is complete on a real
nats-server, while other clients write: the IPAM claims decide who holds an address by
what such a listing shows (`network_manager.addressing`), so a listing that ended before the
server's first deliveries arrived, which a busy client saw, would miss the earlier claim."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

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


async def follow_until(watch: AsyncIterator[KvEntry | None], last: str) -> list[str | None]:
    """The keys a watch yields (None for the caught-up mark) up to and including `last`."""
    seen: list[str | None] = []
    async with asyncio.timeout(10):
        async for entry in watch:
            seen.append(None if entry is None else entry.key)
            if entry is not None and entry.key == last:
                return seen
    raise AssertionError(f"the watch ended before {last}: {seen}")


async def test_a_watch_of_an_empty_bucket_is_caught_up_once_then_follows(
    nats_server: NatsServer,
) -> None:
    """The watch's consumer had nothing to deliver when it was made (its creation's
    answer): caught up at once, and once only, however many changes follow."""
    bus = NatsBus(nats_server.url)
    await bus.start()
    try:
        kv = await bus.kv(Buckets.IPAM)
        watch = kv.watch("claim.*.>")
        try:
            assert await asyncio.wait_for(anext(watch), 5) is None
            for n in range(3):
                await kv.put(f"claim.n{n}.a", b"x")
            seen = await follow_until(watch, "claim.n2.a")
        finally:
            await watch.aclose()  # type: ignore[attr-defined]
    finally:
        await bus.close()
    assert seen == ["claim.n0.a", "claim.n1.a", "claim.n2.a"]


async def test_a_watch_of_a_bucket_with_keys_lists_each_then_is_caught_up_once(
    nats_server: NatsServer,
) -> None:
    bus = NatsBus(nats_server.url)
    await bus.start()
    try:
        kv = await bus.kv(Buckets.IPAM)
        written = [f"claim.n{n}.a" for n in range(25)]
        for key in written:
            await kv.put(key, b"x")
        await kv.put("node.n0.rdma", b"not watched")
        watch = kv.watch("claim.*.>")
        try:
            listed = await follow_until(watch, written[-1])
            assert await asyncio.wait_for(anext(watch), 5) is None
            await kv.put("claim.late.a", b"x")
            after = await follow_until(watch, "claim.late.a")
        finally:
            await watch.aclose()  # type: ignore[attr-defined]
    finally:
        await bus.close()
    assert listed == written
    assert after == ["claim.late.a"]


async def test_a_watch_made_while_writes_race_misses_no_key_and_is_caught_up_once(
    nats_server: NatsServer,
) -> None:
    """Writers keep adding keys while watches are made: each watch lists every key written
    before it was asked for, says it is caught up exactly once, and then yields every later
    key, up to the writers' last."""
    writer_bus, watcher_bus = NatsBus(nats_server.url), NatsBus(nats_server.url)
    await writer_bus.start()
    await watcher_bus.start()
    try:
        writes, watches = await writer_bus.kv(Buckets.IPAM), await watcher_bus.kv(Buckets.IPAM)
        done: list[str] = []

        async def write(n: int) -> None:
            for round_ in range(40):
                key = f"claim.w{n}.a{round_}"
                await writes.put(key, b"x")
                done.append(key)

        async def watch_once() -> tuple[list[str], list[str | None]]:
            before = list(done)
            watch = watches.watch("claim.*.>")
            try:
                seen = [] if not before else await follow_until(watch, before[-1])
                while None not in seen:
                    entry = await asyncio.wait_for(anext(watch), 5)
                    seen.append(None if entry is None else entry.key)
                await writers
                await writes.put("claim.end.a", b"x")
                seen += await follow_until(watch, "claim.end.a")
            finally:
                await watch.aclose()  # type: ignore[attr-defined]
            return before, seen

        writers = asyncio.gather(*(write(n) for n in range(4)))
        results = []
        for _ in range(6):
            results.append(await watch_once())
            await asyncio.sleep(0.02)
        await writers
    finally:
        await writer_bus.close()
        await watcher_bus.close()
    for before, seen in results:
        assert seen.count(None) == 1, seen
        assert set(before) <= set(seen), sorted(set(before) - set(seen))
        assert set(done) <= set(seen), sorted(set(done) - set(seen))
