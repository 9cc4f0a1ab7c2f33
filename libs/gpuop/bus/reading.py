"""`Reader`: `NatsBus`'s reads of what a stream stores, for replay, `events tail` and the
orchestrator's look at a subject's newest message.

`last` is a direct get (`$JS.API.DIRECT.GET.<stream>.<subject>`): the subject is in the API
subject, so a grant names what may be read. `read` goes through a short-lived push consumer
delivering to this connection's inbox, created with its filter in the subject under a name
the identity's permissions give it (`grants.read_name`): no pull from a consumer named by
anyone else, no filter but `subject`, and no right to delete consumers needed (it goes by
itself `READ_INACTIVE` after its reader).

The read's consumer has as many replicas as the streams (`replicas`). Only the server leading
a consumer notices that its reader is gone, so a one-replica consumer on a server SIGKILLed for
good was never removed: its name, fixed per identity and filter, stayed taken, and every later
read of that filter by that identity was refused ("consumer already exists"; the orchestrator's
claims read after a server loss). Replicated, its survivors elect a leader, which keeps a
following read going through the loss and removes the consumer once its reader is gone.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from gpuop.bus import grants, streams
from gpuop.bus.connection import ANY_NATS_ERROR, Connection
from gpuop.bus.errors import BusUnavailable
from gpuop.bus.protocol import StoredMessage

DIRECT_GET_HEADERS = frozenset(
    ("Nats-Stream", "Nats-Subject", "Nats-Sequence", "Nats-Time-Stamp", "Nats-Num-Pending",
     "Nats-Last-Sequence", "Nats-UpTo-Sequence")
)  # fmt: skip
"""What a direct get's answer adds to the stored message's own headers."""
CONSUMER_EXISTS = 10148
"""JetStream's error code for a create (action `create`) of a consumer that exists."""
MORE_REPLICAS_THAN_STREAM = 10126
"""JetStream's error code for a consumer with more replicas than its stream."""
READ_INACTIVE = 1.0
"""Seconds a read's consumer outlives its reader; a second read of the same filter by the same
identity waits for it to go."""
READ_HEARTBEAT = 5.0
"""Seconds between the server's idle heartbeats to a following read; three missed ones end
the read with `BusUnavailable` (the consumer or the connection is gone)."""
READ_PENDING_WAIT = 10.0
"""Seconds a read waits for a message the server said it has."""


class Reader:
    """Reads the streams of one connection under one prefix."""

    def __init__(self, connection: Connection, *, prefix: str, replicas: int = 1) -> None:
        self._connection = connection
        self._prefix = prefix
        self._replicas = replicas
        self._reading = collections.defaultdict[str, asyncio.Lock](asyncio.Lock)

    async def last(self, subject: str) -> StoredMessage | None:
        # Any replica answers a direct get, and one a moment behind may miss the newest
        # message: the orchestrator then re-publishes a state change under its stored id,
        # which the server drops as a repeat.
        layout = streams.stream_for(self._prefix, subject)
        try:
            raw = await self._connection.js.get_last_msg(layout.name, subject, direct=True)
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
        """The messages of `subject` (from `since`; with `follow`, then each as it comes).
        Two reads of one filter by one identity take turns."""
        layout = streams.stream_for(self._prefix, subject)
        identity = self._connection.identity
        if identity is not None:
            name = grants.read_name(identity, subject)
        else:
            name = f"read-{uuid.uuid4().hex[:20]}"
        async with self._reading[name]:
            async for stored in self._read(layout.name, name, subject, since, follow):
                yield stored

    async def _read(
        self, stream: str, name: str, subject: str, since: datetime | None, follow: bool
    ) -> AsyncIterator[StoredMessage]:
        nc = self._connection.nc
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
            num_replicas=self._replicas,
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
        nc = self._connection.nc
        assert config.name is not None and config.filter_subject is not None
        api = f"$JS.API.CONSUMER.CREATE.{stream}.{config.name}.{config.filter_subject}"
        deadline = time.monotonic() + READ_INACTIVE * 10
        while True:
            request = {"stream_name": stream, "config": config.as_dict(), "action": "create"}
            reply = await nc.request(
                api, json.dumps(request).encode(), timeout=self._connection.publish_timeout
            )
            answer = json.loads(reply.data or b"{}")
            error = answer.get("error")
            if not error:
                return int(answer.get("num_pending") or 0)
            if error.get("err_code") == MORE_REPLICAS_THAN_STREAM and config.num_replicas != 1:
                config.num_replicas = 1  # a stream made with one replica (by a service told 1)
                continue
            if error.get("err_code") != CONSUMER_EXISTS or time.monotonic() > deadline:
                raise BusUnavailable(
                    f"cannot read {config.filter_subject}: {error.get('description', error)}"
                )
            await asyncio.sleep(0.25)  # another reader of the same name, or a dead one's


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
