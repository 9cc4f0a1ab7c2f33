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
from typing import Any

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
identity waits for it to go (`READ_CREATE_WAIT`)."""
READ_CREATE_WAIT = 15.0
"""Seconds a read's create is asked again: while a consumer of its name goes (a reader gone
`READ_INACTIVE` ago) or its new consumer's replicas elect a leader."""
CREATE_TRY = 1.0
"""Seconds one try of a read's create waits for its answer (one takes hundredths)."""
READ_END_HEARTBEAT = 1.0
"""Seconds between idle heartbeats to a read that does not follow: the first one ends it when
its consumer's answer did not say how much it holds."""
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
            idle_heartbeat=READ_HEARTBEAT if follow else READ_END_HEARTBEAT,
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
                    if not follow and pending is None and _idle(msg):
                        return  # it has nothing more for us
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

    async def _create_reader(self, stream: str, config: ConsumerConfig) -> int | None:
        """Create a read's consumer (action `create`: never another reader's consumer of
        the same name, which is waited out) and return how many messages it has for us
        (None: not known).

        A consumer with replicas answers once they elected its first leader: seconds when
        one of them is a lost server. Until then a try goes unanswered, or is answered
        without a leader (nor what it holds), and the same create is asked again: the
        consumer made first answers it, with what it holds not always known (a leader just
        elected): the read then ends at its first idle heartbeat."""
        assert config.name is not None and config.filter_subject is not None
        api = f"$JS.API.CONSUMER.CREATE.{stream}.{config.name}.{config.filter_subject}"
        deadline = time.monotonic() + READ_CREATE_WAIT
        unsure = False  # a try of ours may have made the consumer: its answer was lost
        while True:
            request = {"stream_name": stream, "config": config.as_dict(), "action": "create"}
            answer = await self._ask(api, request)
            error = (answer or {}).get("error")
            if answer is not None and not error:
                if _led(answer):
                    return None if unsure else int(answer.get("num_pending") or 0)
            elif (
                error
                and error.get("err_code") == MORE_REPLICAS_THAN_STREAM
                and (config.num_replicas != 1)
            ):
                config.num_replicas = 1  # a stream made with one replica (by a service told 1)
                continue
            elif error and error.get("err_code") != CONSUMER_EXISTS:
                raise BusUnavailable(f"cannot read {config.filter_subject}: {_why(answer)}")
            elif answer is None and not self._connection.nc.is_connected:
                # no server to elect anything: the caller's own retry, or its local job
                # meanwhile (a node agent keeps serving while NATS is down)
                raise BusUnavailable(f"cannot read {config.filter_subject}: NATS unreachable")
            # unanswered, no leader yet, or another reader's consumer of our name (or a dead
            # one's) still there: ask again
            unsure = unsure or answer is None or not error
            if time.monotonic() > deadline:
                raise BusUnavailable(f"cannot read {config.filter_subject}: {_why(answer)}")
            if answer is not None:
                await asyncio.sleep(0.25)

    async def _ask(self, api: str, request: dict[str, Any]) -> dict[str, Any] | None:
        """The server's answer to an API request; None when none came in `CREATE_TRY`."""
        try:
            reply = await self._connection.nc.request(
                api, json.dumps(request).encode(), timeout=CREATE_TRY
            )
        except nats.errors.TimeoutError:
            return None
        answer: dict[str, Any] = json.loads(reply.data or b"{}")
        return answer


def _idle(msg: Msg) -> bool:
    """Whether `msg` is a consumer's idle heartbeat (status 100, nothing to deliver)."""
    return (msg.headers or {}).get("Status") == "100"


def _led(answer: dict[str, Any]) -> bool:
    """Whether a created consumer's answer comes from its leader (one server: no cluster)."""
    cluster = answer.get("cluster")
    return cluster is None or bool(cluster.get("leader"))


def _why(answer: dict[str, Any] | None) -> str:
    if answer is None:
        return f"no answer in {CREATE_TRY:.0f} s"
    error = answer.get("error")
    if error:
        return str(error.get("description", error))
    return "its replicas elected no leader"


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
