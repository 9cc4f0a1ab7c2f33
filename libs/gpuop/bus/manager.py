"""`StreamManager`: JetStream's stream administration for `NatsBus` (nats.py's
`JetStreamManager`, as far as gpuop needs it).

`ensure` creates a stream as `gpuop.bus.streams` lays it out, or checks the existing one
against that layout: a drift is reported, then corrected where JetStream can (subjects,
retention, limits, dedupe window, more replicas; never fewer), and stops the start where it
cannot (storage). A user the server does not allow to read or update a stream leaves it to
the orchestrator's user. `leader` and `step_down` read and move a stream's leader, as an
operator does before taking a server down.
"""

from __future__ import annotations

import asyncio
import json
import logging

import nats.js.errors
from nats.js.api import DiscardPolicy, Placement, StorageType, StreamConfig

from gpuop.bus import streams
from gpuop.bus.connection import ANY_NATS_ERROR, Connection
from gpuop.bus.errors import PLACEMENT_ERROR, BusError, PlacementPending

log = logging.getLogger(__name__)

STREAM_NAME_IN_USE = 10058
"""JetStream's error code for a stream that exists with another configuration."""
RECONCILE_TIMEOUT = 2.0
"""Seconds to wait for a stream's configuration or its update at start: a user the server
does not allow either gets no answer at all."""


class StreamManager:
    """Creates, checks and steers the streams of one connection."""

    def __init__(
        self, connection: Connection, *, replicas: int, placement: Placement | None
    ) -> None:
        self._connection = connection
        self._replicas = replicas
        self._placement = placement

    async def ensure(self, layout: streams.StreamLayout) -> None:
        """Create the stream, or check the existing one against what gpuop would create (see
        the module's docstring)."""
        js = self._connection.js
        config = StreamConfig(
            name=layout.name,
            subjects=list(layout.subjects),
            storage=StorageType.FILE,
            max_age=layout.max_age,
            max_bytes=streams.replica_bytes(layout.share, self._replicas),
            max_msgs_per_subject=layout.max_msgs_per_subject,
            max_msg_size=layout.max_msg_size,
            discard=DiscardPolicy.OLD,
            duplicate_window=streams.DUPLICATE_WINDOW,
            num_replicas=self._replicas,
            placement=self._placement,
            # `last` reads by direct get, whose subject names what is read (grants)
            allow_direct=True,
        )
        try:
            await js.add_stream(config)  # the same configuration: nothing changes
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
                info = await js.stream_info(layout.name)
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
        if kept > self._replicas:
            # never scale down: a service started with a lower count must not shed copies;
            # the byte limit follows the replicas kept (JetStream reserves it per replica)
            want.num_replicas = kept
            want.max_bytes = streams.replica_bytes(layout.share, kept)
            log.warning(
                "stream %s keeps its %s replicas (this service asks for %d: check --nats-replicas)",
                name,
                kept,
                self._replicas,
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
                await self._connection.js.update_stream(want)
        except ANY_NATS_ERROR as exc:
            log.warning("stream %s not updated (%r): leaving it to the orchestrator", name, exc)

    async def leader(self, stream: str) -> str:
        """The server that leads `stream` (a bucket's stream is `KV_<bucket>`); empty on one
        server without a cluster."""
        try:
            info = await self._connection.js.stream_info(stream)
        except ANY_NATS_ERROR as exc:  # an API error, or no answer while it has no leader
            raise BusError(f"cannot read stream {stream}: {exc!r}") from exc
        return info.cluster.leader if info.cluster and info.cluster.leader else ""

    async def step_down(self, stream: str) -> None:
        """Ask `stream`'s leader to hand over to another replica (JetStream's leader
        step-down)."""
        nc = self._connection.nc
        subject = f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}"
        try:
            reply = await nc.request(subject, b"", timeout=self._connection.publish_timeout)
        except ANY_NATS_ERROR as exc:
            raise BusError(f"step-down of {stream} failed: {exc!r}") from exc
        answer = json.loads(reply.data or b"{}")
        if answer.get("error"):
            raise BusError(f"step-down of {stream} refused: {answer['error']}")
