"""`NatsBus`: the bus on NATS JetStream (nats-py), used by every service in production.

Streams and buckets are created idempotently by `start()`. Publishing waits for the server's
receipt and retries transient failures for a while (safe: the event id dedupes); a first try
answered as a duplicate is someone else's message under our id (`IdTaken`). Each consumer is a
durable pull consumer whose fetch loop feeds a `Dispatcher`; it rides through server restarts
because the client reconnects and the consumer lives on the server. With an `Identity`, the
connection replies on that identity's own inbox prefix and creates every consumer in a form
its NATS permissions can bind (`gpuop.bus.grants`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import DEFAULT_INBOX_PREFIX, Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    Placement,
    StorageType,
    StreamConfig,
)

from gpuop.bus import grants, publishing, streams, tokens
from gpuop.bus.dispatching import PumpedSubscription
from gpuop.bus.errors import (
    PLACEMENT_ERROR,
    BusError,
    BusUnavailable,
    PlacementPending,
    PublishTimeout,
)
from gpuop.bus.kv import NatsKeyValue, open_bucket
from gpuop.bus.protocol import Buckets, ConsumerSpec, Handler, PublishAck, StoredMessage
from gpuop.events import Envelope
from gpuop.observability.metrics import BusMetrics, registry
from gpuop.observability.redaction import redacted

log = logging.getLogger(__name__)

TRANSIENT: tuple[type[BaseException], ...] = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.StaleConnectionError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.NoStreamResponseError,
    asyncio.TimeoutError,
)
"""Failures that a reconnect or a moment's patience cures (on a cluster, also a stream whose
leader is gone and whose next one is not elected yet: no response from the stream)."""

ANY_NATS_ERROR: tuple[type[BaseException], ...] = (*TRANSIENT, nats.errors.Error)
CONSUME_FAILURES: tuple[type[BaseException], ...] = (*ANY_NATS_ERROR, BusUnavailable)
IDLE_FETCH_SECONDS = 5.0
"""How long one pull request waits on an idle consumer. A message is handed over the moment
it arrives whatever this is; it bounds only how soon a pull lost with a connection is asked
again, and each expiry costs a round trip: at 1 s, the fetch loops of an idle node agent's
consumers were half of its CPU."""
START_RETRIED: tuple[type[BaseException], ...] = (*TRANSIENT, PublishTimeout, PlacementPending)
"""What `start` tries again: the transient failures, and a cluster whose members are not
all seen online yet (a refusal stops it at once)."""

RECONNECT_WAIT = 0.25
"""Seconds between connection attempts to the same server."""
DIRECT_GET_HEADERS = frozenset(
    ("Nats-Stream", "Nats-Subject", "Nats-Sequence", "Nats-Time-Stamp", "Nats-Num-Pending",
     "Nats-Last-Sequence", "Nats-UpTo-Sequence")
)  # fmt: skip
"""What a direct get's answer adds to the stored message's own headers."""
STREAM_NAME_IN_USE = 10058
"""JetStream's error code for a stream that exists with another configuration."""
RECONCILE_TIMEOUT = 2.0
"""Seconds to wait for a stream's configuration or its update at start: a user the server
does not allow either gets no answer at all."""
PING_INTERVAL = 5.0
MAX_OUTSTANDING_PINGS = 3
"""A server that answers no ping for 15 s is given up and another of the list is tried: a
partition drops packets without closing the connection, and nats-py's defaults (two minutes
between pings) would leave a service talking to a cut-off server for four."""
CONSUMER_EXISTS = 10148
"""JetStream's error code for a create (action `create`) of a consumer that exists."""
UNCONFIRMED_KEPT = 4096
"""Unconfirmed publish ids remembered (a caller that tries again soon; the server forgets an
id after the stream's duplicate window anyway)."""
READ_INACTIVE = 1.0
"""Seconds a read's consumer outlives its reader; a second read of the same filter by the same
identity waits for it to go."""
READ_HEARTBEAT = 5.0
"""Seconds between the server's idle heartbeats to a following read; three missed ones end
the read with `BusUnavailable` (the consumer or the connection is gone)."""
READ_PENDING_WAIT = 10.0
"""Seconds a read waits for a message the server said it has."""


class NatsBus:
    """The bus on a NATS server with JetStream."""

    def __init__(
        self,
        servers: str | Sequence[str],
        *,
        prefix: str = "gpuop",
        name: str = "gpuop",
        creds: str | None = None,
        events_max_age: float = streams.DEFAULT_EVENTS_MAX_AGE,
        publish_timeout: float = 5.0,
        retry_for: float = 30.0,
        replicas: int = 1,
        placement: Sequence[str] = (),
        limits: streams.StoreLimits = streams.DEFAULT_LIMITS,
        metrics: BusMetrics | None = None,
        identity: grants.Identity | None = None,
        token_file: str | None = None,
        id_key_file: str | None = None,
    ) -> None:
        if isinstance(servers, str):
            servers = [url.strip() for url in servers.split(",") if url.strip()]
        self.reconnected = asyncio.Event()
        """Set (and replaced by a new one) each time the connection comes back."""
        self._servers = list(servers)
        self._id_key = publishing.id_key(self._servers, _read_creds(creds))
        # callout mode: a token reread at every reconnect, and ids keyed by a file of our own
        self._token = tokens.TokenFile(token_file) if token_file else None
        self._token_watch: asyncio.Task[None] | None = None
        if id_key_file:
            self._id_key = publishing.id_key(self._servers, tokens.id_key(id_key_file))
        if not 1 <= replicas <= 5:
            raise ValueError(f"replicas must be 1 to 5, not {replicas}")
        self.replicas = replicas
        """Replicas of every stream and bucket this bus creates (3 on a JetStream cluster)."""
        self.placement = Placement(tags=list(placement)) if placement else None
        """Server tags every replica's server must have (`az:east`); None: any server."""
        self._prefix = prefix
        self._name = name
        self._creds = creds
        self.identity = identity
        """Who connects (`gpuop.bus.grants`): it replies on its own inbox prefix and reads
        the streams with consumers its permissions name; None: nats-py's `_INBOX`."""
        self._reading = collections.defaultdict[str, asyncio.Lock](asyncio.Lock)
        self._reconnects = 0
        """Connections lost and regained: a message sent across one may reach the server
        twice (nats-py sends what it had buffered again), so its duplicate is no alarm."""
        self._unconfirmed: collections.OrderedDict[str, None] = collections.OrderedDict()
        """Ids of publishes that ended unconfirmed (`PublishTimeout`): possibly stored, so a
        later publish of one is a retry, and its duplicate answer the earlier copy."""
        self._events_max_age = events_max_age
        self.limits = limits
        """What each stream and bucket this bus creates may hold."""
        self._publish_timeout = publish_timeout
        self._retry_for = retry_for
        self._metrics = metrics or BusMetrics(registry())
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._subscriptions: list[NatsSubscription] = []
        self._buckets: dict[str, NatsKeyValue] = {}
        self._closing = False

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def id_key(self) -> bytes:
        """What this publisher's message ids are keyed with (`publishing.message_id`)."""
        return self._id_key

    @property
    def inbox_prefix(self) -> str:
        """Where this connection's replies arrive: the identity's own prefix, or `_INBOX`."""
        if self.identity is None:
            return DEFAULT_INBOX_PREFIX.decode()
        return grants.inbox_prefix(self.identity)

    @property
    def max_payload(self) -> int:
        """Largest message, data and headers together, the server accepts."""
        if self._nc is None:
            return publishing.DEFAULT_MAX_PAYLOAD
        return int(self._nc.max_payload)

    @property
    def js(self) -> JetStreamContext:
        if self._js is None:
            raise BusUnavailable("bus not started")
        return self._js

    async def start(self) -> None:
        """Connect, and create or check every stream and bucket. On a cluster a creation
        forms a replica group, which a busy cluster (or one electing its meta leader) may not
        answer within one request's timeout: transient failures are retried for `retry_for`."""
        await self.connect()
        deadline = time.monotonic() + self._retry_for
        for layout in streams.layouts(
            self._prefix, events_max_age=self._events_max_age, limits=self.limits
        ):
            await self._patiently(functools.partial(self._ensure_stream, layout), deadline)
        for bucket in Buckets:
            await self._patiently(functools.partial(self.kv, bucket), deadline)

    @staticmethod
    async def _patiently(step: Callable[[], Awaitable[object]], deadline: float) -> None:
        delay = 0.1
        while True:
            try:
                await step()
                return
            except START_RETRIED as exc:
                if time.monotonic() + delay > deadline:
                    raise BusUnavailable(f"streams and buckets not ready: {exc!r}") from exc
                log.info("streams and buckets not ready (%r); again in %.2g s", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def connect(self) -> None:
        """Connect without creating anything: for read-only tools such as `events tail`."""
        if self._nc is None or self._nc.is_closed:
            self._nc = await self._connect()
            self._js = self._nc.jetstream(
                timeout=self._publish_timeout, publish_async_max_pending=4000
            )

    async def _connect(self) -> Client:
        # nats-py retries a failed first connect forever when reconnects are unlimited, so the
        # first connect gets a bounded number of attempts and the limit is lifted afterwards:
        # once connected, the client must ride through any server restart.
        attempts = max(1, int(self._retry_for / RECONNECT_WAIT))
        try:
            if self._token is not None:
                self._token.read()  # nats-py hides why a token callback failed
            nc = await tokens.connect(
                servers=self._servers,
                name=self._name,
                user_credentials=self._creds,
                token=self._token,
                allow_reconnect=True,
                max_reconnect_attempts=attempts,
                reconnect_time_wait=RECONNECT_WAIT,
                ping_interval=PING_INTERVAL,
                max_outstanding_pings=MAX_OUTSTANDING_PINGS,
                connect_timeout=2,
                drain_timeout=2,
                inbox_prefix=self.inbox_prefix,
                error_cb=_log_error,
                disconnected_cb=self._on_disconnect,
                reconnected_cb=self._on_reconnect,
            )
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            shown = ", ".join(redacted(server) for server in self._servers)
            raise BusUnavailable(f"cannot connect to {shown}: {exc!r}") from exc
        nc.options["max_reconnect_attempts"] = -1
        if self._token is not None:
            self._token_watch = asyncio.create_task(tokens.watch(nc, self._token))
        return nc

    async def _on_disconnect(self) -> None:
        if not self._closing:
            log.warning("disconnected from nats; reconnecting")

    async def _on_reconnect(self) -> None:
        await _log_reconnect()
        # pull requests die with the connection: every consumer asks again now, instead of
        # waiting out the fetch it sent before (`IDLE_FETCH_SECONDS`)
        self._reconnects += 1
        reconnected, self.reconnected = self.reconnected, asyncio.Event()
        reconnected.set()

    async def _ensure_stream(self, layout: streams.StreamLayout) -> None:
        """Create the stream, or check the existing one against what gpuop would create: a
        drift is reported, then corrected where JetStream can (subjects, retention, limits,
        dedupe window, more replicas; never fewer), and stops the start where it cannot
        (storage)."""
        config = StreamConfig(
            name=layout.name,
            subjects=list(layout.subjects),
            storage=StorageType.FILE,
            max_age=layout.max_age,
            max_bytes=streams.replica_bytes(layout.share, self.replicas),
            max_msgs_per_subject=layout.max_msgs_per_subject,
            discard=DiscardPolicy.OLD,
            duplicate_window=streams.DUPLICATE_WINDOW,
            num_replicas=self.replicas,
            placement=self.placement,
            # `last` reads by direct get, whose subject names what is read (grants)
            allow_direct=True,
        )
        try:
            await self.js.add_stream(config)  # the same configuration: nothing changes
            return
        except nats.js.errors.APIError as exc:
            if exc.err_code == PLACEMENT_ERROR:  # a member not seen online yet, or too few
                raise PlacementPending(
                    f"cannot place stream {layout.name} yet: {exc.description}"
                ) from exc
            if exc.err_code != STREAM_NAME_IN_USE:
                raise BusError(f"cannot create stream {layout.name}: {exc.description}") from exc
        try:
            async with asyncio.timeout(RECONCILE_TIMEOUT):
                info = await self.js.stream_info(layout.name)
        except nats.js.errors.NotFoundError as exc:
            raise BusError(f"stream {layout.name} vanished while it was checked") from exc
        except ANY_NATS_ERROR as exc:
            # a least-privilege user may not read it (the orchestrator's user reconciles)
            log.warning(
                "stream %s exists with another configuration, which this user cannot read "
                "(%r): leaving it to the orchestrator",
                layout.name,
                exc,
            )
            return
        await self._reconcile(layout, info.config, config)

    async def _reconcile(
        self, layout: streams.StreamLayout, have: StreamConfig, want: StreamConfig
    ) -> None:
        name = layout.name
        kept = int(have.num_replicas or 1)
        if kept > self.replicas:
            # never scale down: a service started with a lower count must not shed copies;
            # the byte limit follows the replicas kept (JetStream reserves it per replica)
            want.num_replicas = kept
            want.max_bytes = streams.replica_bytes(layout.share, kept)
            log.warning(
                "stream %s keeps its %s replicas (this service asks for %d: check --nats-replicas)",
                name,
                kept,
                self.replicas,
            )
        keys = streams.DRIFT_COMPARED
        differences = streams.drift(
            {k: getattr(have, k) for k in keys}, {k: getattr(want, k) for k in keys}
        )
        if not differences:
            return
        shown = ", ".join(f"{k} {a!r} (gpuop wants {b!r})" for k, (a, b) in differences.items())
        fixed = set(differences) - streams.DRIFT_UPDATABLE
        if fixed:
            raise BusError(
                f"stream {name} exists with {shown}; {', '.join(sorted(fixed))} cannot be "
                "changed in place: move its data out and delete the stream, or fix the setting"
            )
        log.warning("stream %s exists with %s; updating it", name, shown)
        try:
            async with asyncio.timeout(RECONCILE_TIMEOUT):
                await self.js.update_stream(want)
        except ANY_NATS_ERROR as exc:
            log.warning("stream %s not updated (%r): leaving it to the orchestrator", name, exc)

    async def stream_leader(self, stream: str) -> str:
        """The server that leads `stream` (a bucket's stream is `KV_<bucket>`); empty on one
        server without a cluster."""
        try:
            info = await self.js.stream_info(stream)
        except ANY_NATS_ERROR as exc:  # an API error, or no answer while it has no leader
            raise BusError(f"cannot read stream {stream}: {exc!r}") from exc
        return info.cluster.leader if info.cluster and info.cluster.leader else ""

    async def step_down(self, stream: str) -> None:
        """Ask `stream`'s leader to hand over to another replica (JetStream's leader
        step-down), as an operator does before taking a server down."""
        if self._nc is None:
            raise BusUnavailable("bus not started")
        subject = f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}"
        try:
            reply = await self._nc.request(subject, b"", timeout=self._publish_timeout)
        except ANY_NATS_ERROR as exc:
            raise BusError(f"step-down of {stream} failed: {exc!r}") from exc
        answer = json.loads(reply.data or b"{}")
        if answer.get("error"):
            raise BusError(f"step-down of {stream} refused: {answer['error']}")

    async def close(self) -> None:
        self._closing = True
        if self._token_watch is not None:
            self._token_watch.cancel()
        for subscription in list(self._subscriptions):
            await subscription.stop()
        if self._nc is not None and not self._nc.is_closed:
            try:
                await self._nc.drain()
            except (TimeoutError, OSError, nats.errors.Error) as exc:
                log.debug("drain on close: %r", exc)
                try:
                    await self._nc.close()
                except (TimeoutError, OSError, nats.errors.Error):
                    # nats-py's close stops at a dead transport before it stops its
                    # subscription tasks; stop them so nothing outlives the bus
                    for sub in self._nc._subs.values():
                        task = sub._wait_for_msgs_task
                        if task is not None and not task.done():
                            task.cancel()
        self._nc = self._js = None

    async def publish(self, envelope: Envelope, *, republish: bool = False) -> PublishAck:
        out = publishing.prepare(envelope, self._prefix, self._id_key)
        ack = await self._publish_outgoing(out, republish=republish)
        self._metrics.published(out.kind)
        return ack

    async def _publish_outgoing(
        self, out: publishing.Outgoing, *, republish: bool, retried: bool = False
    ) -> PublishAck:
        publishing.fitting(out, self.max_payload)
        msg_id = out.headers.get(streams.MSG_ID)
        retried = retried or (msg_id is not None and msg_id in self._unconfirmed)
        deadline = time.monotonic() + self._retry_for
        delay = 0.05
        while True:
            reconnects = self._reconnects
            try:
                ack = await self.js.publish(
                    out.subject, out.data, timeout=self._publish_timeout, headers=out.headers
                )
            except TRANSIENT as exc:
                if time.monotonic() + delay > deadline:
                    if msg_id is not None:
                        self._unconfirmed[msg_id] = None
                        while len(self._unconfirmed) > UNCONFIRMED_KEPT:
                            self._unconfirmed.popitem(last=False)
                    raise PublishTimeout(
                        f"publish to {out.subject} not confirmed: {exc!r}"
                    ) from exc
                retried = True  # the try that timed out may have been stored
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            except nats.errors.Error as exc:
                raise BusError(f"publish to {out.subject} failed: {exc}") from exc
            receipt = PublishAck(ack.stream, ack.seq, bool(ack.duplicate))
            if msg_id is not None:
                self._unconfirmed.pop(msg_id, None)
            retried = retried or reconnects != self._reconnects
            return publishing.checked(
                receipt, out, first_try=not (retried or republish), metrics=self._metrics
            )

    async def publish_batch(
        self, envelopes: Sequence[Envelope], *, republish: bool = False
    ) -> list[PublishAck]:
        outs = [
            publishing.fitting(publishing.prepare(e, self._prefix, self._id_key), self.max_payload)
            for e in envelopes
        ]
        futures = []
        reconnects = self._reconnects
        try:
            for out in outs:
                futures.append(
                    await self.js.publish_async(out.subject, out.data, headers=out.headers)
                )
            results: list[Any] = await asyncio.wait_for(
                asyncio.gather(*futures, return_exceptions=True), self._publish_timeout
            )
        except ANY_NATS_ERROR:
            results = [None] * len(outs)
        acks = []
        for out, result in zip(outs, results, strict=True):
            if isinstance(result, BaseException) or result is None:
                # pipelined publish failed: resend alone; the same id keeps it single (and
                # a duplicate answer is then that first try's)
                acks.append(await self._publish_outgoing(out, republish=republish, retried=True))
            else:
                receipt = PublishAck(result.stream, result.seq, bool(result.duplicate))
                first = not republish and reconnects == self._reconnects
                acks.append(
                    publishing.checked(receipt, out, first_try=first, metrics=self._metrics)
                )
            self._metrics.published(out.kind)
        return acks

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
        ack = await self._publish_outgoing(out, republish=republish)
        self._metrics.published(out.kind)
        return ack

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
                await self.js.add_consumer(layout.name, config)
            except nats.js.errors.BadRequestError as exc:
                # an existing consumer with a setting that cannot change: keep its position
                log.warning("consumer %s kept with its old config: %s", spec.durable, exc)

        try:
            # a cluster between two leaders answers "temporarily unavailable": wait for one
            await self._patiently(create, time.monotonic() + self._retry_for)
            psub = await self.js.pull_subscribe_bind(durable=spec.durable, stream=layout.name)
        except CONSUME_FAILURES as exc:
            raise BusUnavailable(f"cannot start consumer {spec.durable}: {exc!r}") from exc
        subscription = NatsSubscription(self, spec, handler, psub, self._metrics)
        subscription.start()
        self._subscriptions.append(subscription)
        return subscription

    def _forget(self, subscription: NatsSubscription) -> None:
        if subscription in self._subscriptions:
            self._subscriptions.remove(subscription)

    def _new_inbox(self) -> str:
        if self._nc is None:
            raise BusUnavailable("bus not started")
        return self._nc.new_inbox()

    async def kv(self, bucket: Buckets | str) -> NatsKeyValue:
        name = streams.bucket_name(self._prefix, bucket)
        if name not in self._buckets:
            self._buckets[name] = await open_bucket(
                self.js,
                name,
                new_inbox=self._new_inbox,
                replicas=self.replicas,
                placement=self.placement,
                share=self.limits.share(bucket) if bucket in streams.SHARES else None,
                direct=bucket != Buckets.SAGAS,
            )
        return self._buckets[name]

    async def last(self, subject: str) -> StoredMessage | None:
        # A direct get ($JS.API.DIRECT.GET.<stream>.<subject>): the subject is in the API
        # subject, so a grant names what may be read. Any replica answers, and one a moment
        # behind may miss the newest message: the orchestrator then re-publishes a state
        # change under its stored id, which the server drops as a repeat.
        layout = streams.stream_for(self._prefix, subject)
        try:
            raw = await self.js.get_last_msg(layout.name, subject, direct=True)
        except nats.js.errors.NotFoundError:
            return None
        except nats.errors.NoRespondersError as exc:
            raise BusUnavailable(
                f"cannot read the last message of {subject}: stream {layout.name} does not "
                "allow direct gets yet (the orchestrator's start sets allow_direct)"
            ) from exc
        except ANY_NATS_ERROR as exc:
            raise BusUnavailable(f"cannot read the last message of {subject}: {exc!r}") from exc
        headers = {k: v for k, v in (raw.headers or {}).items() if k not in DIRECT_GET_HEADERS}
        return StoredMessage(
            stream=layout.name,
            seq=raw.seq or 0,
            subject=raw.subject or subject,
            data=raw.data or b"",
            time=raw.time if raw.time is not None else datetime.fromtimestamp(0, UTC),
            headers=headers,
        )

    async def read(
        self, subject: str, *, since: datetime | None = None, follow: bool = False
    ) -> AsyncIterator[StoredMessage]:
        """Through a short-lived push consumer delivering to this connection's inbox, created
        with its filter in the subject under a name the identity's permissions give it
        (`grants.read_name`): no pull from a consumer named by anyone else, no filter but
        `subject`. Two reads of one filter by one identity take turns."""
        layout = streams.stream_for(self._prefix, subject)
        if self.identity is not None:
            name = grants.read_name(self.identity, subject)
        else:
            name = f"read-{uuid.uuid4().hex[:20]}"
        async with self._reading[name]:
            async for stored in self._read(layout.name, name, subject, since, follow):
                yield stored

    async def _read(
        self, stream: str, name: str, subject: str, since: datetime | None, follow: bool
    ) -> AsyncIterator[StoredMessage]:
        nc = self._nc
        if nc is None:
            raise BusUnavailable("bus not started")
        try:
            inbox = await nc.subscribe(nc.new_inbox())
        except ANY_NATS_ERROR as exc:
            raise BusUnavailable(f"cannot read {subject}: {exc!r}") from exc
        config = ConsumerConfig(
            name=name,
            deliver_subject=inbox.subject,
            ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.BY_START_TIME if since else DeliverPolicy.ALL,
            opt_start_time=since,
            filter_subject=subject,
            inactive_threshold=READ_INACTIVE,
            idle_heartbeat=READ_HEARTBEAT if follow else None,
            mem_storage=True,
            num_replicas=1,
        )
        try:
            pending = await self._create_reader(stream, config)
            if not follow and pending == 0:
                return
            wait = READ_HEARTBEAT * 3 if follow else READ_PENDING_WAIT
            while True:
                try:
                    msg = await inbox.next_msg(timeout=wait)
                except nats.errors.TimeoutError as exc:
                    raise BusUnavailable(
                        f"reading {subject} stopped: nothing from the server in {wait:.0f} s"
                    ) from exc
                if not msg.reply:  # an idle heartbeat, or a status the server sends
                    continue
                stored = _stored(stream, msg)
                # the server starts a start time past the last message at the first one
                if since is None or stored.time >= since:
                    yield stored
                if not follow and msg.metadata.num_pending == 0:
                    return
        except ANY_NATS_ERROR as exc:
            raise BusUnavailable(f"reading {subject} stopped: {exc!r}") from exc
        finally:
            # the consumer goes by itself `READ_INACTIVE` after its reader: no user needs
            # the right to delete consumers
            with contextlib.suppress(*ANY_NATS_ERROR):
                await inbox.unsubscribe()

    async def _create_reader(self, stream: str, config: ConsumerConfig) -> int:
        """Create a read's consumer (action `create`: never another reader's consumer of
        the same name, which is waited out) and return how many messages it has for us."""
        nc = self._nc
        assert nc is not None and config.name is not None and config.filter_subject is not None
        request = json.dumps(
            {"stream_name": stream, "config": config.as_dict(), "action": "create"}
        ).encode()
        api = f"$JS.API.CONSUMER.CREATE.{stream}.{config.name}.{config.filter_subject}"
        deadline = time.monotonic() + READ_INACTIVE * 10
        while True:
            reply = await nc.request(api, request, timeout=self._publish_timeout)
            answer = json.loads(reply.data or b"{}")
            error = answer.get("error")
            if not error:
                return int(answer.get("num_pending") or 0)
            if error.get("err_code") != CONSUMER_EXISTS or time.monotonic() > deadline:
                raise BusUnavailable(
                    f"cannot read {config.filter_subject}: {error.get('description', error)}"
                )
            await asyncio.sleep(0.25)  # another reader of the same name, or a dead one's


class NatsSubscription(PumpedSubscription):
    """A durable pull consumer's fetch loop."""

    def __init__(
        self,
        bus: NatsBus,
        spec: ConsumerSpec,
        handler: Handler,
        psub: JetStreamContext.PullSubscription,
        metrics: BusMetrics,
    ) -> None:
        super().__init__(bus, spec, handler, metrics)
        self._bus = bus
        self._psub = psub

    async def _stopped(self) -> None:
        await _unsubscribe(self._psub)
        self._bus._forget(self)

    async def _fetch_unless_reconnected(self, wanted: int) -> list[Msg]:
        """A fetch of up to `wanted` messages, given up (as a timeout) when the connection
        comes back while it waits: its pull request was lost with the old connection."""
        reconnected = asyncio.create_task(self._bus.reconnected.wait())
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


def _stored(stream: str, msg: Msg) -> StoredMessage:
    metadata = msg.metadata
    return StoredMessage(
        stream=stream,
        seq=metadata.sequence.stream,
        subject=msg.subject,
        data=msg.data,
        time=metadata.timestamp,
        headers=dict(msg.headers or {}),
    )


async def _unsubscribe(psub: JetStreamContext.PullSubscription) -> None:
    # unsubscribing before drain avoids nats-py's drain() hang after pull fetches
    try:
        await psub.unsubscribe()
    except (TimeoutError, nats.errors.Error) as exc:
        log.debug("unsubscribe: %s", exc)


async def _log_error(exc: Exception) -> None:
    log.debug("nats client error: %r", exc)


async def _log_reconnect() -> None:
    log.info("reconnected to nats")


def _read_creds(creds: str | None) -> bytes | None:
    """The credentials file's bytes, for the message-id key; None without one or when it
    cannot be read (the connect then says why)."""
    if not creds:
        return None
    try:
        with open(creds, "rb") as file:
            return file.read()
    except OSError:
        return None
