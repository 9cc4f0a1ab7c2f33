"""`gpuop bus backup` and `gpuop bus restore` between two real nats-servers: what a restore
brings back (every message with its sequence, headers and time; KV revisions; durable
consumers; the dedupe window), a paused rollout resumed on the new server, and every way a
backup or a restore is refused."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig

from gpuop.bus import Buckets, NatsBus, NatsServer, RevisionConflict
from gpuop.bus import backup as backups
from gpuop.services.upgrade_orchestrator.store import SagaStore
from tests.support.buses import heartbeat
from tests.support.cli_runs import cli
from tests.support.sagas import NODE, Run, policy, saga_for

pytestmark = pytest.mark.nats

PREFIX = "gpuop"
STREAMS = backups.stream_names(PREFIX)


@dataclass
class Servers:
    a: NatsServer
    b: NatsServer


@pytest.fixture
async def servers(tmp_path: Path) -> AsyncIterator[Servers]:
    """Server A (the one backed up) and a new, empty server B, each with its own store."""
    a, b = NatsServer(tmp_path / "a"), NatsServer(tmp_path / "b")
    try:
        await a.start()
        await b.start()
        yield Servers(a, b)
    finally:
        await a.stop()
        await b.stop()


@contextlib.asynccontextmanager
async def connected(server: NatsServer) -> AsyncIterator[Client]:
    nc = await backups.connect([server.url])
    try:
        yield nc
    finally:
        await nc.close()


@contextlib.asynccontextmanager
async def started(server: NatsServer) -> AsyncIterator[NatsBus]:
    bus = NatsBus(server.url)
    await bus.start()
    try:
        yield bus
    finally:
        await bus.close()


async def back_up(server: NatsServer, directory: Path) -> backups.Manifest:
    async with connected(server) as nc:
        return await backups.backup(nc, PREFIX, directory)


async def restore(server: NatsServer, directory: Path, **options: Any) -> backups.Manifest:
    async with connected(server) as nc:
        return await backups.restore(nc, PREFIX, directory, **options)


async def stream_names_on(server: NatsServer) -> list[str]:
    async with connected(server) as nc:
        reply = await nc.request("$JS.API.STREAM.NAMES", b"", timeout=5)
    return sorted(json.loads(reply.data).get("streams") or [])


async def contents(bus: NatsBus, stream: str) -> list[tuple[Any, ...]]:
    """Every message of `stream` by sequence: (seq, subject, data, headers, time)."""
    state = (await bus.js.stream_info(stream)).state
    found = []
    for seq in range(state.first_seq, state.last_seq + 1):
        try:
            raw = await bus.js.get_msg(stream, seq)
        except nats.js.errors.NotFoundError:  # deleted, or a KV key's dropped history
            continue
        found.append((raw.seq, raw.subject, raw.data, raw.headers, raw.time))
    return found


async def fill(bus: NatsBus) -> None:
    """Events, commands, a dead letter, KV writes of every kind, and a durable consumer
    two messages in."""
    await bus.publish_batch([heartbeat(f"gpu-{i % 3}", i) for i in range(12)])
    for n in range(3):
        await bus.publish_raw(
            f"gpuop.cmd.discovery.gpu-{n}.rescan", b'{"n": %d}' % n, {"Nats-Msg-Id": f"cmd-{n}"}
        )
    await bus.publish_raw(
        "gpuop.dlq.gpuop.evt.hardware.gpu-0.heartbeat", b"not json", {"Nats-Msg-Id": "dlq-1"}
    )
    sagas = await bus.kv(Buckets.SAGAS)
    revision = await sagas.create("gpu-0", b"upgrade-required")
    await sagas.update("gpu-0", b"cordon-required", revision)
    await sagas.put("gpu-1", b"upgrade-done")
    await (await bus.kv(Buckets.NODES)).put("gpu-0", b'{"gpus": 8}')
    await (await bus.kv(Buckets.CONFIG)).put("policy", b'{"paused": false}')
    ipam = await bus.kv(Buckets.IPAM)
    await ipam.create("10.0.0.1", b"gpu-0")
    await ipam.create("10.0.0.2", b"gpu-1")
    await ipam.delete("10.0.0.2")
    await bus.js.add_consumer(
        "GPUOP_EVENTS", ConsumerConfig(durable_name="audit", ack_policy=AckPolicy.EXPLICIT)
    )
    reader = await bus.js.pull_subscribe_bind(durable="audit", stream="GPUOP_EVENTS")
    try:
        for message in await reader.fetch(2, timeout=5):
            await message.ack_sync()
    finally:
        await reader.unsubscribe()


async def test_a_restore_on_a_new_server_brings_back_every_message_revision_and_consumer(
    servers: Servers, tmp_path: Path
) -> None:
    directory = tmp_path / "backup"
    async with started(servers.a) as bus_a:
        await fill(bus_a)
        manifest = await back_up(servers.a, directory)
        assert [entry.name for entry in manifest.streams] == STREAMS
        assert manifest.prefix == PREFIX and manifest.server_version.startswith("2.")
        events = next(e for e in manifest.streams if e.name == "GPUOP_EVENTS")
        assert (events.messages, events.first_seq, events.last_seq) == (12, 1, 12)
        assert sorted(p.name for p in directory.iterdir()) == sorted(
            [backups.MANIFEST]
            + [f"{name}.tar.s2" for name in STREAMS]
            + [f"{name}.json" for name in STREAMS]
        )

        restored = await restore(servers.b, directory)
        assert restored == manifest

        async with started(servers.b) as bus_b:  # a service starting on B changes nothing
            for stream in STREAMS:
                assert await contents(bus_b, stream) == await contents(bus_a, stream), stream
            first = (await bus_b.js.get_msg("GPUOP_EVENTS", 1)).headers or {}
            assert first.get("Nats-Msg-Id"), "the event id header came back"

            # KV: the same values at the same revisions, so compare-and-set goes on
            sagas_a, sagas_b = await bus_a.kv(Buckets.SAGAS), await bus_b.kv(Buckets.SAGAS)
            for key in ("gpu-0", "gpu-1"):
                assert await sagas_b.get(key) == await sagas_a.get(key)
            entry = await sagas_b.get("gpu-0")
            assert entry is not None and entry.revision == 2
            with pytest.raises(RevisionConflict):
                await sagas_b.update("gpu-0", b"stale", 1)
            assert await sagas_b.update("gpu-0", b"drain-required", entry.revision) > 2
            ipam_b = await bus_b.kv(Buckets.IPAM)
            assert await ipam_b.keys() == ["10.0.0.1"]
            assert await ipam_b.get("10.0.0.2") is None  # the delete came back too
            assert await (await bus_b.kv(Buckets.NODES)).keys() == ["gpu-0"]

            # the durable consumer came back where it was: two acked, ten to go
            audit = await bus_b.js.consumer_info("GPUOP_EVENTS", "audit")
            assert audit.ack_floor.stream_seq == 2 and audit.num_pending == 10

            # the dedupe window: nats-server (2.15) does not rebuild it on a restore, so an
            # event id stored on A, published again on B within the window, is stored again;
            # from then on B drops repeats as usual
            ack = await bus_b.publish(heartbeat("gpu-0", 0, id=first["Nats-Msg-Id"]))
            assert (ack.seq, ack.duplicate) == (13, False)
            again = await bus_b.publish(
                heartbeat("gpu-0", 0, id=first["Nats-Msg-Id"]), republish=True
            )
            assert (again.seq, again.duplicate) == (13, True)
            second = (await bus_b.js.get_msg("GPUOP_EVENTS", 2)).headers or {}

    # a restart of the server rebuilds the window from the stored messages
    await servers.b.restart()
    async with started(servers.b) as bus_b:
        ack = await bus_b.publish(heartbeat("gpu-1", 1, id=second["Nats-Msg-Id"]), republish=True)
        assert (ack.seq, ack.duplicate) == (2, True)


async def test_a_snapshot_of_many_chunks_is_acked_chunk_by_chunk_and_comes_back_whole(
    servers: Servers, tmp_path: Path
) -> None:
    directory = tmp_path / "backup"
    async with started(servers.a) as bus_a:
        nodes = await bus_a.kv(Buckets.NODES)
        for n in range(24):  # incompressible: about 400 KB of snapshot
            await nodes.put(f"gpu-{n}", os.urandom(16 * 1024))
        async with connected(servers.a) as nc:
            # 8 KiB chunks: dozens, each with a flow-control reply, and a short last one
            manifest = await backups.backup(nc, PREFIX, directory, chunk_size=8 * 1024)
        entry = next(e for e in manifest.streams if e.name == "KV_gpuop_nodes")
        assert entry.snapshot_size > 40 * 8 * 1024
        await restore(servers.b, directory)  # sent in several chunks of 128 KiB
        async with started(servers.b) as bus_b:
            assert await contents(bus_b, "KV_gpuop_nodes") == await contents(
                bus_a, "KV_gpuop_nodes"
            )


async def test_a_paused_rollout_resumes_on_the_restored_server(
    servers: Servers, tmp_path: Path
) -> None:
    paused = policy(paused=True)
    async with started(servers.a) as bus_a:
        store_a = await SagaStore.open(bus_a)
        stored_a = await store_a.create(saga_for(paused))
        other = Run(policy(), saga_for(policy(), node="gpu-node-2"))
        other.admit()  # a node already under way when the rollout was paused
        await store_a.create(other.saga)
        await back_up(servers.a, tmp_path / "backup")
    await restore(servers.b, tmp_path / "backup")

    async with started(servers.b) as bus_b:
        store_b = await SagaStore.open(bus_b)
        stored_b = await store_b.get(NODE)
        assert stored_b == stored_a
        assert [s.saga for s in await store_b.all()] == [stored_a.saga, other.saga]
        # resume: the core admits the node under the unpaused policy, and the orchestrator
        # writes the result over the revision it read, which the restore kept
        run = Run(policy(), stored_b.saga)
        decision = run.admit()
        assert decision.saga.state != stored_b.saga.state
        replaced = await store_b.replace(decision.saga, stored_b.revision)
        assert replaced.revision > stored_b.revision
        assert await SagaStore(await bus_b.kv(Buckets.SAGAS)).get(NODE) == replaced
        with pytest.raises(RevisionConflict):  # the revision read before the resume is stale
            await store_b.replace(decision.saga, stored_b.revision)


async def test_a_corrupt_or_truncated_snapshot_is_refused_before_anything_is_created(
    servers: Servers, tmp_path: Path
) -> None:
    directory = tmp_path / "backup"
    async with started(servers.a) as bus_a:
        await fill(bus_a)
        await back_up(servers.a, directory)
    snapshot = directory / "KV_gpuop_sagas.tar.s2"
    good = snapshot.read_bytes()

    snapshot.write_bytes(good[:-1] + bytes([good[-1] ^ 0xFF]))  # same size, one bit off
    with pytest.raises(backups.BackupInvalid, match=r"KV_gpuop_sagas\.tar\.s2: checksum mismatch"):
        await restore(servers.b, directory)
    snapshot.write_bytes(good[: len(good) // 2])
    with pytest.raises(backups.BackupInvalid, match=r"KV_gpuop_sagas\.tar\.s2 has .* truncated"):
        await restore(servers.b, directory)
    snapshot.unlink()
    with pytest.raises(backups.BackupInvalid, match=r"KV_gpuop_sagas\.tar\.s2 is missing"):
        await restore(servers.b, directory)
    assert await stream_names_on(servers.b) == []

    snapshot.write_bytes(good)
    meta = directory / "GPUOP_EVENTS.json"
    meta.write_text(meta.read_text().replace('"GPUOP_EVENTS"', '"GPUOP_OTHER"'))
    with pytest.raises(backups.BackupInvalid, match=r"GPUOP_EVENTS\.json: checksum mismatch"):
        await restore(servers.b, directory)
    assert await stream_names_on(servers.b) == []


async def test_a_bad_manifest_or_directory_is_refused(servers: Servers, tmp_path: Path) -> None:
    with pytest.raises(backups.BackupInvalid, match="no such directory"):
        await restore(servers.b, tmp_path / "nowhere")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(backups.BackupInvalid, match=r"manifest\.json not found"):
        await restore(servers.b, empty)
    (empty / "manifest.json").write_text("{not json")
    with pytest.raises(backups.BackupInvalid, match="is not JSON"):
        await restore(servers.b, empty)
    (empty / "manifest.json").write_text(json.dumps({"format": 1, "prefix": "gpuop"}))
    with pytest.raises(backups.BackupInvalid, match="not a gpuop backup manifest"):
        await restore(servers.b, empty)
    (empty / "manifest.json").write_text(json.dumps({"format": 99}))
    with pytest.raises(backups.BackupInvalid, match="format 99"):
        await restore(servers.b, empty)

    async with started(servers.a):
        await back_up(servers.a, tmp_path / "backup")
    with pytest.raises(backups.BackupInvalid, match="prefix 'gpuop', not 'other'"):
        async with connected(servers.b) as nc:
            await backups.restore(nc, "other", tmp_path / "backup")
    with pytest.raises(ValueError, match="1 to 5"):
        await restore(servers.b, tmp_path / "backup", replicas=0)
    assert await stream_names_on(servers.b) == []
    with pytest.raises(backups.BackupInvalid, match="not empty"):  # a backup never overwrites
        await back_up(servers.a, tmp_path / "backup")


async def test_restoring_onto_existing_streams_needs_force_and_then_replaces_them(
    servers: Servers, tmp_path: Path
) -> None:
    directory = tmp_path / "backup"
    async with started(servers.a) as bus_a:
        await fill(bus_a)
        await back_up(servers.a, directory)
        async with started(servers.b) as bus_b:  # B has gpuop's streams, with other contents
            await bus_b.publish(heartbeat("elsewhere", 99))
            with pytest.raises(backups.StreamExists, match="GPUOP_EVENTS, GPUOP_COMMANDS") as e:
                await restore(servers.b, directory)
            assert e.value.names == tuple(STREAMS)
            assert "--force" in str(e.value)
            assert (await bus_b.js.stream_info("GPUOP_EVENTS")).state.messages == 1

            await restore(servers.b, directory, force=True, replicas=1)
            for stream in STREAMS:
                assert await contents(bus_b, stream) == await contents(bus_a, stream), stream


async def test_a_server_without_one_of_the_streams_is_not_backed_up(
    servers: Servers, tmp_path: Path
) -> None:
    async with started(servers.a) as bus_a:
        await bus_a.js.delete_stream("GPUOP_DLQ")
        await bus_a.js.delete_key_value("gpuop_ipam")
        with pytest.raises(backups.StreamMissing, match="GPUOP_DLQ, KV_gpuop_ipam not found"):
            await back_up(servers.a, tmp_path / "backup")
    assert not (tmp_path / "backup").exists()  # nothing was written


async def test_the_commands_print_each_stream_and_exit_as_the_cli_does(
    servers: Servers, tmp_path: Path
) -> None:
    directory = str(tmp_path / "backup")
    a, b = ["--nats", servers.a.url], ["--nats", servers.b.url]
    async with started(servers.a) as bus_a:
        await fill(bus_a)
    code, out, err = await cli("bus", "backup", directory, *a)
    assert code == 0, err
    lines = out.splitlines()
    assert [line.split()[0] for line in lines] == STREAMS
    assert lines[0].split()[1:] == ["12", "messages", lines[0].split()[3], "bytes"]
    assert f"backed up 7 streams to {directory}" in err

    code, _, err = await cli("bus", "backup", directory, *a)
    assert code == 2 and "is not empty" in err
    code, out, err = await cli("bus", "restore", directory, *b)
    assert code == 0, err
    assert out == "\n".join(lines) + "\n" and "restored 7 streams" in err
    code, _, err = await cli("bus", "restore", directory, *b)
    assert code == 1 and "GPUOP_EVENTS" in err and "--force" in err
    assert err.startswith("gpuop bus restore: ")
    code, _, err = await cli("bus", "restore", directory, "--force", "--replicas", "1", *b)
    assert code == 0, err

    code, _, err = await cli("bus", "restore", str(tmp_path / "nowhere"), *b)
    assert code == 2 and "no such directory" in err
    snapshot = tmp_path / "backup" / "GPUOP_COMMANDS.tar.s2"
    snapshot.write_bytes(snapshot.read_bytes() + b"\0")
    code, _, err = await cli("bus", "restore", directory, "--force", *b)
    assert code == 2 and "GPUOP_COMMANDS.tar.s2" in err
    (tmp_path / "backup" / "manifest.json").write_text("[]")
    code, _, err = await cli("bus", "restore", directory, *b)
    assert code == 2 and "manifest" in err
    code, _, err = await cli("bus", "restore", directory, "--replicas", "0", *b)
    assert code == 2 and "--replicas" in err
    await servers.a.stop()
    code, _, err = await cli("bus", "backup", str(tmp_path / "again"), *a)
    assert code == 1 and "cannot connect" in err
