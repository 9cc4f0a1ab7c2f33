"""Attack, end to end: one node's credential floods the bus with everything its grants allow
while a rollout runs (issue 37, finding 4), on the shipped callout configuration: a real
nats-server running callout.conf, gpuop's auth callout, the simulated cluster and the real
services as `gpuop run` processes (`stack`), each connected as its own per-node user.

From the first cordon until every other node is done, driver-manager@<the last node>
(a second connection with that agent's own credential) publishes messages as large as the
server takes (1 MB) and as the event log stores (`streams.EVENT_BYTES`) on every event
subject its user may publish to, 1 MB dead letters under made-up names on its dead-letter
subjects, events under made-up names (refused: the grants are the events
registry's exact names), and holds subscriptions up to the account's per-connection cap.
The rollout of the other nodes finishes; each of their events is in the log in order (every
state change follows on from the one before, every driver command has its answer); the log
keeps its history (its first event of another node than the flooder's, and every other
node's messages from before the flood).
Each attempt's outcome is printed as a row of the attack table.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client

from gpuop.bus import grants, streams
from gpuop.events import Command, subjects
from gpuop.events import driver as dm
from gpuop.events.upgrade import UpgradeState
from gpuop.saga import replaying
from gpuop.saga.actions import STATE_LABEL
from tests.support import invariants
from tests.support.callout_nats import CalloutNats, running
from tests.support.rollouts import log_of, upgrade_policy
from tests.support.shipped_nats import SENTINEL
from tests.support.stack import Stack, stack

pytestmark = [pytest.mark.nats, pytest.mark.security]

S = UpgradeState
NODES, GPUS = 4, 2
EVENTS, DLQ = "GPUOP_EVENTS", "GPUOP_DLQ"
SUBSCRIPTIONS = 1000
"""Subscriptions the flooder holds: up to callout.conf's `max_subscriptions` (1,024 per
connection, the client's own among them; one more closes the connection)."""
ROLLOUT_TIMEOUT = 180.0


@dataclass
class Flood:
    """The flooder's own thread and event loop (the test's loop answers the callout and
    watches the rollout): publishes until `stop` is set, counting what it sent."""

    server: CalloutNats
    identity: grants.Identity
    stop: threading.Event = field(default_factory=threading.Event)
    sent: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    subscriptions: int = 0
    errors: list[str] = field(default_factory=list)
    _thread: threading.Thread | None = None

    def targets(self) -> tuple[list[str], list[str]]:
        """The event subjects its user may publish, and its dead-letter patterns with a
        made-up name for the wildcard."""
        publish = grants.for_identity(self.identity).publish
        events = [p for p in publish if p.split(".")[1] == subjects.Kind.EVENT]
        letters = [p for p in publish if p.split(".")[1] == subjects.Kind.DEAD_LETTER]
        return events, letters

    def start(self) -> None:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="flood")
        self._thread.start()

    def finish(self) -> None:
        self.stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
            assert not self._thread.is_alive(), "the flood did not stop"

    async def _settle(self, publisher: Client) -> None:
        """Until the server has answered every publish so far: a PONG may overtake the -ERR
        of a refused publish, so the proof is the refusal of one more, sent last."""
        refusal = f'permissions violation for publish to "{SENTINEL}"'
        await publisher.publish(SENTINEL, b"")
        await publisher.flush(timeout=30)
        for _ in range(300):
            if any(refusal in error for error in self.errors):
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"no refusal of {SENTINEL} within 30 s")

    async def _run(self) -> None:
        async def record(error: Exception) -> None:
            self.errors.append(str(error).lower())

        token = self.server.token(self.identity.role, self.identity.node)
        publisher = await self.server.token_client(token, self.identity, error_cb=record)
        holder = await self.server.token_client(token, self.identity, error_cb=record)
        try:
            for n in range(SUBSCRIPTIONS):
                await holder.subscribe(f"{grants.inbox_prefix(self.identity)}.flood-{n}")
                self.subscriptions += 1
            await holder.flush()
            body = b"x" * publisher.max_payload
            stored = b"x" * (streams.EVENT_BYTES - 64)  # the largest event the log stores
            events, letters = self.targets()
            node = subjects.encode_node(self.identity.node or "")
            rounds = 0
            while not self.stop.is_set():
                for subject in events:
                    await publisher.publish(subject, body)
                    await publisher.publish(subject, stored)
                    self.sent["events"] += 2
                for pattern in letters:
                    await publisher.publish(pattern.replace("*", f"flood-{rounds}"), body)
                    self.sent["dead letters"] += 1
                await publisher.publish(f"gpuop.evt.driver.{node}.flood-{rounds}", body)
                self.sent["made-up"] += 1
                await publisher.flush(timeout=30)
                rounds += 1
            await self._settle(publisher)
            self.refused["made-up"] = sum(
                f'permissions violation for publish to "gpuop.evt.driver.{node}.flood-' in e
                for e in self.errors
            )
            self.refused["events"] = sum('publish to "gpuop.evt.' in e for e in self.errors)
            self.refused["events"] -= self.refused["made-up"]
        except (nats.errors.Error, OSError) as error:
            self.errors.append(f"flood stopped: {error!r}")
        finally:
            await publisher.close()
            await holder.close()


async def stream_state(server: CalloutNats, stream: str) -> tuple[int, dict[str, int]]:
    """The stream's first sequence and its messages per subject."""
    admin = await server.password_client("admin")
    try:
        info = await admin.jetstream().stream_info(stream, subjects_filter=">")
        return info.state.first_seq, dict(info.state.subjects or {})
    finally:
        await admin.close()


async def first_of_others(server: CalloutNats, node_token: str, seq: int) -> tuple[int, str]:
    """The first message of the log from `seq` on that is not about node `node_token`
    (whose own names the flood may roll): its sequence and subject; (0, "") when none."""
    admin = await server.password_client("admin")
    try:
        js = admin.jetstream()
        last = (await js.stream_info(EVENTS)).state.last_seq
        for at in range(seq, last + 1):
            try:
                message = await js.get_msg(EVENTS, seq=at)
            except nats.js.errors.NotFoundError:
                continue
            if message.subject and message.subject.split(".")[3] != node_token:
                return at, message.subject
        return 0, ""
    finally:
        await admin.close()


async def purge_node(server: CalloutNats, node: str) -> None:
    """Take the flooder's node's events out of the log, to export the rest in a moment."""
    admin = await server.password_client("admin")
    try:
        await admin.jetstream().purge_stream(EVENTS, subject=f"gpuop.evt.*.{node}.>")
    finally:
        await admin.close()


def unanswered(log: list[replaying.Recorded], node: str) -> list[str]:
    """Driver commands to `node` in the log with no answer naming their id."""
    asked = {
        entry.envelope.id
        for entry in log
        if entry.envelope.subject == node
        and isinstance(entry.payload, Command)
        and type(entry.payload).__module__ == dm.__name__
    }
    answered = {getattr(entry.payload, "command_id", None) for entry in log}
    return sorted(asked - answered)


@pytest.mark.timeout(480)
async def test_a_rollout_finishes_while_one_nodes_credential_floods_the_bus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running(tmp_path / "nats") as server:
        monkeypatch.setenv("SSL_CERT_FILE", str(server.ca_file))
        await server.make_streams()
        async with stack(
            tmp_path, server.url, nodes_count=NODES, gpus=GPUS, seed=37, callout=server
        ) as rolling:
            flooded = rolling.node_names[-1]
            others = [node for node in rolling.node_names if node != flooded]
            flood = Flood(server, grants.Identity("driver-manager", flooded))
            await rolling.start_replica()
            await rolling.start_rollout({**upgrade_policy(max_parallel=2), "maxUnavailable": "50%"})
            await rolling.wait_until("a first cordon", lambda: cordoned(rolling), 120)
            first_seq, before = await stream_state(server, EVENTS)
            history = await first_of_others(server, subjects.encode_node(flooded), first_seq)
            dlq_first, _ = await stream_state(server, DLQ)
            flood.start()
            try:
                await rolling.wait_until(
                    "every other node upgrade-done under the flood",
                    lambda: done(rolling, others),
                    ROLLOUT_TIMEOUT,
                )
            finally:
                flood.finish()
            after_seq, after = await stream_state(server, EVENTS)
            kept_history = await first_of_others(server, subjects.encode_node(flooded), history[0])
            dlq_after, _ = await stream_state(server, DLQ)
            states = {
                node: found.get(STATE_LABEL) for node, found in (await rolling.labels()).items()
            }
            await purge_node(server, subjects.encode_node(flooded))
            lines = await rolling.export()

    node_token = subjects.encode_node(flooded)
    kept = {s: n for s, n in after.items() if s.split(".")[3] == node_token}
    rows = [
        (f"{flood.sent['events']} events of 1 MB and 128 KB on its "
         f"{len(flood.targets()[0])} event names",
         f"{flood.refused['events']} refused by permissions; the log keeps "
         f"{sum(kept.values())} on the node's {len(kept)} subjects, none over "
         f"{streams.EVENT_BYTES} B (at most {streams.DEFAULT_EVENTS_PER_SUBJECT} each)"),
        (f"{flood.sent['dead letters']} dead letters of 1 MB under made-up names",
         f"dead letters' first sequence {dlq_first} -> {dlq_after}"),
        (f"{flood.sent['made-up']} events of 1 MB under made-up names",
         f"{flood.refused['made-up']} refused: permissions violation"),
        (f"{SUBSCRIPTIONS} subscriptions held on its own inbox", f"{flood.subscriptions} taken"),
        ("the rollout meanwhile", ", ".join(f"{n}={s}" for n, s in states.items())),
        ("the log's history", f"first sequence {first_seq} -> {after_seq}; the first "
         f"other node's event #{history[0]} ({history[1]}) kept: {kept_history == history}"),
    ]  # fmt: skip
    print(f"\ndriver-manager@{flooded} flooding the bus during a rollout:")
    for what, outcome in rows:
        print(f"  {what:<58} {outcome}")
    print(f"  flood errors: {[e for e in flood.errors if 'permissions' not in e][:3]}")

    assert flood.sent["events"] > 0 and flood.subscriptions == SUBSCRIPTIONS
    assert flood.refused["made-up"] == flood.sent["made-up"]
    assert history[0] > 0 and kept_history == history, "the flood rolled the log's history out"
    # the flooder rolls its own node's names (at most 240 each), nobody else's
    others_before = {s: n for s, n in before.items() if s.split(".")[3] != node_token}
    lost = {s: (n, after.get(s, 0)) for s, n in others_before.items() if after.get(s, 0) < n}
    assert lost == {}, f"subjects that lost messages from before the flood: {lost}"
    # the flooder's node is left out: its events before the purge are gone, later ones not
    log = [e for e in log_of(lines, tmp_path / "rollout.jsonl") if e.envelope.subject != flooded]
    walk = invariants.check(log, max_unavailable=2)
    assert not walk.violations, "\n".join(walk.violations)
    for node in others:
        path = invariants.states(walk, node)
        assert path[-1] is S.UPGRADE_DONE, (node, path)
        assert unanswered(log, node) == [], node
    assert rolling.unclean_exits() == {}


async def cordoned(rolling: Stack) -> bool:
    labels = await rolling.labels()
    return any(
        found.get(STATE_LABEL) not in (None, S.UPGRADE_REQUIRED) for found in labels.values()
    )


async def done(rolling: Stack, nodes: list[str]) -> bool:
    labels = await rolling.labels()
    return all(labels[node].get(STATE_LABEL) == S.UPGRADE_DONE for node in nodes)
