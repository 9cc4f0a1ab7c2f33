"""`Consumers`: `NatsBus`'s durable pull consumers, each a fetch loop feeding a `Dispatcher`
(`gpuop.bus.dispatching`).

A consumer is created with its filter where a permission can bind it (one filter in the
create subject, several in the body of a create pinned by name), and an existing one whose
setting cannot change keeps its position. It rides through server restarts because the
client reconnects and the consumer lives on the server; a fetch waiting on a pull request
lost with the old connection asks again the moment the connection comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from gpuop.bus import streams
from gpuop.bus.connection import ANY_NATS_ERROR, Connection, patiently
from gpuop.bus.dispatching import PumpedSubscription, RawPublisher
from gpuop.bus.errors import BusUnavailable
from gpuop.bus.protocol import ConsumerSpec, Handler
from gpuop.observability.metrics import BusMetrics

log = logging.getLogger(__name__)

CONSUME_FAILURES: tuple[type[BaseException], ...] = (*ANY_NATS_ERROR, BusUnavailable)
IDLE_FETCH_SECONDS = 5.0
"""How long one pull request waits on an idle consumer. A message is handed over the moment
it arrives whatever this is; it bounds only how soon a pull lost with a connection is asked
again, and each expiry costs a round trip: at 1 s, the fetch loops of an idle node agent's
consumers were half of its CPU."""


class Consumers:
    """The running consumers of one connection; their dead letters go out through `bus`."""

    def __init__(
        self, connection: Connection, bus: RawPublisher, *, prefix: str, metrics: BusMetrics
    ) -> None:
        self._connection = connection
        self._bus = bus
        self._prefix = prefix
        self._metrics = metrics
        self._running: list[NatsSubscription] = []

    async def consume(self, spec: ConsumerSpec, handler: Handler) -> NatsSubscription:
        layout = streams.stream_for(self._prefix, spec.subjects[0])
        for subject in spec.subjects:
            if streams.stream_for(self._prefix, subject).name != layout.name:
                raise ValueError(f"consumer {spec.durable} mixes streams: {list(spec.subjects)}")
        # One filter travels in the create subject (`CONSUMER.CREATE.<stream>.<name>.<filter>`),
        # where a permission can bind it; several go in the body of a create pinned by name.
        single = len(spec.subjects) == 1
        config = ConsumerConfig(
            name=spec.durable,
            durable_name=spec.durable,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=spec.ack_wait,
            max_deliver=spec.max_deliver,
            max_ack_pending=spec.max_in_flight * 4,
            deliver_policy=DeliverPolicy.NEW if spec.deliver_new_only else DeliverPolicy.ALL,
            filter_subject=spec.subjects[0] if single else None,
            filter_subjects=None if single else list(spec.subjects),
            metadata=dict(spec.metadata) or None,
        )

        async def create() -> None:
            try:
                await self._connection.js.add_consumer(layout.name, config)
            except nats.js.errors.BadRequestError as exc:
                # an existing consumer with a setting that cannot change: keep its position
                log.warning("consumer %s kept with its old config: %s", spec.durable, exc)

        try:
            # a cluster between two leaders answers "temporarily unavailable": wait for one
            await patiently(create, time.monotonic() + self._connection.retry_for)
            psub = await self._connection.js.pull_subscribe_bind(
                durable=spec.durable, stream=layout.name
            )
        except CONSUME_FAILURES as exc:
            raise BusUnavailable(f"cannot start consumer {spec.durable}: {exc!r}") from exc
        subscription = NatsSubscription(self, spec, handler, psub, self._metrics)
        subscription.start()
        self._running.append(subscription)
        return subscription

    async def stop_all(self) -> None:
        for subscription in list(self._running):
            await subscription.stop()

    def _forget(self, subscription: NatsSubscription) -> None:
        if subscription in self._running:
            self._running.remove(subscription)


class NatsSubscription(PumpedSubscription):
    """A durable pull consumer's fetch loop."""

    def __init__(
        self,
        consumers: Consumers,
        spec: ConsumerSpec,
        handler: Handler,
        psub: JetStreamContext.PullSubscription,
        metrics: BusMetrics,
    ) -> None:
        super().__init__(consumers._bus, spec, handler, metrics)
        self._consumers = consumers
        self._connection = consumers._connection
        self._psub = psub

    async def _stopped(self) -> None:
        await _unsubscribe(self._psub)
        self._consumers._forget(self)

    async def _fetch_unless_reconnected(self, wanted: int) -> list[Msg]:
        """A fetch of up to `wanted` messages, given up (as a timeout) when the connection
        comes back while it waits: its pull request was lost with the old connection."""
        reconnected = asyncio.create_task(self._connection.reconnected.wait())
        fetch = asyncio.create_task(self._psub.fetch(wanted, timeout=IDLE_FETCH_SECONDS))
        try:
            await asyncio.wait({fetch, reconnected}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # the consumer stops: nothing may outlive it
            fetch.cancel()
            raise
        finally:
            reconnected.cancel()
        if not fetch.done():
            fetch.cancel()
            with contextlib.suppress(asyncio.CancelledError, *ANY_NATS_ERROR):
                await fetch
            raise nats.errors.TimeoutError
        return fetch.result()

    async def _pump(self) -> None:
        while True:
            if self._dispatcher.free_slots == 0:
                await self._dispatcher.wait_for_slot()
            try:
                wanted = min(self._dispatcher.free_slots, 64)
                batch = await self._fetch_unless_reconnected(wanted)
            except nats.errors.TimeoutError:
                continue
            except ANY_NATS_ERROR as exc:
                log.debug("fetch for %s failed: %r", self.durable, exc)
                await asyncio.sleep(0.25)
                continue
            for msg in batch:
                await self._dispatcher.submit(_NatsInbound(msg))


class _NatsInbound:
    """A JetStream delivery seen through the `Inbound` protocol."""

    def __init__(self, msg: Msg) -> None:
        self._msg = msg
        self.subject: str = msg.subject
        self.data: bytes = msg.data
        self.attempt, self.stream_seq = _delivery_numbers(msg)

    async def ack(self) -> None:
        await self._msg.ack()

    async def nak(self, delay: float) -> None:
        await self._msg.nak(delay=delay if delay > 0 else None)

    async def term(self) -> None:
        await self._msg.term()

    async def in_progress(self) -> None:
        await self._msg.in_progress()


def _delivery_numbers(msg: Msg) -> tuple[int, int]:
    """(attempt, stream sequence) from the ack subject, without building nats-py's Metadata
    (frozen dataclasses and a datetime per message, a tenth of the consume path's CPU)."""
    tokens = msg.reply.split(".") if msg.reply else []
    # $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>,
    # or with <domain>.<account hash> after ACK and a random token at the end
    if len(tokens) == 9 and tokens[0] == "$JS" and tokens[1] == "ACK":
        return int(tokens[4]), int(tokens[5])
    metadata = msg.metadata
    return metadata.num_delivered, metadata.sequence.stream


async def _unsubscribe(psub: JetStreamContext.PullSubscription) -> None:
    # unsubscribing before drain avoids nats-py's drain() hang after pull fetches
    try:
        await psub.unsubscribe()
    except (TimeoutError, nats.errors.Error) as exc:
        log.debug("unsubscribe: %s", exc)
