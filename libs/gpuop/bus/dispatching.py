"""Turns fetched messages into handler calls, in order per node, and decides each ack.

Both bus implementations feed their raw deliveries to a `Dispatcher`; it is the one place
where the error taxonomy becomes an outcome:

    decoded, handler returned          -> ack
    the bus failing under the handler  -> the handler is called again in place, with a backoff,
      (PublishTimeout, BusUnavailable)    for up to `BUS_PATIENCE`: an outage or a cluster
                                          electing a leader spends no delivery attempt
    TemporaryError(delay)              -> nak after `delay`; dead letter once `max_deliver` is spent
    PermanentError, malformed message  -> dead letter with the reason, then terminate
    type from a newer producer         -> ack and count (never dead-lettered)
    any other exception                -> the consumer's `on_unknown_error` choice

Messages of one node run one at a time in arrival order (never two handlers for a node at
once); different nodes run concurrently, bounded by `max_in_flight`. With
`max_in_flight_per_node` (the orchestrator's intake sets it) one node's lane holds at most
that many of those slots: a node that floods its subjects would otherwise
hold every slot, and the fetch loop, waiting for one, would fetch no other node's message
until the flood was handled. Its further messages wait in its lane without a slot (parked,
their ack deadlines extended like the rest), up to `max_in_flight` of them; beyond that a
message takes a slot as any does (the fetch waiting for one), so order is never traded: a
node that far behind slows the others until its lane is back within its parking.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from gpuop.bus import publishing
from gpuop.bus.errors import (
    BusError,
    BusUnavailable,
    PermanentError,
    PublishTimeout,
    TemporaryError,
)
from gpuop.bus.protocol import ConsumerSpec, Delivery, Handler, PublishAck, UnknownErrors
from gpuop.events import (
    MalformedMessage,
    UnknownEventType,
    decode_on,
    subjects,
)
from gpuop.observability import logging as oblog
from gpuop.observability import tracing
from gpuop.observability.metrics import BusMetrics, DeadLetterReason

log = logging.getLogger(__name__)

MAX_REASON = 1024
"""Dead-letter reasons are truncated: a hostile message must not make a huge header."""
BUS_PATIENCE = 300.0
"""Seconds a handler whose bus calls fail (the server gone, a stream between leaders, a
server cut off) is called again in place before its message goes back to the server; the
keep-alive holds the message meanwhile. A redelivery would spend one of `max_deliver`
attempts on each try, and a 20-second partition would dead-letter the event."""


class Inbound(Protocol):
    """One raw delivery, whatever the transport."""

    @property
    def subject(self) -> str: ...
    @property
    def data(self) -> bytes: ...
    @property
    def attempt(self) -> int: ...
    @property
    def stream_seq(self) -> int: ...

    async def ack(self) -> None: ...
    async def nak(self, delay: float) -> None: ...
    async def term(self) -> None: ...
    async def in_progress(self) -> None: ...


DeadLetterSink = Callable[[Inbound, DeadLetterReason, str], Awaitable[None]]
"""Stores a message in the dead-letter stream: (message, reason kind, reason)."""


class Dispatcher:
    """Per-node ordered execution of one consumer's deliveries."""

    def __init__(
        self,
        spec: ConsumerSpec,
        handler: Handler,
        dead_letter: DeadLetterSink,
        metrics: BusMetrics,
    ) -> None:
        self._spec = spec
        self._handler = handler
        self._dead_letter = dead_letter
        self._metrics = metrics
        self._slots = asyncio.Semaphore(spec.max_in_flight)
        self._held = 0
        share = spec.max_in_flight_per_node
        self._per_lane = max(1, min(share or spec.max_in_flight, spec.max_in_flight))
        """Slots one lane holds while within its parking: its first messages' ones."""
        self._parking = spec.max_in_flight if share is not None else 0
        """Messages one lane may hold beyond its share without a slot."""
        self._lanes: dict[str, collections.deque[Inbound]] = {}
        self._lane_slots: dict[str, int] = {}
        """Slots each lane holds now."""
        self._holding = asyncio.Event()
        """Set while any message is held: the keep-alive sleeps otherwise (an idle agent's
        consumers would each wake every `ack_wait / 3` for nothing)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._heartbeat: asyncio.Task[None] | None = None

    @property
    def free_slots(self) -> int:
        """How many more messages may be fetched right now."""
        return self._spec.max_in_flight - self._held

    async def wait_for_slot(self) -> None:
        """Block until at least one message may be fetched."""
        await self._slots.acquire()
        self._slots.release()

    def start(self) -> None:
        self._heartbeat = asyncio.create_task(self._keep_alive(), name="bus-heartbeat")

    async def submit(self, message: Inbound) -> None:
        """Queue `message` behind earlier messages of its node: holding a slot while its lane
        holds fewer than its share, parked without one after that (see the module)."""
        key = subjects.node_key(message.subject)
        lane = self._lanes.get(key)
        if lane is not None and self._per_lane <= len(lane) < self._per_lane + self._parking:
            lane.append(message)
            return
        await self._slots.acquire()
        self._held += 1
        lane = self._lanes.get(key)  # the wait for a slot may have let its lane end
        if lane is not None:
            lane.append(message)
            self._lane_slots[key] += 1
            return
        lane = self._lanes[key] = collections.deque([message])
        self._lane_slots[key] = 1
        self._holding.set()
        task = asyncio.create_task(self._run_lane(key, lane), name=f"bus-lane-{key}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self, grace: float = 5.0) -> None:
        """Let running handlers finish (up to `grace`), hand queued messages back."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        waiting = [m for lane in self._lanes.values() for m in list(lane)[1:]]
        for key, lane in self._lanes.items():
            while len(lane) > 1:
                lane.pop()
            self._release_spare(key, lane)
        for message in waiting:
            await _quietly(message.nak(0))
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=grace)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if self._heartbeat is not None:
            await asyncio.gather(self._heartbeat, return_exceptions=True)

    async def _run_lane(self, key: str, lane: collections.deque[Inbound]) -> None:
        try:
            while lane:
                try:
                    await self._handle(lane[0])
                finally:
                    lane.popleft()
                    # a slot the lane still needs passes to its first parked message
                    self._release_spare(key, lane)
        finally:
            del self._lanes[key]
            del self._lane_slots[key]
            if not self._lanes:
                self._holding.clear()

    def _release_spare(self, key: str, lane: collections.deque[Inbound]) -> None:
        """Hand back the slots `lane` holds beyond its first `_per_lane` messages'."""
        while self._lane_slots[key] > min(len(lane), self._per_lane):
            self._lane_slots[key] -= 1
            self._held -= 1
            self._slots.release()

    async def _keep_alive(self) -> None:
        """Extend the ack deadline of everything held, so a message queued behind a slow
        handler of its node is not redelivered while it waits."""
        interval = max(self._spec.ack_wait / 3, 0.05)
        while True:
            await self._holding.wait()
            await asyncio.sleep(interval)
            for lane in list(self._lanes.values()):
                for message in list(lane):
                    await _quietly(message.in_progress())

    async def _handle(self, message: Inbound) -> None:
        consumer = self._spec.durable
        if message.attempt > 1:
            self._metrics.redelivered(consumer)
        try:
            envelope, payload = decode_on(message.subject, message.data)
        except MalformedMessage as exc:
            await self._give_up(message, "malformed", str(exc))
            return
        except UnknownEventType as exc:
            log.info("acking message of unknown type %s on %s", exc.type, message.subject)
            self._metrics.unknown_type(consumer)
            self._metrics.consumed(consumer, "unknown_type")
            await _quietly(message.ack())
            return
        delivery = Delivery(message.subject, envelope, payload, message.attempt, message.stream_seq)
        started = time.perf_counter()
        try:
            await self._patiently(delivery)
        except TemporaryError as exc:
            await self._retry(message, exc.delay, str(exc))
        except PermanentError as exc:
            await self._give_up(message, "permanent", str(exc))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("handler of %s failed on %s", consumer, message.subject)
            reason = f"{type(exc).__name__}: {exc}"
            if self._spec.on_unknown_error is UnknownErrors.DEAD_LETTER:
                await self._give_up(message, "permanent", reason)
            else:
                await self._retry(message, self._spec.retry_delay, reason)
        else:
            self._metrics.consumed(consumer, "acked")
            await _quietly(message.ack())
        finally:
            self._metrics.observe_handler(consumer, time.perf_counter() - started)

    async def _patiently(self, delivery: Delivery) -> None:
        """The handler, called again while the bus fails under it (see `BUS_PATIENCE`)."""
        deadline = time.monotonic() + BUS_PATIENCE
        delay = 0.25
        while True:
            try:
                await self._call(delivery)
                return
            except (PublishTimeout, BusUnavailable) as exc:
                if time.monotonic() + delay > deadline:
                    raise
                log.warning(
                    "handler of %s on %s: the bus failed (%s); again in %.2g s",
                    self._spec.durable,
                    delivery.subject,
                    exc,
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _call(self, delivery: Delivery) -> None:
        envelope = delivery.envelope
        if envelope.traceparent is None and envelope.correlationid is None:
            # lanes run in the fetch loop's context, which has neither: nothing to set
            await self._handler(delivery)
            return
        with tracing.attached(envelope.traceparent), oblog.correlation(envelope.correlationid):
            await self._handler(delivery)

    async def _retry(self, message: Inbound, delay: float, reason: str) -> None:
        if message.attempt >= self._spec.max_deliver:
            await self._give_up(
                message, "max_deliver", f"gave up after {message.attempt}: {reason}"
            )
            return
        self._metrics.consumed(self._spec.durable, "retried")
        await _quietly(message.nak(delay))

    async def _give_up(self, message: Inbound, kind: DeadLetterReason, reason: str) -> None:
        """Dead-letter, then terminate; if the dead letter cannot be stored, retry later
        instead, so that nothing is lost."""
        try:
            await self._dead_letter(message, kind, reason[:MAX_REASON])
        except BusError:
            log.warning("dead letter for %s not stored; will retry", message.subject)
            await _quietly(message.nak(self._spec.retry_delay))
            return
        self._metrics.dead_lettered(self._spec.durable, kind)
        self._metrics.consumed(self._spec.durable, "dead_lettered")
        await _quietly(message.term())


class RawPublisher(Protocol):
    """What a subscription needs of its bus: somewhere to store dead letters."""

    @property
    def prefix(self) -> str: ...
    @property
    def max_payload(self) -> int: ...
    @property
    def id_key(self) -> bytes: ...

    async def publish_raw(
        self,
        subject: str,
        data: bytes,
        headers: dict[str, str] | None = None,
        *,
        republish: bool = False,
    ) -> PublishAck: ...


class PumpedSubscription(abc.ABC):
    """A running durable consumer: a transport-specific pump feeding a `Dispatcher`.

    `NatsSubscription` pumps JetStream fetches, `MemorySubscription` the in-process stream;
    start, stop and dead-lettering are the same for both and live here.
    """

    def __init__(
        self, bus: RawPublisher, spec: ConsumerSpec, handler: Handler, metrics: BusMetrics
    ) -> None:
        self._publisher = bus
        self._spec = spec
        self._dispatcher = Dispatcher(spec, handler, self._dead_letter, metrics)
        self._task: asyncio.Task[None] | None = None

    @property
    def durable(self) -> str:
        return self._spec.durable

    def start(self) -> None:
        self._dispatcher.start()
        self._task = asyncio.create_task(self._pump(), name=f"bus-pump-{self.durable}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self._dispatcher.stop()
        await self._stopped()

    @abc.abstractmethod
    async def _pump(self) -> None:
        """Feed deliveries to `self._dispatcher` until cancelled."""

    @abc.abstractmethod
    async def _stopped(self) -> None:
        """Release transport resources after the dispatcher stopped."""

    async def _dead_letter(self, message: Inbound, kind: DeadLetterReason, reason: str) -> None:
        out = publishing.dead_letter(
            self._publisher.prefix,
            subject=message.subject,
            data=message.data,
            consumer=self.durable,
            seq=message.stream_seq,
            kind=kind,
            reason=reason,
            max_payload=self._publisher.max_payload,
            key=self._publisher.id_key,
        )
        # a redelivery after a crash between storing the dead letter and terminating the
        # message stores it again under the same id: the earlier copy, not an alarm
        await self._publisher.publish_raw(out.subject, out.data, out.headers, republish=True)


async def _quietly(action: Awaitable[None]) -> None:
    """Acks are best effort: a lost ack means a redelivery, which handlers tolerate."""
    try:
        await action
    except Exception as exc:
        log.debug("ack action failed: %s", exc)
