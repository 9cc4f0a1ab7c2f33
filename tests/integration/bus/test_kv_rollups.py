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


async def made_before(nats_server: NatsServer, *buckets: KeyValueConfig | StreamConfig) -> None:
    """Buckets (or bare bucket streams) made before gpuop starts, as another client would."""
    old = NatsBus(nats_server.url, name="before")
    await old.connect()
    try:
        for bucket in buckets:
            if isinstance(bucket, KeyValueConfig):
                await old.js.create_key_value(bucket)
            else:
                await old.js.add_stream(bucket)
    finally:
        await old.close()


async def at_the_next_start(nats_server: NatsServer, *buckets: str) -> dict[str, StreamConfig]:
    """The streams of `buckets` once a gpuop service has started."""
    bus = NatsBus(nats_server.url, name="after")
    await bus.start()
    try:
        return {b: (await bus.js.stream_info(f"KV_gpuop_{b}")).config for b in buckets}
    finally:
        await bus.close()


async def test_a_bucket_made_with_roll_ups_has_them_turned_off_at_the_next_start(
    nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    await made_before(
        nats_server,
        KeyValueConfig(bucket="gpuop_ipam", history=16, storage=StorageType.FILE, direct=True),
    )
    caplog.set_level(logging.WARNING, logger="gpuop.bus")
    config = (await at_the_next_start(nats_server, "ipam"))["ipam"]
    assert not config.allow_rollup_hdrs
    # nor any value size (issue 37, finding 5): it gets gpuop's bound too
    assert config.max_msg_size == streams.VALUE_BYTES[Buckets.IPAM]
    assert "bucket gpuop_ipam allows roll-ups" in caplog.text
    assert "bucket gpuop_ipam takes messages of up to -1 bytes (gpuop wants 4096)" in caplog.text


async def test_a_bucket_made_first_to_drop_keys_keeps_them_from_the_next_start(
    nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 37, low: a bucket someone made before gpuop with a maximum age (or the
    old-first discard) would drop sagas or inventories silently; the next start gives it
    gpuop's (no age, new writes refused when full) and says so."""
    await made_before(
        nats_server,
        KeyValueConfig(bucket="gpuop_sagas", history=16, storage=StorageType.FILE, ttl=60),
        StreamConfig(
            name="KV_gpuop_nodes", subjects=["$KV.gpuop_nodes.>"], max_msgs_per_subject=16,
            discard=DiscardPolicy.OLD, allow_direct=True,
        ),
    )  # fmt: skip
    caplog.set_level(logging.WARNING, logger="gpuop.bus")
    for bucket, stream in (await at_the_next_start(nats_server, "sagas", "nodes")).items():
        assert not stream.max_age and stream.discard == DiscardPolicy.NEW, (bucket, stream)
    assert "bucket gpuop_sagas drops keys (max_age 60.0, discard" in caplog.text
    assert "bucket gpuop_nodes drops keys (max_age" in caplog.text
