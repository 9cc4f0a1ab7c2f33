"""The bus on a three-server JetStream cluster: replicated streams and buckets, a stream
leader that moves, a server lost for good, and settings that drifted on the server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import nats.errors
import pytest
from nats.js.api import StorageType, StreamConfig

from gpuop.bus import (
    Buckets,
    ConsumerSpec,
    KeyExists,
    NatsBus,
    NatsCluster,
    RevisionConflict,
    grants,
    streams,
)
from gpuop.bus.errors import BusError
from gpuop.bus.kv import NatsKeyValue
from tests.support import partitions
from tests.support.buses import HB_SUBJECT, Recorder, heartbeat, seq_of
from tests.support.waiting import eventually

pytestmark = pytest.mark.nats


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[NatsCluster]:
    async with NatsCluster(tmp_path / "cluster") as running:
        yield running


@pytest.fixture
async def bus(cluster: NatsCluster) -> AsyncIterator[NatsBus]:
    started = NatsBus(cluster.url, replicas=3, retry_for=30.0, name="cluster-test")
    await started.start()
    try:
        yield started
    finally:
        await started.close()


async def _first_write(kv: NatsKeyValue, key: str, value: bytes) -> int:
    """Create `key`, asking again while the bucket's new replica group elects its first
    leader (a loaded cluster may take seconds); its revision."""

    async def create() -> int | None:
        try:
            return await kv.create(key, value)
        except KeyExists:  # an earlier try was stored, its answer lost
            entry = await kv.get(key)
            return entry.revision if entry is not None and entry.value == value else None
        except BusError:
            return None

    return await eventually(create, timeout=30)


async def _leader(bus: NatsBus, stream: str, other_than: str = "") -> str:
    """`stream`'s leader once it has one (other than `other_than`): a loaded cluster may take
    seconds to elect, and a stream between leaders answers nothing or an error."""

    async def elected() -> str | None:
        try:
            leader = await bus.stream_leader(stream)
        except BusError:
            return None  # between leaders
        return leader if leader and leader != other_than else None

    return await eventually(elected, timeout=30)


async def test_every_stream_and_bucket_has_three_replicas_sharing_its_byte_limit(
    bus: NatsBus,
) -> None:
    """JetStream reserves a stream's byte limit once per replica: each replica holds a
    third of the stream's share of the store."""
    shares = {layout.name: layout.share for layout in streams.layouts("gpuop")}
    shares |= {
        f"KV_{streams.bucket_name('gpuop', b)}": streams.DEFAULT_LIMITS.share(b) for b in Buckets
    }
    for name, share in shares.items():
        info = await bus.js.stream_info(name)
        assert info.config.num_replicas == 3, name
        assert info.cluster is not None and len(info.cluster.replicas or []) == 2, name
        assert info.config.max_bytes == share // 3, name


async def test_a_comma_separated_setting_is_the_server_list(cluster: NatsCluster) -> None:
    bus = NatsBus(cluster.url)
    assert bus._connection.servers == cluster.urls
    with pytest.raises(ValueError, match="replicas must be 1 to 5"):
        NatsBus(cluster.url, replicas=7)


async def test_a_drifted_stream_is_reported_and_scaled_up_never_down(
    cluster: NatsCluster, caplog: pytest.LogCaptureFixture
) -> None:
    first = NatsBus(cluster.url, replicas=1)
    await first.start()
    await first.close()
    caplog.set_level(logging.WARNING, logger="gpuop.bus")
    scaled = NatsBus(cluster.url, replicas=3)
    await scaled.start()
    try:
        assert (await scaled.js.stream_info("GPUOP_EVENTS")).config.num_replicas == 3
        assert (await scaled.js.stream_info("KV_gpuop_sagas")).config.num_replicas == 3
    finally:
        await scaled.close()
    assert "GPUOP_EVENTS exists with num_replicas 1 (gpuop wants 3)" in caplog.text
    assert "bucket gpuop_sagas exists with 1 replicas (gpuop wants 3)" in caplog.text
    caplog.clear()
    lower = NatsBus(cluster.url, replicas=1)
    await lower.start()
    try:
        assert (await lower.js.stream_info("GPUOP_EVENTS")).config.num_replicas == 3
    finally:
        await lower.close()
    assert "GPUOP_EVENTS keeps its 3 replicas (this service asks for 1" in caplog.text


async def test_placement_puts_the_streams_on_the_servers_with_the_tags(tmp_path: Path) -> None:
    tags = [["az:a"], ["az:a"], ["az:b"]]
    async with NatsCluster(tmp_path / "tagged", tags=tags) as tagged:
        placed = NatsBus(tagged.url, replicas=1, placement=["az:b"])
        await placed.start()
        try:
            for stream in ("GPUOP_EVENTS", "KV_gpuop_sagas"):
                assert await _leader(placed, stream) == "gpuop-2"
        finally:
            await placed.close()
        # no server has the tag: asked again until `retry_for` (a cluster just started may
        # not see every member yet), then the start fails naming the stream
        nowhere = NatsBus(
            tagged.url, replicas=1, placement=["az:c"], prefix="elsewhere", retry_for=2.0
        )
        with pytest.raises(BusError, match="cannot place stream ELSEWHERE_EVENTS yet"):
            await nowhere.start()
        await nowhere.close()


async def test_a_stream_on_the_wrong_storage_stops_the_start_with_the_reason(
    cluster: NatsCluster,
) -> None:
    probe = NatsBus(cluster.url, replicas=3)
    await probe.connect()
    memory = StreamConfig(name="GPUOP_DLQ", subjects=["gpuop.dlq.>"], storage=StorageType.MEMORY)

    async def created() -> bool:
        try:
            await probe.js.add_stream(memory)  # the same config again changes nothing
        except nats.errors.TimeoutError:
            return False  # a loaded cluster forming the replica group: ask again
        return True

    try:
        await eventually(created, timeout=30)
    finally:
        await probe.close()
    refused = NatsBus(cluster.url, replicas=3)
    refusal = r"GPUOP_DLQ exists with storage .*storage cannot be changed"
    with pytest.raises(BusError, match=refusal):
        await refused.start()
    await refused.close()


async def test_compare_and_set_keeps_its_meaning_across_a_leader_move(bus: NatsBus) -> None:
    sagas = await bus.kv(Buckets.SAGAS)
    revision = await _first_write(sagas, "gpu-node-1", b"v1")
    stream = "KV_gpuop_sagas"
    before = await _leader(bus, stream)
    await bus.step_down(stream)
    await _leader(bus, stream, other_than=before)  # another replica leads, or this times out

    async def updated() -> int | None:
        try:
            return await sagas.update("gpu-node-1", b"v2", revision)
        except BusError:
            return None  # the new leader is still catching up: ask again

    second = await eventually(updated, timeout=20)
    assert second > revision
    with pytest.raises(RevisionConflict):
        await sagas.update("gpu-node-1", b"stale", revision)
    entry = await sagas.get("gpu-node-1")
    assert entry is not None and (entry.value, entry.revision) == (b"v2", second)


async def test_a_consumer_rides_through_a_leader_move_and_loses_nothing(bus: NatsBus) -> None:
    recorder = Recorder()
    sub = await bus.consume(ConsumerSpec("moving", [HB_SUBJECT], ack_wait=2.0), recorder)
    try:
        await bus.publish_batch([heartbeat(f"node-{i % 4}", i) for i in range(100)])
        await recorder.wait_for(50, timeout=20)
        before = await _leader(bus, "GPUOP_EVENTS")
        await bus.step_down("GPUOP_EVENTS")
        await _leader(bus, "GPUOP_EVENTS", other_than=before)
        await bus.publish_batch([heartbeat(f"node-{i % 4}", i) for i in range(100, 200)])
        await eventually(lambda: {seq_of(d) for d in recorder.seen} >= set(range(200)), 30)
        await asyncio.sleep(0.5)
    finally:
        await sub.stop()
    handled = [seq_of(d) for d in recorder.seen]
    assert set(handled) == set(range(200))
    # at-least-once: a redelivery carries the same event id, which every handler dedupes on
    repeated = [d.envelope.id for d in recorder.seen]
    assert len(set(repeated)) == 200


async def test_losing_a_server_for_good_leaves_publishing_consuming_and_kv_working(
    cluster: NatsCluster, bus: NatsBus
) -> None:
    recorder = Recorder()
    sub = await bus.consume(ConsumerSpec("survivor", [HB_SUBJECT], ack_wait=2.0), recorder)
    sagas = await bus.kv(Buckets.SAGAS)
    revision = await _first_write(sagas, "gpu-node-2", b"v1")
    try:
        await bus.publish_batch([heartbeat("node-0", i) for i in range(50)])
        leader = await _leader(bus, "GPUOP_EVENTS")
        lost = cluster.members[int(leader.rsplit("-", 1)[1])]  # members are gpuop-<index>
        await lost.kill()  # SIGKILL, never started again
        await bus.publish_batch([heartbeat("node-0", i) for i in range(50, 100)])
        await eventually(lambda: {seq_of(d) for d in recorder.seen} >= set(range(100)), 30)

        async def updated() -> int | None:
            try:
                return await sagas.update("gpu-node-2", b"v2", revision)
            except BusError:
                return None

        assert await eventually(updated, timeout=30) > revision
        await _leader(bus, "GPUOP_EVENTS", other_than=leader)  # a survivor leads
    finally:
        await sub.stop()
    assert {seq_of(d) for d in recorder.seen} == set(range(100))


@pytest.mark.slow
async def test_a_server_cut_off_by_a_partition_leaves_the_rest_going_and_catches_up(
    tmp_path: Path,
) -> None:
    with partitions.link() as cut_off:
        cluster = NatsCluster(
            tmp_path / "cluster",
            hosts=[cut_off.host_ip, cut_off.host_ip, cut_off.inner_ip],
            prefixes=[(), (), cut_off.prefix],
        )
        async with cluster:
            bus = NatsBus(cluster.url, replicas=3, name="partition-test")
            await bus.start()
            recorder = Recorder()
            sub = await bus.consume(ConsumerSpec("parted", [HB_SUBJECT], ack_wait=2.0), recorder)
            sagas = await bus.kv(Buckets.SAGAS)
            try:
                await bus.publish_batch([heartbeat("node-0", i) for i in range(50)])
                cut_off.cut()
                await bus.publish_batch([heartbeat("node-0", i) for i in range(50, 100)])
                revision = await eventually(lambda: _created(sagas, "during"), timeout=40)
                await asyncio.sleep(PARTITION - 5)
                cut_off.heal()
                await bus.publish_batch([heartbeat("node-0", i) for i in range(100, 150)])
                await eventually(lambda: {seq_of(d) for d in recorder.seen} >= set(range(150)), 60)
                entry = await sagas.get("during")
                assert entry is not None and entry.revision == revision
                # the cut-off server caught up: it holds every message again
                caught_up = NatsBus(cluster.members[2].url, name="partition-probe")
                await caught_up.connect()
                try:

                    async def current() -> bool:
                        info = await caught_up.js.stream_info("GPUOP_EVENTS")
                        return info.state.messages == 150

                    await eventually(current, timeout=30)
                finally:
                    await caught_up.close()
            finally:
                await sub.stop()
                await bus.close()
    assert {seq_of(d) for d in recorder.seen} == set(range(150))


PARTITION = 20.0
"""Seconds the cut-off server stays cut off."""


async def _created(sagas: object, key: str) -> int | None:
    assert isinstance(sagas, NatsKeyValue)
    try:
        return await sagas.create(key, b"written while a server was cut off")
    except KeyExists:
        entry = await sagas.get(key)
        return entry.revision if entry else None
    except BusError:
        return None


async def test_a_read_rides_through_losing_its_consumers_server_and_its_name_comes_free(
    cluster: NatsCluster, bus: NatsBus
) -> None:
    """A read's consumer on a server SIGKILLed for good: the following read goes on, and once
    it ends the same identity reads the same filter again under the same name (a consumer
    held by a dead server alone was never removed: "consumer already exists" for ever)."""
    identity = grants.Identity("upgrade-orchestrator", None)
    reader = NatsBus(cluster.url, replicas=3, retry_for=30.0, name="reader", identity=identity)
    await reader.connect()
    await bus.publish_batch([heartbeat("node-0", i) for i in range(3)])
    seen: list[int] = []
    failures: list[BusError] = []

    async def following() -> None:
        try:
            async for stored in reader.read(HB_SUBJECT, follow=True):
                seen.append(stored.seq)
        except BusError as error:
            failures.append(error)

    async def published() -> bool:
        try:
            await bus.publish_batch([heartbeat("node-0", i) for i in range(3, 5)])
        except BusError:
            return False  # the stream between leaders: ask again
        return True

    task = asyncio.create_task(following())
    try:
        await eventually(lambda: len(seen) == 3 or None, timeout=30)
        name = grants.read_name(identity, HB_SUBJECT)
        held_by = (await bus.js.consumer_info("GPUOP_EVENTS", name)).cluster
        assert held_by is not None and held_by.leader is not None
        await cluster.members[int(held_by.leader.rsplit("-", 1)[1])].kill()
        await eventually(published, timeout=30)
        await eventually(lambda: len(seen) == 5 or bool(failures) or None, timeout=60)
        assert failures == [] and seen == [1, 2, 3, 4, 5]
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert await eventually(lambda: _read_all(reader), timeout=60) == [1, 2, 3, 4, 5]
        # each read's new consumer has a lost server among its replicas: some take seconds
        # to elect a leader, and every one still reads it all
        for _ in range(4):
            assert [stored.seq async for stored in reader.read(HB_SUBJECT)] == [1, 2, 3, 4, 5]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await reader.close()


async def test_a_read_of_a_stream_made_with_one_replica_has_one(cluster: NatsCluster) -> None:
    """A service told 3 replicas reads a stream another made with 1: the server refuses a
    consumer with more replicas than its stream, so the read's consumer has one too."""
    first = NatsBus(cluster.url, replicas=1, retry_for=30.0, name="one-replica")
    await first.start()
    identity = grants.Identity("discovery", "gpu-node-1")
    reader = NatsBus(cluster.url, replicas=3, retry_for=30.0, name="reader", identity=identity)
    try:
        await first.publish_batch([heartbeat("node-0", i) for i in range(3)])
        await reader.connect()
        assert [stored.seq async for stored in reader.read(HB_SUBJECT)] == [1, 2, 3]
    finally:
        await reader.close()
        await first.close()


async def _read_all(reader: NatsBus) -> list[int] | None:
    """The sequences of every heartbeat, or None while the cluster is between leaders (its
    meta layer too: the create of a read's consumer is refused or unanswered meanwhile)."""
    try:
        return [stored.seq async for stored in reader.read(HB_SUBJECT)]
    except BusError:
        return None
