"""The bus contract: every test runs against `InMemoryBus` and against `NatsBus` on a real
nats-server, so the in-memory bus used by unit tests cannot drift from production."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from opentelemetry import trace

from gpuop.bus import (
    Buckets,
    Bus,
    ConsumerSpec,
    Delivery,
    InMemoryBus,
    KeyExists,
    MessageTooLarge,
    NatsBus,
    NatsServer,
    PermanentError,
    RevisionConflict,
    TemporaryError,
    dispatching,
    streams,
)
from gpuop.bus.errors import BusUnavailable, IdTaken, PublishTimeout
from gpuop.events import new_event
from gpuop.events import upgrade as up
from gpuop.observability import tracing
from gpuop.observability.metrics import registry
from tests.support.buses import (
    HB_SUBJECT,
    Recorder,
    collect,
    dead_letters,
    heartbeat,
    publish_raw,
    seq_of,
    wait_until,
)
from tests.support.waiting import eventually


@pytest.fixture(params=["memory", "nats"])
async def bus(request: pytest.FixtureRequest, tmp_path) -> AsyncIterator[Bus]:
    server: NatsServer | None = None
    if request.param == "memory":
        implementation: Bus = InMemoryBus()
    else:
        server = NatsServer(tmp_path / "nats")
        await server.start()
        implementation = NatsBus(server.url, retry_for=5.0)
    await implementation.start()
    try:
        yield implementation
    finally:
        await implementation.close()
        if server is not None:
            await server.stop()


def spec(name: str = "test", **overrides: object) -> ConsumerSpec:
    settings: dict[str, object] = {"durable": name, "subjects": [HB_SUBJECT]}
    settings.update(overrides)
    return ConsumerSpec(**settings)  # type: ignore[arg-type]


async def test_published_event_reaches_handler_with_typed_payload(bus: Bus) -> None:
    recorder = Recorder()
    sub = await bus.consume(spec(), recorder)
    ack = await bus.publish(heartbeat("gpu-1.example.com", 7))
    seen = await recorder.wait_for(1)
    await sub.stop()
    assert ack.seq == 1 and not ack.duplicate
    assert seen[0].subject == "gpuop.evt.hardware.gpu-1_example_com.heartbeat"
    assert seen[0].envelope.node == "gpu-1.example.com"
    assert seq_of(seen[0]) == 7 and seen[0].attempt == 1


async def test_duplicate_event_id_is_stored_once(bus: Bus) -> None:
    first = await bus.publish(heartbeat("n1", 1, id="same-id"))
    again = await bus.publish(heartbeat("n1", 1, id="same-id"), republish=True)
    assert again.duplicate and again.seq == first.seq
    (batched,) = await bus.publish_batch([heartbeat("n1", 1, id="same-id")], republish=True)
    assert batched.duplicate and batched.seq == first.seq
    stored = await collect(bus.read(HB_SUBJECT))
    assert [m.seq for m in stored] == [first.seq]


async def test_a_first_publish_answered_as_a_duplicate_is_an_alarm_not_a_success(
    bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    """Someone stored our id first: the message was dropped, and the caller must know."""
    taken = registry().get_sample_value("gpuop_bus_ids_taken_total", {"kind": "evt"}) or 0.0
    first = await bus.publish(heartbeat("n1", 1, id="squatted"))
    with pytest.raises(IdTaken, match=r"gpuop\.evt\.hardware\.n1\.heartbeat") as raised:
        await bus.publish(heartbeat("n1", 2, id="squatted"))
    assert raised.value.seq == first.seq
    with pytest.raises(IdTaken):
        await bus.publish_batch([heartbeat("n1", 3), heartbeat("n1", 2, id="squatted")])
    assert any(
        r.levelname == "ERROR" and "heartbeat dropped as a duplicate" in r.getMessage()
        for r in caplog.records
    )
    assert registry().get_sample_value("gpuop_bus_ids_taken_total", {"kind": "evt"}) == taken + 2
    stored = await collect(bus.read(HB_SUBJECT))
    assert [m.seq for m in stored] == [first.seq, first.seq + 1]


async def test_durable_consumer_resumes_after_last_ack(bus: Bus) -> None:
    recorder = Recorder()
    sub = await bus.consume(spec(), recorder)
    await bus.publish(heartbeat("n1", 1))
    await recorder.wait_for(1)
    await sub.stop()
    await bus.publish(heartbeat("n1", 2))
    again = Recorder()
    sub = await bus.consume(spec(), again)
    seen = await again.wait_for(1)
    await asyncio.sleep(0.2)
    await sub.stop()
    assert [seq_of(d) for d in again.seen] == [2] == [seq_of(d) for d in seen]


async def test_temporary_error_is_redelivered_after_its_delay(bus: Bus) -> None:
    async def fail_first(delivery: Delivery) -> None:
        if delivery.attempt == 1:
            raise TemporaryError("not yet", delay=0.3)

    recorder = Recorder(fail_first)
    sub = await bus.consume(spec(), recorder)
    await bus.publish(heartbeat("n1", 1))
    first = (await recorder.wait_for(1))[0]
    started = asyncio.get_running_loop().time()
    second = (await recorder.wait_for(2))[1]
    waited = asyncio.get_running_loop().time() - started
    await sub.stop()
    assert (first.attempt, second.attempt) == (1, 2)
    assert waited >= 0.2
    assert await dead_letters(bus) == []


async def test_permanent_error_dead_letters_with_reason_and_consumer_continues(bus: Bus) -> None:
    async def reject_first(delivery: Delivery) -> None:
        if seq_of(delivery) == 1:
            raise PermanentError("node n1 does not exist")

    recorder = Recorder(reject_first)
    sub = await bus.consume(spec(), recorder)
    await bus.publish(heartbeat("n1", 1))
    await bus.publish(heartbeat("n1", 2))
    await recorder.wait_for(2)
    await wait_until(lambda: _has_dead_letters(bus, 1))
    await sub.stop()
    (letter,) = await dead_letters(bus)
    assert letter.subject == "gpuop.dlq.gpuop.evt.hardware.n1.heartbeat"
    assert letter.headers[streams.DLQ_KIND] == "permanent"
    assert letter.headers[streams.DLQ_REASON] == "node n1 does not exist"
    assert letter.headers[streams.DLQ_CONSUMER] == "test"
    assert json.loads(letter.data)["data"]["uptime_seconds"] == 1


async def test_malformed_payload_is_dead_lettered_and_never_reaches_handler(bus: Bus) -> None:
    recorder = Recorder()
    sub = await bus.consume(spec(), recorder)
    await publish_raw(bus, "gpuop.evt.hardware.n1.heartbeat", b"{not json")
    await bus.publish(heartbeat("n1", 2))
    await recorder.wait_for(1)
    await wait_until(lambda: _has_dead_letters(bus, 1))
    await sub.stop()
    (letter,) = await dead_letters(bus)
    assert letter.data == b"{not json"
    assert letter.headers[streams.DLQ_KIND] == "malformed"
    assert "not JSON" in letter.headers[streams.DLQ_REASON]
    assert [seq_of(d) for d in recorder.seen] == [2]


async def test_a_message_over_the_payload_limit_is_refused_and_the_bus_carries_on(
    bus: Bus,
) -> None:
    limit = bus.max_payload
    with pytest.raises(MessageTooLarge):
        await publish_raw(bus, "gpuop.evt.hardware.n1.heartbeat", b"x" * (limit + 1))
    with pytest.raises(MessageTooLarge):  # the headers count too
        await bus.publish_raw("gpuop.evt.hardware.n1.heartbeat", b"x" * limit, {"a": "b"})
    recorder = Recorder()
    sub = await bus.consume(spec(), recorder)
    await bus.publish(heartbeat("n1", 1))
    await recorder.wait_for(1)
    await sub.stop()


async def test_a_malformed_message_at_the_payload_limit_is_dead_lettered_cut_to_fit(
    bus: Bus,
) -> None:
    """Only a command can be that large: the event log stores none over `EVENT_BYTES`."""
    subject = "gpuop.cmd.driver-manager.n1.install"
    big = b"{" + b"x" * (bus.max_payload - 100)
    await publish_raw(bus, subject, big)
    await publish_raw(bus, subject, b"{ after it")
    sub = await bus.consume(spec(subjects=[subject]), Recorder())
    # the consumer's connection survived the first dead letter: it dead-letters the second
    await wait_until(lambda: _has_dead_letters(bus, 2))
    await sub.stop()
    letter, after = await dead_letters(bus)
    assert letter.headers[streams.DLQ_KIND] == "malformed"
    assert letter.headers[streams.DLQ_TRUNCATED] == str(len(big))
    assert big.startswith(letter.data) and len(letter.data) > len(big) - 2048
    assert after.data == b"{ after it" and streams.DLQ_TRUNCATED not in after.headers


@pytest.mark.security
async def test_an_event_over_what_the_log_stores_is_refused_and_the_bus_carries_on(
    bus: Bus,
) -> None:
    """A node's flood of events as large as the account takes would roll the log by bytes
    (`streams.EVENT_BYTES`); the server refuses them, and so does the product's publisher."""
    with pytest.raises(MessageTooLarge, match="the event log stores"):
        await publish_raw(bus, HB_SUBJECT, b"x" * (streams.EVENT_BYTES + 1))
    await publish_raw(bus, "gpuop.cmd.driver-manager.n1.install", b"x" * streams.EVENT_BYTES)
    recorder = Recorder()
    sub = await bus.consume(spec(), recorder)
    await bus.publish(heartbeat("n1", 1))
    await recorder.wait_for(1)
    await sub.stop()
    print(
        f"\nan event of {streams.EVENT_BYTES + 1} bytes on {HB_SUBJECT}: refused (the event "
        f"log stores at most {streams.EVENT_BYTES})"
    )


@pytest.mark.security
async def test_envelope_about_another_node_is_dead_lettered(bus: Bus) -> None:
    recorder = Recorder()
    sub = await bus.consume(spec(), recorder)
    forged = heartbeat("victim", 1).to_bytes()
    await publish_raw(bus, "gpuop.evt.hardware.attacker.heartbeat", forged)
    await wait_until(lambda: _has_dead_letters(bus, 1))
    await sub.stop()
    (letter,) = await dead_letters(bus)
    reason = letter.headers[streams.DLQ_REASON]
    assert "travels on gpuop.evt.hardware.victim.heartbeat, not" in reason
    assert recorder.seen == []


@pytest.mark.security
async def test_an_event_on_another_types_subject_is_dead_lettered(bus: Bus) -> None:
    """A credential that may publish heartbeats cannot pass off another type on that subject
    (a forged admission would skip maxUnavailable)."""
    recorder = Recorder()
    sub = await bus.consume(spec(), recorder)
    admitted = up.NodeAdmitted(rollout_id="r-1", saga_id="s-1")
    forged = new_event(admitted, node="n1", source="/gpuop/upgrade-orchestrator")
    await publish_raw(bus, "gpuop.evt.hardware.n1.heartbeat", forged.to_bytes())
    await bus.publish(heartbeat("n1", 2))
    await recorder.wait_for(1)
    await wait_until(lambda: _has_dead_letters(bus, 1))
    await sub.stop()
    (letter,) = await dead_letters(bus)
    assert letter.headers[streams.DLQ_KIND] == "malformed"
    reason = letter.headers[streams.DLQ_REASON]
    assert "io.gpuop.upgrade.admitted.v1" in reason and "gpuop.evt.upgrade.n1.admitted" in reason
    assert [seq_of(d) for d in recorder.seen] == [2]  # only the real heartbeat was handled


async def test_unknown_newer_type_is_acked_not_dead_lettered(bus: Bus) -> None:
    recorder = Recorder()
    sub = await bus.consume(spec(), recorder)
    document = json.loads(heartbeat("n1", 1).to_bytes())
    document["type"] = "io.gpuop.hardware.heartbeat.v9"
    await publish_raw(bus, "gpuop.evt.hardware.n1.heartbeat", json.dumps(document).encode())
    await bus.publish(heartbeat("n1", 2))
    await recorder.wait_for(1)
    await sub.stop()
    assert [seq_of(d) for d in recorder.seen] == [2]
    assert await dead_letters(bus) == []


async def test_max_deliver_bounds_a_message_that_always_fails(bus: Bus) -> None:
    async def always(delivery: Delivery) -> None:
        raise TemporaryError("still broken", delay=0.05)

    recorder = Recorder(always)
    sub = await bus.consume(spec(max_deliver=3), recorder)
    await bus.publish(heartbeat("n1", 1))
    await wait_until(lambda: _has_dead_letters(bus, 1))
    await asyncio.sleep(0.3)
    await sub.stop()
    assert [d.attempt for d in recorder.seen] == [1, 2, 3]
    (letter,) = await dead_letters(bus)
    assert letter.headers[streams.DLQ_KIND] == "max_deliver"
    assert "still broken" in letter.headers[streams.DLQ_REASON]


async def test_a_bus_failing_under_the_handler_spends_no_delivery_attempt(bus: Bus) -> None:
    async def bus_down_twice(delivery: Delivery) -> None:
        if len(recorder.seen) <= 2:
            raise PublishTimeout("the stream's leader is being elected")

    recorder = Recorder(bus_down_twice)
    sub = await bus.consume(spec(max_deliver=2), recorder)
    await bus.publish(heartbeat("n1", 1))
    seen = await recorder.wait_for(3)
    await asyncio.sleep(0.2)
    await sub.stop()
    # called again in place: the same delivery, attempt 1 each time, then acked
    assert [d.attempt for d in seen] == [1, 1, 1]
    assert await dead_letters(bus) == []


async def test_a_bus_that_stays_down_hands_the_message_back_after_the_patience(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dispatching, "BUS_PATIENCE", 0.3)

    async def never(delivery: Delivery) -> None:
        raise BusUnavailable("no server answers")

    recorder = Recorder(never)
    sub = await bus.consume(spec(max_deliver=2, retry_delay=0.05), recorder)
    await bus.publish(heartbeat("n1", 1))
    await wait_until(lambda: _has_dead_letters(bus, 1), timeout=10)
    await sub.stop()
    assert {d.attempt for d in recorder.seen} == {1, 2}
    (letter,) = await dead_letters(bus)
    assert "no server answers" in letter.headers[streams.DLQ_REASON]


async def test_unknown_exception_is_retried_by_default(bus: Bus) -> None:
    async def crash_once(delivery: Delivery) -> None:
        if delivery.attempt == 1:
            raise RuntimeError("boom")

    recorder = Recorder(crash_once)
    sub = await bus.consume(spec(retry_delay=0.05), recorder)
    await bus.publish(heartbeat("n1", 1))
    seen = await recorder.wait_for(2)
    await sub.stop()
    assert [d.attempt for d in seen] == [1, 2]


async def test_one_node_stays_in_order_while_another_node_is_slow(bus: Bus) -> None:
    release = asyncio.Event()

    async def slow_for_b(delivery: Delivery) -> None:
        if delivery.envelope.node == "node-b":
            await release.wait()

    recorder = Recorder(slow_for_b)
    sub = await bus.consume(spec(), recorder)
    await bus.publish(heartbeat("node-b", 0))
    await bus.publish_batch([heartbeat("node-a", i) for i in range(1, 51)])
    await bus.publish(heartbeat("node-b", 99))
    await wait_until(lambda: _count(recorder, "node-a", 50))
    b_seen = [seq_of(d) for d in recorder.seen if d.envelope.node == "node-b"]
    release.set()
    await wait_until(lambda: _count(recorder, "node-b", 2))
    await sub.stop()
    assert b_seen == [0], "the second node-b message must wait for the first"
    a_order = [seq_of(d) for d in recorder.seen if d.envelope.node == "node-a"]
    assert a_order == list(range(1, 51))
    assert [seq_of(d) for d in recorder.seen if d.envelope.node == "node-b"] == [0, 99]


async def test_handler_continues_the_producers_trace(bus: Bus) -> None:
    recorder = Recorder()
    sub = await bus.consume(spec(), recorder)
    provider = tracing.build_tracer_provider("test")
    with provider.get_tracer("test").start_as_current_span("produce") as span:
        await bus.publish(heartbeat("n1", 1))
        trace_id = span.get_span_context().trace_id
    (delivery,) = await recorder.wait_for(1)
    await sub.stop()
    assert delivery.envelope.traceparent is not None
    assert delivery.envelope.traceparent.split("-")[1] == format(trace_id, "032x")
    assert trace.get_current_span().get_span_context().trace_id != trace_id


async def test_read_returns_stored_messages_in_order_and_since_filters(bus: Bus) -> None:
    await bus.publish_batch([heartbeat("n1", i) for i in range(5)])
    cut = datetime.now(UTC)
    await asyncio.sleep(0.05)
    await bus.publish(heartbeat("n2", 5))
    everything = await collect(bus.read(HB_SUBJECT))
    assert [m.seq for m in everything] == [1, 2, 3, 4, 5, 6]
    recent = await collect(bus.read(HB_SUBJECT, since=cut))
    assert [m.seq for m in recent] == [6]
    assert await collect(bus.read("gpuop.evt.driver.>")) == []
    future = datetime(2999, 1, 1, tzinfo=UTC)
    assert await collect(bus.read(HB_SUBJECT, since=future)) == []


async def test_last_is_the_latest_message_on_exactly_one_subject(bus: Bus) -> None:
    await bus.publish_batch([heartbeat("n1", i) for i in range(3)])
    await bus.publish(heartbeat("n2", 3))
    n1 = HB_SUBJECT.replace("*", "n1")
    last = await bus.last(n1)
    assert last is not None and (last.subject, last.seq) == (n1, 3)
    assert json.loads(last.data)["id"] == json.loads((await collect(bus.read(n1)))[-1].data)["id"]
    assert await bus.last(HB_SUBJECT.replace("*", "n3")) is None


async def test_kv_create_update_and_conflicts(bus: Bus) -> None:
    kv = await bus.kv(Buckets.SAGAS)
    revision = await kv.create("gpu-1_example_com", b"upgrade-required")
    with pytest.raises(KeyExists):
        await kv.create("gpu-1_example_com", b"again")
    newer = await kv.update("gpu-1_example_com", b"cordon-required", revision)
    with pytest.raises(RevisionConflict):
        await kv.update("gpu-1_example_com", b"stale", revision)
    entry = await kv.get("gpu-1_example_com")
    assert entry is not None and (entry.value, entry.revision) == (b"cordon-required", newer)
    assert await kv.get("absent") is None
    assert await kv.keys() == ["gpu-1_example_com"]
    with pytest.raises(RevisionConflict):
        await kv.delete("gpu-1_example_com", revision=revision)
    await kv.delete("gpu-1_example_com", revision=newer)
    assert await kv.get("gpu-1_example_com") is None
    assert await kv.keys() == []
    await kv.create("gpu-1_example_com", b"recreated")
    with pytest.raises(ValueError, match="invalid KV key"):
        await kv.put("bad key", b"x")


async def test_kv_watch_yields_current_then_marker_then_changes(bus: Bus) -> None:
    kv = await bus.kv(Buckets.NODES)
    await kv.put("n1", b"one")
    seen: list[object] = []
    watcher = kv.watch()

    async def follow() -> None:
        async for entry in watcher:
            seen.append(None if entry is None else (entry.key, entry.value, entry.deleted))
            if len(seen) == 4:
                return

    task = asyncio.create_task(follow())
    await wait_until(lambda: _length(seen, 2))
    await kv.put("n2", b"two")
    await kv.delete("n1")
    await asyncio.wait_for(task, 5)
    await watcher.aclose()  # type: ignore[attr-defined]
    assert seen == [("n1", b"one", False), None, ("n2", b"two", False), ("n1", b"", True)]


async def test_start_is_idempotent(bus: Bus) -> None:
    await bus.publish(heartbeat("n1", 1))
    await bus.start()
    assert len(await collect(bus.read(HB_SUBJECT))) == 1


async def _has_dead_letters(bus: Bus, count: int) -> bool:
    return len(await dead_letters(bus)) >= count


async def _count(recorder: Recorder, node: str, count: int) -> bool:
    return sum(1 for d in recorder.seen if d.envelope.node == node) >= count


async def _length(items: list[object], count: int) -> bool:
    return len(items) >= count


@pytest.mark.security
async def test_a_flooding_node_holds_only_its_share_of_the_slots(bus: Bus) -> None:
    """Attack: gpu-2 floods its subject and the handler takes its messages slowly (not at all
    until the test lets it); gpu-1's message, published after the flood, must be handled
    while the flood waits: gpu-2's lane holds at most `max_in_flight_per_node` slots, its
    further messages wait in order without one. Its outcome is printed."""
    slots, share = 8, 2
    flood = slots + share  # its share of slots and `max_in_flight` parked
    release = asyncio.Event()
    handled: list[tuple[str, int]] = []

    async def handler(delivery: Delivery) -> None:
        node = delivery.envelope.subject
        if node == "gpu-2":
            await release.wait()
        handled.append((node, seq_of(delivery)))

    for n in range(flood):
        await bus.publish(heartbeat("gpu-2", n))
    await bus.publish(heartbeat("gpu-1", 0))
    spec = ConsumerSpec(
        "lanes", [HB_SUBJECT], max_in_flight=slots, max_in_flight_per_node=share, ack_wait=30
    )
    subscription = await bus.consume(spec, handler)
    try:
        try:
            await eventually(lambda: ("gpu-1", 0) in handled)
            outcome = "handled while gpu-2's flood waits"
        except TimeoutError:
            outcome = "not handled: gpu-2's lane holds every slot"
        print(
            f"\n{flood} heartbeats of gpu-2 (slowly handled), then one of gpu-1, to a consumer "
            f"of {slots} slots: gpu-1's {outcome}"
        )
        assert outcome.startswith("handled")
        release.set()
        await eventually(lambda: len(handled) == flood + 1)
        assert [n for node, n in handled if node == "gpu-2"] == list(range(flood))
    finally:
        release.set()
        await subscription.stop()
