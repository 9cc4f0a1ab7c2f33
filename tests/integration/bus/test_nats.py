"""What only a real nats-server does: persistence, restarts, crashed consumers, races."""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

import nats
import pytest
from nats.aio.msg import Msg

from gpuop.bus import (
    Buckets,
    ConsumerSpec,
    Delivery,
    KeyExists,
    NatsBus,
    NatsServer,
    consumers,
    streams,
    watching,
)
from gpuop.bus.errors import BusUnavailable, PublishTimeout
from gpuop.events import Envelope, device, driver, new_command
from gpuop.services.discovery import consumers as discovery_consumers
from tests.support.buses import (
    HB_SUBJECT,
    Recorder,
    collect,
    dead_letters,
    heartbeat,
    seq_of,
    wait_until,
)

pytestmark = pytest.mark.nats


async def test_server_restart_mid_stream_loses_nothing(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "nats")
    await server.start()
    bus = NatsBus(server.url, retry_for=20.0)
    await bus.start()

    async def slowly(delivery: Delivery) -> None:
        await asyncio.sleep(0.002)

    recorder = Recorder(slowly)
    sub = await bus.consume(ConsumerSpec("restart", [HB_SUBJECT], ack_wait=2.0), recorder)
    try:
        await bus.publish_batch([heartbeat(f"node-{i % 4}", i) for i in range(200)])
        await recorder.wait_for(20)
        await server.stop()
        await asyncio.sleep(1.0)
        await server.start()
        # published while the consumer was reconnecting
        await bus.publish_batch([heartbeat(f"node-{i % 4}", i) for i in range(200, 300)])
        await recorder.wait_for(300, timeout=30)
        await asyncio.sleep(0.5)
    finally:
        await sub.stop()
        await bus.close()
        await server.stop()
    handled = {seq_of(d) for d in recorder.seen}
    assert handled == set(range(300))
    for node in range(4):
        order = [seq_of(d) for d in recorder.seen if d.envelope.node == f"node-{node}"]
        first_seen = list(dict.fromkeys(order))
        assert first_seen == sorted(first_seen), f"node-{node} out of order"


async def test_messages_survive_a_server_restart_on_the_same_store(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "nats")
    await server.start()
    bus = NatsBus(server.url)
    await bus.start()
    await bus.publish_batch([heartbeat("n1", i) for i in range(10)])
    kv = await bus.kv(Buckets.SAGAS)
    await kv.put("n1", b"drain-required")
    await bus.close()
    await server.restart()
    bus = NatsBus(server.url)
    await bus.start()
    try:
        stored = await collect(bus.read(HB_SUBJECT))
        entry = await (await bus.kv(Buckets.SAGAS)).get("n1")
    finally:
        await bus.close()
        await server.stop()
    assert [m.seq for m in stored] == list(range(1, 11))
    assert entry is not None and entry.value == b"drain-required"


CRASHING_AGENT = """
import asyncio, sys
from gpuop.bus import ConsumerSpec, NatsBus

async def main():
    bus = NatsBus(sys.argv[1])
    await bus.start()

    async def hang(delivery):
        print("handling", flush=True)
        await asyncio.sleep(3600)

    await bus.consume(ConsumerSpec("agent", [sys.argv[2]], ack_wait=1.0), hang)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_killed_consumer_messages_are_redelivered_to_its_successor(
    nats_server: NatsServer,
) -> None:
    """A process SIGKILLed mid-handler never acks: the next process with the same durable
    name gets the message again after ack_wait, with the attempt counted."""
    bus = NatsBus(nats_server.url)
    await bus.start()
    agent = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CRASHING_AGENT,
        nats_server.url,
        HB_SUBJECT,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        await bus.publish(heartbeat("n1", 1))
        assert agent.stdout is not None
        line = await asyncio.wait_for(agent.stdout.readline(), 20)
        assert line == b"handling\n"
    finally:
        agent.kill()
        await agent.wait()
    successor = Recorder()
    sub = await bus.consume(ConsumerSpec("agent", [HB_SUBJECT], ack_wait=1.0), successor)
    seen = await successor.wait_for(1, timeout=10)
    await sub.stop()
    await bus.close()
    assert seq_of(seen[0]) == 1 and seen[0].attempt == 2


async def test_concurrent_creates_of_one_key_let_exactly_one_win(nats_server: NatsServer) -> None:
    buses = [NatsBus(nats_server.url) for _ in range(4)]
    for bus in buses:
        await bus.start()
    try:
        buckets = [await bus.kv(Buckets.IPAM) for bus in buses]
        results = await asyncio.gather(
            *(kv.create("net1.10_0_0_5", f"node-{i}".encode()) for i, kv in enumerate(buckets)),
            return_exceptions=True,
        )
    finally:
        for bus in buses:
            await bus.close()
    winners = [r for r in results if isinstance(r, int)]
    assert len(winners) == 1
    assert all(isinstance(r, KeyExists) for r in results if not isinstance(r, int))


async def test_publish_without_a_server_times_out_with_a_bus_error(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "nats")
    await server.start()
    bus = NatsBus(server.url, retry_for=1.0, publish_timeout=0.3)
    await bus.start()
    await server.stop()
    try:
        with pytest.raises(PublishTimeout):
            await bus.publish(heartbeat("n1", 1))
    finally:
        await bus.close()


async def test_connect_to_nothing_fails_clearly_without_the_password() -> None:
    bus = NatsBus("nats://driver-manager:s3cret@127.0.0.1:1", retry_for=0.5)
    with pytest.raises(BusUnavailable, match="cannot connect") as raised:
        await bus.start()
    assert "s3cret" not in str(raised.value)
    assert "nats://driver-manager:***@127.0.0.1:1" in str(raised.value)


async def test_retried_publish_after_restart_is_deduplicated(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "nats")
    await server.start()
    bus = NatsBus(server.url, retry_for=10.0)
    await bus.start()
    try:
        event = heartbeat("n1", 1)
        first = await bus.publish(event)
        await server.restart()
        again = await bus.publish(event, republish=True)
        stored = await collect(bus.read(HB_SUBJECT))
    finally:
        await bus.close()
        await server.stop()
    assert again.duplicate and again.seq == first.seq
    assert len(stored) == 1


async def test_listing_keys_often_leaves_no_consumers_behind(nats_server: NatsServer) -> None:
    bus = NatsBus(nats_server.url)
    await bus.start()
    client = await nats.connect(nats_server.url)
    try:
        sagas = await bus.kv(Buckets.SAGAS)
        await sagas.create("node-a", b"{}")
        await sagas.create("node-b", b"{}")
        await sagas.delete("node-b")
        for _ in range(30):  # the orchestrator lists its sagas on every reconcile
            assert await sagas.keys() == ["node-a"]
        stream = f"KV_{bus.prefix}_{Buckets.SAGAS}"
        js = client.jetstream()
        async with asyncio.timeout(20):  # the server reaps idle consumers every few seconds
            while (await js.stream_info(stream)).state.consumer_count:
                await asyncio.sleep(0.5)
    finally:
        await client.close()
        await bus.close()


async def test_a_consumer_dead_letters_a_message_stored_under_a_very_long_subject_and_carries_on(
    nats_server: NatsServer,
) -> None:
    # nats-server stores it (its protocol line fits in 4 KiB), but the line that would store a
    # dead letter under `gpuop.dlq.<subject>` would not, and the server would close the
    # consumer's connection for good
    bus = NatsBus(nats_server.url)
    await bus.start()
    raw = await nats.connect(nats_server.url)
    subject = "gpuop.evt.hardware." + "x" * 4040 + ".heartbeat"
    await raw.publish(subject, b"{not json")
    await raw.flush()
    await raw.close()
    recorder = Recorder()
    try:
        sub = await bus.consume(ConsumerSpec("long", [HB_SUBJECT]), recorder)
        await bus.publish(heartbeat("n1", 1))
        await recorder.wait_for(1)

        async def dead_lettered() -> bool:
            return bool(await dead_letters(bus))

        await wait_until(dead_lettered)
        (letter,) = await dead_letters(bus)
        await sub.stop()
    finally:
        await bus.close()
    assert letter.headers[streams.DLQ_SUBJECT] == subject
    assert streams.subject_matches("gpuop.dlq.gpuop.evt.hardware.*.heartbeat", letter.subject)
    assert letter.headers[streams.DLQ_KIND] == "malformed"
    assert letter.data == b"{not json"


async def test_a_port_taken_before_the_first_start_is_picked_again_and_then_kept(
    tmp_path: Path,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = NatsServer(tmp_path / "nats", port=port)
        try:
            url = await server.start()
            assert not url.endswith(f":{port}")  # another process held it: a new one
            assert await server.restart() == url  # a restart keeps it, for the clients
        finally:
            await server.stop()


async def test_a_server_that_cannot_start_says_why(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "nats", extra_config="no_such_setting {\n")
    with pytest.raises(BusUnavailable, match=r"did not start .*exited with 1; it said: .+"):
        await server.start()


async def test_an_idle_consumer_asks_again_as_soon_as_the_connection_is_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its pull request died with the old connection: waiting out that pull (made 60 s long
    here) would deliver nothing for a minute after every NATS restart."""
    monkeypatch.setattr(consumers, "IDLE_FETCH_SECONDS", 60.0)
    server = NatsServer(tmp_path / "nats")
    await server.start()
    bus = NatsBus(server.url, retry_for=20.0)
    await bus.start()
    recorder = Recorder()
    sub = await bus.consume(ConsumerSpec("idle", [HB_SUBJECT]), recorder)
    try:
        await bus.publish(heartbeat("node-0", 1))
        await recorder.wait_for(1)
        await asyncio.sleep(0.5)  # the consumer's next pull is out, waiting
        back = bus.reconnected
        await server.stop()
        await server.start()
        await asyncio.wait_for(back.wait(), timeout=20)
        await bus.publish(heartbeat("node-0", 2))
        await recorder.wait_for(2, timeout=20)
    finally:
        await sub.stop()
        await bus.close()
        await server.stop()
    assert [seq_of(d) for d in recorder.seen] == [1, 2]


async def test_a_durable_made_with_a_filter_list_keeps_its_position_as_a_single_filter(
    tmp_path: Path,
) -> None:
    """An upgrade: discovery's `commands` durable took its own and the operands' commands
    (a filter list in the body); it now takes the operands' only, with the filter in the
    create subject. The server updates the durable in place: acked commands stay acked, the
    pending pause is delivered, nothing is replayed."""
    node = "gpu-1"
    server = NatsServer(tmp_path / "nats")
    await server.start()
    bus = NatsBus(server.url)
    await bus.start()
    old = ConsumerSpec(
        "discovery-gpu-1-commands",
        ("gpuop.cmd.discovery.gpu-1.*", "gpuop.cmd.operands.gpu-1.*"),
    )

    def pause(n: int) -> Envelope:
        payload = device.PauseOperands(components=(driver.Component.GPU,), reason=f"r{n}")
        return new_command(payload, node=node, source="/test", id=f"pause-{n}")

    try:
        seen = Recorder()
        sub = await bus.consume(old, seen)
        await bus.publish(pause(1))
        await seen.wait_for(1)
        await sub.stop()
        await bus.publish(pause(2))
        new = discovery_consumers.node_commands("gpuop", node, retry_delay=0.1)
        assert new.durable == old.durable and list(new.subjects) == [old.subjects[1]]
        again = Recorder()
        sub = await bus.consume(new, again)
        await again.wait_for(1)
        await asyncio.sleep(0.3)  # nothing more comes
        await sub.stop()
        info = await bus.js.consumer_info("GPUOP_COMMANDS", new.durable)
    finally:
        await bus.close()
        await server.stop()
    assert [d.envelope.id for d in again.seen] == ["pause-2"]
    assert info.config.filter_subject == "gpuop.cmd.operands.gpu-1.*"
    assert not info.config.filter_subjects


async def test_a_watch_recreated_after_a_gap_takes_a_new_name_and_carries_on(
    nats_server: NatsServer,
) -> None:
    """An ordered consumer that misses a delivery is made again from the next stream
    sequence (nats-py's reset). A watch's consumer has a name, for the grants to bind its
    filter (gpuop.bus.watching): the old one still exists, so the new one needs a name of
    its own, or the server would refuse it as an update and the watch would go silent."""
    bus = NatsBus(nats_server.url)
    await bus.start()
    client = await nats.connect(nats_server.url)
    try:
        sagas = await bus.kv(Buckets.SAGAS)
        await sagas.put("node-a", b"1")
        stream = f"KV_{bus.prefix}_{Buckets.SAGAS}"
        seen: list[bytes] = []

        async def record(message: Msg) -> None:
            seen.append(message.data)

        async def saw(*values: bytes) -> bool:
            return seen == list(values)

        subscription, created = await watching.named_ordered(
            client.jetstream(),
            f"$KV.{bus.prefix}_{Buckets.SAGAS}.>",
            stream=stream,
            deliver=client.new_inbox(),
            cb=record,
        )
        first = created.name
        assert first.startswith(watching.NAME_PREFIX)
        await wait_until(lambda: saw(b"1"))
        # what nats-py does on a gap: a new consumer from the sequence after the last seen
        state = subscription._sub._jsi  # type: ignore[attr-defined]
        await state.reset_ordered_consumer(state._sseq + 1)
        await sagas.put("node-a", b"2")
        await wait_until(lambda: saw(b"1", b"2"))
        names = {info.name for info in await client.jsm().consumers_info(stream)}
        assert first in names and len(names) == 2, names
        await subscription.unsubscribe()
    finally:
        await client.close()
        await bus.close()
