"""`Publisher`: `NatsBus`'s publishes, each waiting for the server's receipt.

What a message carries (subject, id, trace context, size limits) is `gpuop.bus.publishing`'s,
shared with the in-memory bus; this module sends it. A publish retries transient failures
for `retry_for` seconds, which is safe: the event id dedupes. A first try answered as a
duplicate is someone else's message under our id (`IdTaken`); a try after one that ended
unconfirmed, or one sent across a reconnect, may meet its own earlier copy, which is no
alarm. A batch is pipelined, and each message whose receipt did not come is sent again alone.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Sequence
from typing import Any

import nats.errors

from gpuop.bus import publishing, streams
from gpuop.bus.connection import ANY_NATS_ERROR, TRANSIENT, Connection
from gpuop.bus.errors import BusError, PublishTimeout
from gpuop.bus.protocol import PublishAck
from gpuop.events import Envelope
from gpuop.observability.metrics import BusMetrics

UNCONFIRMED_KEPT = 4096
"""Unconfirmed publish ids remembered (a caller that tries again soon; the server forgets an
id after the stream's duplicate window anyway)."""


class Publisher:
    """Publishes on one connection, under one prefix and message-id key."""

    def __init__(
        self, connection: Connection, *, prefix: str, id_key: bytes, metrics: BusMetrics
    ) -> None:
        self._connection = connection
        self._prefix = prefix
        self.id_key = id_key
        """What this publisher's message ids are keyed with (`publishing.message_id`)."""
        self._metrics = metrics
        self._unconfirmed: collections.OrderedDict[str, None] = collections.OrderedDict()
        """Ids of publishes that ended unconfirmed (`PublishTimeout`): possibly stored, so a
        later publish of one is a retry, and its duplicate answer the earlier copy."""

    async def publish(self, envelope: Envelope, *, republish: bool = False) -> PublishAck:
        out = publishing.prepare(envelope, self._prefix, self.id_key)
        return await self.publish_outgoing(out, republish=republish)

    async def publish_outgoing(
        self, out: publishing.Outgoing, *, republish: bool = False
    ) -> PublishAck:
        """A message made already (`publishing.prepare`, `publishing.raw`: a dead letter's
        replay, a hostile-input test's bytes), sent and counted."""
        ack = await self._send(out, republish=republish)
        self._metrics.published(out.kind)
        return ack

    async def publish_batch(
        self, envelopes: Sequence[Envelope], *, republish: bool = False
    ) -> list[PublishAck]:
        connection = self._connection
        outs = [
            publishing.fitting(
                publishing.prepare(e, self._prefix, self.id_key), connection.max_payload
            )
            for e in envelopes
        ]
        futures = []
        reconnects = connection.reconnects
        try:
            for out in outs:
                futures.append(
                    await connection.js.publish_async(out.subject, out.data, headers=out.headers)
                )
            results: list[Any] = await asyncio.wait_for(
                asyncio.gather(*futures, return_exceptions=True), connection.publish_timeout
            )
        except ANY_NATS_ERROR:
            results = [None] * len(outs)
        acks = []
        for out, result in zip(outs, results, strict=True):
            if isinstance(result, BaseException) or result is None:
                # pipelined publish failed: resend alone; the same id keeps it single (and
                # a duplicate answer is then that first try's)
                acks.append(await self._send(out, republish=republish, retried=True))
            else:
                receipt = PublishAck(result.stream, result.seq, bool(result.duplicate))
                first = not republish and reconnects == connection.reconnects
                acks.append(
                    publishing.checked(receipt, out, first_try=first, metrics=self._metrics)
                )
            self._metrics.published(out.kind)
        return acks

    async def _send(
        self, out: publishing.Outgoing, *, republish: bool, retried: bool = False
    ) -> PublishAck:
        connection = self._connection
        publishing.fitting(out, connection.max_payload)
        msg_id = out.headers.get(streams.MSG_ID)
        retried = retried or (msg_id is not None and msg_id in self._unconfirmed)
        deadline = time.monotonic() + connection.retry_for
        delay = 0.05
        while True:
            reconnects = connection.reconnects
            try:
                ack = await connection.js.publish(
                    out.subject, out.data, timeout=connection.publish_timeout, headers=out.headers
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
            retried = retried or reconnects != connection.reconnects
            return publishing.checked(
                receipt, out, first_try=not (retried or republish), metrics=self._metrics
            )
