"""No bucket takes a roll-up, on a real nats-server: a write of one key with
`Nats-Rollup: all` would empty the whole bucket, so whoever may write one key (a node agent
its own) could delete every other node's keys. Buckets are made without roll-ups, and one
made before (by nats-py's KV, which turns them on) has them turned off at the next start."""

from __future__ import annotations

import logging

import nats.js.errors
import pytest
from nats.js.api import DiscardPolicy, KeyValueConfig, StorageType, StreamConfig

from gpuop.bus import Buckets, NatsBus, NatsServer, streams

pytestmark = [pytest.mark.nats, pytest.mark.security]


async def test_a_roll_up_of_the_whole_bucket_is_refused_and_every_key_kept(
    nats_server: NatsServer,
) -> None:
    bus = NatsBus(nats_server.url, name="rollups")
    await bus.start()
    try:
        ipam = await bus.kv(Buckets.IPAM)
        await ipam.put("claim.gpu-1.10.10.0.0_24.10.10.0.7", b"gpu-1's")
        for rollup in ("all", "sub"):
            with pytest.raises(nats.js.errors.APIError, match="rollup not permitted"):
                await bus.js.publish(
                    "$KV.gpuop_ipam.claim.gpu-2.10.10.0.0_24.10.10.0.8",
                    b"{}",
                    headers={"Nats-Rollup": rollup},
                )
        for bucket in Buckets:
            stream = (await bus.js.stream_info(f"KV_gpuop_{bucket.value}")).config
            assert not stream.allow_rollup_hdrs, bucket
            assert stream.deny_delete and stream.max_msgs_per_subject == 16, bucket
        assert await ipam.keys() == ["claim.gpu-1.10.10.0.0_24.10.10.0.7"]
        await ipam.delete("claim.gpu-1.10.10.0.0_24.10.10.0.7")  # a delete is no roll-up
        assert await ipam.keys() == []
    finally:
        await bus.close()


async def test_a_bucket_made_with_roll_ups_has_them_turned_off_at_the_next_start(
    nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    old = NatsBus(nats_server.url, name="before")
    await old.connect()
    try:
        await old.js.create_key_value(
            KeyValueConfig(bucket="gpuop_ipam", history=16, storage=StorageType.FILE, direct=True)
        )
        assert (await old.js.stream_info("KV_gpuop_ipam")).config.allow_rollup_hdrs
    finally:
        await old.close()
    caplog.set_level(logging.WARNING, logger="gpuop.bus")
    bus = NatsBus(nats_server.url, name="after")
    await bus.start()
    try:
        config = (await bus.js.stream_info("KV_gpuop_ipam")).config
        assert not config.allow_rollup_hdrs
        # nor any value size (issue 37, finding 5): it gets gpuop's bound too
        assert config.max_msg_size == streams.VALUE_BYTES[Buckets.IPAM]
    finally:
        await bus.close()
    assert "bucket gpuop_ipam allows roll-ups" in caplog.text
    assert "bucket gpuop_ipam takes messages of up to -1 bytes (gpuop wants 4096)" in caplog.text


async def test_a_bucket_made_first_to_drop_keys_keeps_them_from_the_next_start(
    nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 37, low: a bucket someone made before gpuop with a maximum age (or the
    old-first discard) would drop sagas or address claims silently; the next start gives it
    gpuop's (no age, new writes refused when full) and says so."""
    old = NatsBus(nats_server.url, name="before")
    await old.connect()
    try:
        await old.js.create_key_value(
            KeyValueConfig(bucket="gpuop_sagas", history=16, storage=StorageType.FILE, ttl=60)
        )
        made = (await old.js.stream_info("KV_gpuop_sagas")).config
        assert made.max_age == 60 and made.discard == DiscardPolicy.NEW
        await old.js.add_stream(
            StreamConfig(
                name="KV_gpuop_nodes", subjects=["$KV.gpuop_nodes.>"], max_msgs_per_subject=16,
                discard=DiscardPolicy.OLD, allow_direct=True,
            )
        )  # fmt: skip
    finally:
        await old.close()
    caplog.set_level(logging.WARNING, logger="gpuop.bus")
    bus = NatsBus(nats_server.url, name="after")
    await bus.start()
    try:
        for bucket in ("sagas", "nodes"):
            stream = (await bus.js.stream_info(f"KV_gpuop_{bucket}")).config
            assert not stream.max_age and stream.discard == DiscardPolicy.NEW, (bucket, stream)
    finally:
        await bus.close()
    assert "bucket gpuop_sagas drops keys (max_age 60.0, discard" in caplog.text
    assert "bucket gpuop_nodes drops keys (max_age" in caplog.text
