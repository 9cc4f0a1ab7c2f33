"""Each stream and bucket holds at most its own share of the store, on a real nats-server: a
flood on one stream drops that stream's oldest messages and leaves the others (and the
account) alone, heartbeats beyond their bound drop the oldest heartbeats and no other event,
and streams and buckets made before the limits get them at the next start (issue 17,
finding 6)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.js.api import DiscardPolicy, KeyValueConfig, StorageType, StreamConfig

from gpuop.bus import Buckets, NatsBus, NatsCluster, NatsServer, streams
from gpuop.bus import backup as backups
from gpuop.events import subjects
from tests.support.buses import HB_SUBJECT, collect, heartbeat

pytestmark = [pytest.mark.nats, pytest.mark.security]

SMALL = streams.StoreLimits(store_bytes=16 * streams.MiB, events_per_subject=5)
"""Events 6.4 MiB, commands and dead letters 1.6 MiB each: a flood fills them in moments."""
CHUNK = 64 * 1024
SUBJECT_OF = {
    subjects.Kind.EVENT: "gpuop.evt.hardware.{node}.discovered",
    subjects.Kind.COMMAND: "gpuop.cmd.discovery.{node}.rescan",
    subjects.Kind.DEAD_LETTER: "gpuop.dlq.gpuop.evt.hardware.{node}.discovered",
}


@pytest.fixture
async def bus(nats_server: NatsServer) -> AsyncIterator[NatsBus]:
    started = NatsBus(nats_server.url, limits=SMALL, name="limits-test")
    await started.start()
    try:
        yield started
    finally:
        await started.close()


async def state(bus: NatsBus, stream: str) -> tuple[int, int, int]:
    """(first sequence, messages, bytes) of `stream`."""
    info = await bus.js.stream_info(stream)
    return info.state.first_seq, info.state.messages, info.state.bytes


@pytest.mark.parametrize("flooded", list(SUBJECT_OF))
async def test_a_flood_on_one_stream_fills_that_stream_and_no_other(
    bus: NatsBus, flooded: subjects.Kind
) -> None:
    layouts = {layout.kind: layout for layout in streams.layouts("gpuop", limits=SMALL)}
    for subject in SUBJECT_OF.values():
        await bus.publish_raw(subject.format(node="before"), b"kept")
    before = {kind: await state(bus, layout.name) for kind, layout in layouts.items()}
    limit = layouts[flooded].share
    # spread over many subjects (nodes), so the byte limit, not the per-subject one, bounds it
    for n in range(2 * limit // CHUNK):
        await bus.publish_raw(SUBJECT_OF[flooded].format(node=f"n{n}"), b"x" * CHUNK)
    first, messages, used = await state(bus, layouts[flooded].name)
    assert used <= limit
    assert first > 1, "the oldest messages of the flooded stream go first"
    assert messages * CHUNK > limit // 2, "the flood filled its stream"
    for kind, layout in layouts.items():
        if kind is not flooded:
            assert await state(bus, layout.name) == before[kind], layout.name
            await bus.publish_raw(SUBJECT_OF[kind].format(node="after"), b"still accepted")
    kv = await bus.kv(Buckets.SAGAS)
    await kv.put("after-the-flood", b"written")
    account = await bus.js.account_info()
    assert account.storage < sum(SMALL.share(part) for part in streams.SHARES)


async def test_the_server_refuses_an_event_larger_than_the_log_stores(bus: NatsBus) -> None:
    """Any client meets the event log's own bound (a node's flood of 1 MB events, which would
    roll the log by bytes), not only gpuop's publisher, which refuses it first."""
    events = streams.layouts("gpuop", limits=SMALL)[0].name
    with pytest.raises(nats.js.errors.APIError) as refused:
        await bus.js.publish("gpuop.evt.driver.n1.loaded", b"x" * (streams.EVENT_BYTES + 1))
    assert "maximum" in str(refused.value.description), refused.value
    await bus.js.publish("gpuop.evt.driver.n1.loaded", b"x" * (streams.EVENT_BYTES - 64))
    assert (await state(bus, events))[1] == 1


async def test_heartbeats_beyond_their_bound_drop_the_oldest_heartbeats_not_other_events(
    bus: NatsBus,
) -> None:
    events = streams.layouts("gpuop", limits=SMALL)[0].name
    await bus.publish_raw("gpuop.evt.hardware.n1.discovered", b"the first inventory")
    await bus.publish_batch([heartbeat("n1", n) for n in range(1, 13)])
    await bus.publish_batch([heartbeat("n2", n) for n in range(1, 3)])
    await bus.publish_raw("gpuop.evt.driver.n1.installed", b"an install")
    kept = await collect(bus.read(HB_SUBJECT.replace("*", "n1")))
    assert [m.seq for m in kept] == list(range(9, 14)), "the last five of n1's twelve"
    assert len(await collect(bus.read(HB_SUBJECT.replace("*", "n2")))) == 2
    others = await collect(bus.read("gpuop.evt.*.n1.*"))
    assert {m.subject for m in others} == {
        "gpuop.evt.hardware.n1.discovered",
        "gpuop.evt.hardware.n1.heartbeat",
        "gpuop.evt.driver.n1.installed",
    }
    assert (await state(bus, events))[1] == 1 + 5 + 2 + 1


async def test_streams_and_buckets_made_before_the_limits_get_them_at_the_next_start(
    nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    old = NatsBus(nats_server.url, name="before-the-limits")
    await old.connect()
    try:
        for layout in streams.layouts("gpuop"):
            await old.js.add_stream(
                StreamConfig(
                    name=layout.name,
                    subjects=list(layout.subjects),
                    storage=StorageType.FILE,
                    max_age=layout.max_age,
                    duplicate_window=streams.DUPLICATE_WINDOW,
                )
            )
        await old.js.create_key_value(
            KeyValueConfig(bucket="gpuop_sagas", history=16, storage=StorageType.FILE)
        )
    finally:
        await old.close()
    caplog.set_level(logging.WARNING, logger="gpuop.bus")
    bus = NatsBus(nats_server.url, limits=SMALL)
    await bus.start()
    try:
        for layout in streams.layouts("gpuop", limits=SMALL):
            config = (await bus.js.stream_info(layout.name)).config
            assert config.max_bytes == layout.share, layout.name
            assert config.max_msgs_per_subject == layout.max_msgs_per_subject, layout.name
            assert (config.max_msg_size or -1) == layout.max_msg_size, layout.name
            assert config.discard == DiscardPolicy.OLD
            # `last` reads by direct get, which streams made before did not allow
            assert config.allow_direct is True, layout.name
        sagas = (await bus.js.stream_info("KV_gpuop_sagas")).config
        assert sagas.max_bytes == SMALL.share(Buckets.SAGAS)
        await bus.publish(heartbeat("n1", 1))
        last = await bus.last(HB_SUBJECT.replace("*", "n1"))
        assert last is not None and json.loads(last.data)["data"]["uptime_seconds"] == 1
        assert not any(name.startswith("Nats-S") for name in last.headers)  # the get's own
    finally:
        await bus.close()
    wanted = SMALL.share(subjects.Kind.EVENT)
    assert f"GPUOP_EVENTS exists with max_bytes -1 (gpuop wants {wanted})" in caplog.text
    assert "allow_direct False (gpuop wants True)" in caplog.text
    assert "max_msgs_per_subject -1 (gpuop wants 5)" in caplog.text
    assert f"max_msg_size -1 (gpuop wants {streams.EVENT_BYTES})" in caplog.text
    assert "bucket gpuop_sagas holds up to -1 bytes" in caplog.text
    # a later change of the limits reaches the running server the same way
    caplog.clear()
    larger = streams.StoreLimits(store_bytes=32 * streams.MiB, events_per_subject=10)
    again = NatsBus(nats_server.url, limits=larger)
    await again.start()
    try:
        events = (await again.js.stream_info("GPUOP_EVENTS")).config
        assert (events.max_bytes, events.max_msgs_per_subject) == (
            larger.share(subjects.Kind.EVENT),
            10,
        )
    finally:
        await again.close()
    assert "GPUOP_EVENTS exists with max_bytes" in caplog.text


async def test_every_service_may_start_again_on_the_default_limits(
    nats_server: NatsServer,
) -> None:
    """A create of an existing stream counts its limit again (nats-server 2.15): the
    default budget leaves room for that on the shipped server's 10 GiB store."""
    for _ in range(3):
        bus = NatsBus(nats_server.url)
        await bus.start()
        try:
            events = (await bus.js.stream_info("GPUOP_EVENTS")).config
        finally:
            await bus.close()
        assert events.max_bytes == streams.DEFAULT_LIMITS.share(subjects.Kind.EVENT)


async def test_a_restore_onto_three_replicas_keeps_each_streams_share_of_the_store(
    bus: NatsBus, nats_server: NatsServer, tmp_path: Path
) -> None:
    """A one-server backup restored as R3 reserves its limits three times: each replica
    holds a third, or the restore would ask three times the budget of the account."""
    await bus.publish(heartbeat("n1", 1))
    source = await nats.connect(nats_server.url)
    try:
        await backups.backup(source, "gpuop", tmp_path / "backup")
    finally:
        await source.close()
    async with NatsCluster(tmp_path / "cluster") as cluster:
        target = await nats.connect(cluster.urls)
        try:
            await backups.restore(target, "gpuop", tmp_path / "backup", replicas=3)
            js = target.jetstream()
            for layout in streams.layouts("gpuop", limits=SMALL):
                config = (await js.stream_info(layout.name)).config
                assert (config.num_replicas, config.max_bytes) == (3, layout.share // 3)
            sagas = (await js.stream_info("KV_gpuop_sagas")).config
            assert sagas.max_bytes == SMALL.share(Buckets.SAGAS) // 3
        finally:
            await target.close()
