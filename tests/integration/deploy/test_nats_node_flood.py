"""Attack: one node's credential floods the event log during a rollout, to push the audit
trail out and stall the orchestrator (issue 37, finding 4), under the callout's per-node
user against a real nats-server running callout.conf as shipped, with the streams as the
services make them.

driver-manager@gpu-2 publishes large events under made-up names (refused: its grants are the
events registry's exact names, not `*`), floods one of its real subjects (the stream keeps
`events_per_subject` of it, its own, and nothing of anyone else's), and opens subscriptions
without end (its connection is closed at callout.conf's per-connection limit).
Meanwhile gpu-1 and the orchestrator go on publishing: every one of their events, and the
history from before the flood, is still in the log after it. (That the orchestrator's
consumer keeps handling other nodes while one floods is
`test_a_flooding_node_holds_only_its_share_of_the_slots` in
tests/integration/bus/test_contract.py.) Each attempt's outcome is printed.
"""

from __future__ import annotations

import nats.errors
import pytest

from gpuop.bus import grants, streams
from gpuop.events import subjects
from gpuop.services.upgrade_orchestrator import intake
from tests.support.callout_nats import CalloutNats
from tests.support.shipped_nats import Refusals

pytestmark = [pytest.mark.nats, pytest.mark.security]

FLOODER = grants.Identity("driver-manager", "gpu-2")
HONEST = grants.Identity("driver-manager", "gpu-1")
EVENTS = "GPUOP_EVENTS"
SUBSCRIPTIONS = 1024
"""callout.conf's `max_subscriptions` per connection (the user JWT's smaller `subs`,
`callouts.NODE_SUBSCRIPTIONS`, nats-server 2.15 does not apply to a callout's users)."""
MADE_UP, REAL = 300, streams.DEFAULT_EVENTS_PER_SUBJECT + 60
BODY = b"x" * (streams.EVENT_BYTES - 64)
"""As large as the event log stores (a larger one the stream refuses:
`test_the_server_refuses_an_event_larger_than_the_log_stores`)."""


async def connect(server: CalloutNats, identity: grants.Identity, refusals: Refusals) -> None:
    token = server.token(identity.role, identity.node)
    refusals.nc = await server.token_client(token, identity, error_cb=refusals.record)


async def stored(server: CalloutNats, subject_filter: str) -> dict[str, int]:
    admin = await server.password_client("admin")
    try:
        info = await admin.jetstream().stream_info(EVENTS, subjects_filter=subject_filter)
        return dict(info.state.subjects or {})
    finally:
        await admin.close()


async def test_one_nodes_flood_leaves_the_others_events_and_the_history(
    server: CalloutNats,
) -> None:
    history = subjects.event_subject("upgrade", "gpu-1", "cordon-required")
    honest_subject = subjects.event_subject("driver", "gpu-1", "unloaded")
    admin = await server.password_client("admin")
    await admin.jetstream().publish(history, b'{"before": "the flood"}')

    honest, flooder = Refusals(), Refusals()
    await connect(server, HONEST, honest)
    await connect(server, FLOODER, flooder)
    rows: list[tuple[str, str]] = []
    try:
        for n in range(MADE_UP):
            await flooder.nc.publish(f"gpuop.evt.driver.gpu-2.filler-{n}", BODY)
            if n % 50 == 0:
                await honest.nc.publish(honest_subject, f'{{"n": {n}}}'.encode())
        await flooder.settle()
        refused = sum(flooder.refused_publish(f"gpuop.evt.driver.gpu-2.filler-{n}")
                      for n in range(MADE_UP))  # fmt: skip
        rows.append((f"{MADE_UP} events of 128 KB under made-up names",
                     f"{refused} refused: permissions violation"))  # fmt: skip

        real = subjects.event_subject("driver", "gpu-2", "loaded")
        for n in range(REAL):
            await flooder.nc.publish(real, BODY)
            if n % 50 == 0:
                await honest.nc.publish(honest_subject, f'{{"n": {MADE_UP + n}}}'.encode())
        await flooder.nc.flush()
        await honest.nc.flush()
        kept = (await stored(server, real)).get(real, 0)
        rows.append((f"{REAL} events of 128 KB on {real}", f"the log keeps the last {kept}"))

        taken = 0
        for n in range(SUBSCRIPTIONS + 10):
            try:
                await flooder.nc.subscribe(f"{grants.inbox_prefix(FLOODER)}.sub-{n}")
                await flooder.nc.flush(timeout=2)
            except (nats.errors.ConnectionClosedError, nats.errors.TimeoutError):
                break
            taken += 1
        closed = flooder.nc.is_closed
        rows.append((f"{SUBSCRIPTIONS + 10} subscriptions on its own inbox",
                     f"connection closed after {taken}" if closed else "all taken"))  # fmt: skip
    finally:
        await flooder.nc.close()
        await honest.nc.close()
        await admin.close()

    gpu2 = await stored(server, "gpuop.evt.*.gpu-2.>")
    gpu1 = await stored(server, "gpuop.evt.*.gpu-1.>")
    print(f"\n{FLOODER.role}@{FLOODER.node} flooding the event log:")
    for what, outcome in rows:
        print(f"  {what:<58} {outcome}")
    print(f"  after it: gpu-2's {len(gpu2)} subjects in the log {sorted(gpu2)[:3]}; gpu-1's {gpu1}")
    assert refused == MADE_UP
    assert list(gpu2) == [real] and kept == streams.DEFAULT_EVENTS_PER_SUBJECT
    assert closed and SUBSCRIPTIONS - 8 <= taken < SUBSCRIPTIONS + 10
    expected_honest = len(range(0, MADE_UP, 50)) + len(range(0, REAL, 50))
    assert gpu1 == {history: 1, honest_subject: expected_honest}


@pytest.fixture
def server(callout_server: CalloutNats) -> CalloutNats:
    return callout_server


def test_the_orchestrators_intake_gives_one_node_only_a_share_of_its_slots() -> None:
    spec = intake.consumer_spec("gpuop")
    assert spec.max_in_flight_per_node is not None
    assert spec.max_in_flight_per_node < spec.max_in_flight
