"""`InMemoryBus`: the bus inside one process, for unit tests. (`gpuop replay` needs no bus: it
folds an exported log with the saga core, `gpuop.saga.replaying`.)

It keeps the contract of `NatsBus` (streams with sequence numbers, dedupe by event id,
durable consumers that resume after the last ack, nak with delay, ack deadlines,
`max_deliver`, dead letters, KV revisions with compare-and-set, watches) so that the same
contract suite passes against both. Nothing here survives the process. Like nats-server
with its default configuration, it refuses a message over 1 MiB (data and headers).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from gpuop.bus import publishing, streams
from gpuop.bus.dispatching import PumpedSubscription
from gpuop.bus.errors import KeyExists, RevisionConflict
from gpuop.bus.kv import check_key
from gpuop.bus.protocol import (
    Buckets,
    ConsumerSpec,
    Handler,
    KvEntry,
    PublishAck,
    StoredMessage,
)
from gpuop.events import Envelope
from gpuop.observability.metrics import BusMetrics, registry


@dataclass
class _Stream:
    layout: streams.StreamLayout
    messages: list[StoredMessage] = field(default_factory=list)
    ids: dict[str, int] = field(default_factory=dict)
    """Event id -> sequence, for duplicate detection."""
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def append(self, out: publishing.Outgoing) -> PublishAck:
        msg_id = out.headers.get(streams.MSG_ID)
        if msg_id is not None and msg_id in self.ids:
            return PublishAck(self.layout.name, self.ids[msg_id], duplicate=True)
        seq = len(self.messages) + 1
        stored = StoredMessage(
            self.layout.name, seq, out.subject, out.data, datetime.now(UTC), dict(out.headers)
        )
        self.messages.append(stored)
        if msg_id is not None:
            self.ids[msg_id] = seq
        self.wake.set()
        self.wake = asyncio.Event()
        return PublishAck(self.layout.name, seq, duplicate=False)


@dataclass
class _Durable:
    """Server-side state of one durable consumer; it outlives its subscriptions."""

    spec: ConsumerSpec
    cursor: int
    """Index of the next never-delivered message."""
    delivered: dict[int, int] = field(default_factory=dict)
    pending: dict[int, float] = field(default_factory=dict)
    """Delivered, not acked: sequence -> ack deadline."""
    due: dict[int, float] = field(default_factory=dict)
    """Waiting for redelivery: sequence -> time."""
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def matches(self, subject: str) -> bool:
        return any(streams.subject_matches(f, subject) for f in self.spec.subjects)


class InMemoryBus:
    """The bus contract in one process."""

    def __init__(self, *, prefix: str = "gpuop", metrics: BusMetrics | None = None) -> None:
        self._prefix = prefix
        self._metrics = metrics or BusMetrics(registry())
        self._streams = {layout.name: _Stream(layout) for layout in streams.layouts(prefix)}
        self._durables: dict[str, _Durable] = {}
        self._subscriptions: list[MemorySubscription] = []
        self._buckets: dict[str, MemoryKeyValue] = {}

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def max_payload(self) -> int:
        """Largest message, data and headers together, the bus accepts."""
        return publishing.DEFAULT_MAX_PAYLOAD

    async def start(self) -> None:
        for bucket in Buckets:
            await self.kv(bucket)

    @property
    def id_key(self) -> bytes:
        """No credential in one process: message ids are the envelope ids."""
        return b""

    async def close(self) -> None:
        for subscription in list(self._subscriptions):
            await subscription.stop()

    def _stream(self, subject: str) -> _Stream:
        return self._streams[streams.stream_for(self._prefix, subject).name]

    def _store(self, out: publishing.Outgoing, *, republish: bool) -> PublishAck:
        publishing.fitting(out, self.max_payload)
        ack = self._stream(out.subject).append(out)
        publishing.checked(ack, out, first_try=not republish, metrics=self._metrics)
        self._metrics.published(out.kind)
        return ack

    async def publish(self, envelope: Envelope, *, republish: bool = False) -> PublishAck:
        return self._store(publishing.prepare(envelope, self._prefix), republish=republish)

    async def publish_batch(
        self, envelopes: Sequence[Envelope], *, republish: bool = False
    ) -> list[PublishAck]:
        return [await self.publish(e, republish=republish) for e in envelopes]

    async def consume(self, spec: ConsumerSpec, handler: Handler) -> MemorySubscription:
        stream = self._stream(spec.subjects[0])
        for subject in spec.subjects:
            if self._stream(subject) is not stream:
                raise ValueError(f"consumer {spec.durable} mixes streams: {list(spec.subjects)}")
        durable = self._durables.get(spec.durable)
        if durable is None:
            start = len(stream.messages) if spec.deliver_new_only else 0
            durable = self._durables[spec.durable] = _Durable(spec, start)
        else:
            durable.spec = spec
        subscription = MemorySubscription(self, stream, durable, handler, self._metrics)
        subscription.start()
        self._subscriptions.append(subscription)
        return subscription

    def _forget(self, subscription: MemorySubscription) -> None:
        if subscription in self._subscriptions:
            self._subscriptions.remove(subscription)

    async def publish_raw(
        self,
        subject: str,
        data: bytes,
        headers: dict[str, str] | None = None,
        *,
        republish: bool = False,
    ) -> PublishAck:
        """Publish bytes no model produced: replaying dead letters, hostile-input tests."""
        out = publishing.raw(self._prefix, subject, data, headers)
        return self._store(out, republish=republish)

    async def kv(self, bucket: Buckets | str) -> MemoryKeyValue:
        name = streams.bucket_name(self._prefix, bucket)
        if name not in self._buckets:
            self._buckets[name] = MemoryKeyValue(name)
        return self._buckets[name]

    async def last(self, subject: str) -> StoredMessage | None:
        stream = self._stream(subject)
        for stored in reversed(stream.messages):
            if stored.subject == subject:
                return stored
        return None

    async def read(
        self, subject: str, *, since: datetime | None = None, follow: bool = False
    ) -> AsyncIterator[StoredMessage]:
        stream = self._stream(subject)
        index = 0
        while True:
            while index < len(stream.messages):
                stored = stream.messages[index]
                index += 1
                if since is not None and stored.time < since:
                    continue
                if streams.subject_matches(subject, stored.subject):
                    yield stored
            if not follow:
                return
            await stream.wake.wait()


class MemorySubscription(PumpedSubscription):
    """Delivers a durable consumer's messages from the in-process stream."""

    def __init__(
        self,
        bus: InMemoryBus,
        stream: _Stream,
        durable: _Durable,
        handler: Handler,
        metrics: BusMetrics,
    ) -> None:
        super().__init__(bus, durable.spec, handler, metrics)
        self._bus = bus
        self._stream = stream
        self._durable = durable

    async def _stopped(self) -> None:
        # what was delivered and not settled goes back, as after a server-side ack timeout
        now = _now()
        for seq in list(self._durable.pending):
            self._durable.pending.pop(seq)
            self._durable.due[seq] = now
        self._bus._forget(self)

    async def _pump(self) -> None:
        state = self._durable
        while True:
            stream_wake, state_wake = self._stream.wake, state.wake
            seq = self._next()
            if seq is None:
                await _wait_any(stream_wake, state_wake, self._next_due())
                continue
            if self._dispatcher.free_slots == 0:
                await self._dispatcher.wait_for_slot()
            state.delivered[seq] = state.delivered.get(seq, 0) + 1
            state.pending[seq] = _now() + state.spec.ack_wait
            stored = self._stream.messages[seq - 1]
            await self._dispatcher.submit(_MemoryInbound(self, stored, state.delivered[seq]))

    def _next(self) -> int | None:
        """The next sequence to deliver: a due redelivery first, else a new message."""
        state, now = self._durable, _now()
        for seq, deadline in list(state.pending.items()):
            if deadline <= now:
                del state.pending[seq]
                state.due[seq] = now
        for seq in sorted(state.due):
            if state.due[seq] <= now:
                del state.due[seq]
                if state.delivered.get(seq, 0) < state.spec.max_deliver:
                    return seq
        messages = self._stream.messages
        while state.cursor < len(messages):
            stored = messages[state.cursor]
            state.cursor += 1
            if state.matches(stored.subject):
                return stored.seq
        return None

    def _next_due(self) -> float | None:
        times = [*self._durable.due.values(), *self._durable.pending.values()]
        return min(times) - _now() if times else None

    def _settle(self, seq: int, redeliver_in: float | None = None, extend: bool = False) -> None:
        state = self._durable
        if extend:
            if seq in state.pending:
                state.pending[seq] = _now() + state.spec.ack_wait
            return
        state.pending.pop(seq, None)
        if redeliver_in is not None:
            state.due[seq] = _now() + redeliver_in
        state.wake.set()
        state.wake = asyncio.Event()


class _MemoryInbound:
    def __init__(self, subscription: MemorySubscription, stored: StoredMessage, attempt: int):
        self._subscription = subscription
        self.subject = stored.subject
        self.data = stored.data
        self.attempt = attempt
        self.stream_seq = stored.seq

    async def ack(self) -> None:
        self._subscription._settle(self.stream_seq)

    async def nak(self, delay: float) -> None:
        self._subscription._settle(self.stream_seq, redeliver_in=max(delay, 0.0))

    async def term(self) -> None:
        self._subscription._settle(self.stream_seq)

    async def in_progress(self) -> None:
        self._subscription._settle(self.stream_seq, extend=True)


class MemoryKeyValue:
    """A bucket with per-bucket revision numbers, like a JetStream KV stream."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._revision = 0
        self._latest: dict[str, KvEntry] = {}
        self._log: list[KvEntry] = []
        self._changed = asyncio.Event()

    @property
    def bucket(self) -> str:
        return self._name

    def _write(self, key: str, value: bytes, deleted: bool = False) -> int:
        self._revision += 1
        entry = KvEntry(key, value, self._revision, deleted)
        self._latest[key] = entry
        self._log.append(entry)
        self._changed.set()
        self._changed = asyncio.Event()
        return self._revision

    async def get(self, key: str) -> KvEntry | None:
        entry = self._latest.get(check_key(key))
        return None if entry is None or entry.deleted else entry

    async def put(self, key: str, value: bytes) -> int:
        return self._write(check_key(key), value)

    async def create(self, key: str, value: bytes) -> int:
        if await self.get(key) is not None:
            raise KeyExists(key)
        return self._write(key, value)

    async def update(self, key: str, value: bytes, revision: int) -> int:
        if revision <= 0:
            raise ValueError("update needs the revision that was read; use create for new keys")
        current = self._latest.get(check_key(key))
        if current is None or current.revision != revision:
            raise RevisionConflict(key, revision)
        return self._write(key, value)

    async def delete(self, key: str, revision: int | None = None) -> None:
        current = self._latest.get(check_key(key))
        if revision is not None and (current is None or current.revision != revision):
            raise RevisionConflict(key, revision)
        self._write(key, b"", deleted=True)

    async def keys(self) -> list[str]:
        return sorted(k for k, e in self._latest.items() if not e.deleted)

    async def watch(self, pattern: str = ">") -> AsyncIterator[KvEntry | None]:
        for entry in sorted(self._latest.values(), key=lambda e: e.revision):
            if streams.subject_matches(pattern, entry.key):
                yield entry
        yield None
        position = len(self._log)
        while True:
            changed = self._changed
            while position < len(self._log):
                entry = self._log[position]
                position += 1
                if streams.subject_matches(pattern, entry.key):
                    yield entry
            await changed.wait()


def _now() -> float:
    return asyncio.get_running_loop().time()


async def _wait_any(stream: asyncio.Event, state: asyncio.Event, timeout: float | None) -> None:
    waiters = [asyncio.ensure_future(stream.wait()), asyncio.ensure_future(state.wait())]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
