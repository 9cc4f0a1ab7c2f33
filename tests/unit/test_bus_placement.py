"""A cluster that has just started may answer a stream's or bucket's creation with
JetStream's "no suitable peers for placement" (10005) while its meta leader does not yet see
every member online: the start asks again (`PlacementPending`), and only until its deadline."""

from __future__ import annotations

import time
from typing import Any

import nats.js.errors
import pytest

from gpuop.bus import NatsBus
from gpuop.bus.connection import START_RETRIED, patiently
from gpuop.bus.errors import BusError, BusUnavailable, PlacementPending
from gpuop.bus.kv import open_bucket
from gpuop.bus.streams import layouts

NO_PEERS = nats.js.errors.APIError(
    code=503, err_code=10005, description="no suitable peers for placement, peer offline"
)


class RefusingJetStream:
    """Answers every creation with `error` until `refusals` have been given."""

    def __init__(self, error: Exception, refusals: int) -> None:
        self.error, self.refusals, self.calls = error, refusals, 0

    async def add_stream(self, config: Any) -> None:
        self.calls += 1
        if self.calls <= self.refusals:
            raise self.error

    async def key_value(self, name: str) -> Any:
        raise nats.js.errors.BucketNotFoundError()

    async def create_key_value(self, config: Any) -> Any:
        self.calls += 1
        raise self.error


async def test_a_stream_without_peers_yet_is_placement_pending_and_retried() -> None:
    bus = NatsBus("nats://127.0.0.1:1", retry_for=5.0)
    refusing = RefusingJetStream(NO_PEERS, refusals=2)
    bus._connection._js = refusing  # type: ignore[assignment]
    layout = layouts("gpuop")[0]

    with pytest.raises(PlacementPending, match=f"cannot place stream {layout.name} yet"):
        await bus._manager.ensure(layout)
    assert PlacementPending in START_RETRIED
    await patiently(lambda: bus._manager.ensure(layout), time.monotonic() + 5.0)
    assert refusing.calls == 3  # twice refused, then created


async def test_placement_still_pending_at_the_deadline_fails_the_start() -> None:
    bus = NatsBus("nats://127.0.0.1:1")
    bus._connection._js = RefusingJetStream(NO_PEERS, refusals=1000)  # type: ignore[assignment]
    layout = layouts("gpuop")[0]

    with pytest.raises(BusUnavailable, match="no suitable peers for placement"):
        await patiently(lambda: bus._manager.ensure(layout), time.monotonic() + 0.5)


async def test_other_refusals_stop_at_once() -> None:
    other = nats.js.errors.APIError(code=400, err_code=10052, description="invalid config")
    bus = NatsBus("nats://127.0.0.1:1")
    bus._connection._js = RefusingJetStream(other, refusals=1)  # type: ignore[assignment]

    with pytest.raises(BusError, match="cannot create stream") as raised:
        await bus._manager.ensure(layouts("gpuop")[0])
    assert not isinstance(raised.value, PlacementPending)


async def test_a_bucket_without_peers_yet_is_placement_pending() -> None:
    refusing = RefusingJetStream(NO_PEERS, refusals=1)

    with pytest.raises(PlacementPending, match="cannot place bucket KV_x yet"):
        await open_bucket(
            refusing,  # type: ignore[arg-type]
            "KV_x",
            new_inbox=lambda: "_INBOX.x",
            replicas=3,
        )
