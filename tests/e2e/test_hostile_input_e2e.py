"""Bad input during a rollout, end to end (real processes, a real nats-server, the simulated
cluster): while four nodes roll two at a time under two orchestrator replicas, a hypothesis
suite publishes 10,000 hostile messages (tests/e2e/hostile_traffic.py) on every subject the
running services consume. No service exits, the rollout completes with its invariants
intact, and every hostile message is accounted for from what the system exposes:

- each consumer that reads it dead-letters it with a reason when it is malformed (not an
  envelope, invalid, about another node than its subject's, about an invalid node name),
  and when it is valid but cannot succeed (an inventory of a node that never registers, once
  the labeler's `max_deliver` is spent);
- each consumer acks a later version of a known type (counted as an unknown type), and a
  valid message that concerns no saga (a node without one, ids nobody issued, an old
  command: the driver-manager replays its answer, a reboot of another boot: dropped);
- a message no consumer reads (a command to a node without an agent, or to an invalid
  name) stays in the commands stream, unread, until the stream's limits drop it (30 days);
- one as large as the server stores is dead-lettered cut to fit beside the dead letter's
  headers (`Gpuop-Dlq-Truncated`), one under a subject nearly as long as a protocol line
  under a subject cut short; one over the payload limit is refused by the publisher
  (`MessageTooLarge`), which stays connected.

The accounting reads the dead-letter stream and its headers, every durable consumer's state
on the server (nothing pending, nothing unacknowledged), the streams' contents, and the
services' own /metrics counters.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import re
import signal
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import nats
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from nats.js.api import AckPolicy, ConsumerInfo, RetentionPolicy
from prometheus_client.parser import text_string_to_metric_families

from gpuop.bus import MessageTooLarge, NatsServer, streams
from gpuop.events import MalformedMessage, UnknownEventType, decode, subjects
from gpuop.events import hardware as hw
from gpuop.events.upgrade import UpgradeState
from gpuop.kube import customobjects
from tests.e2e.hostile_traffic import BATCH, QUOTAS, RARE, Hostile, Traffic
from tests.support import invariants
from tests.support.rollouts import every_node_done, log_of
from tests.support.stack import Stack, stack

pytestmark = [pytest.mark.nats, pytest.mark.slow]

NODES, GPUS, PARALLEL = 4, 2, 2
MESSAGES = 10_000
RESUME_AT = MESSAGES // 20
"""Messages published while the rollout is paused (its sagas built, no node admitted)."""
EXAMPLES = MESSAGES // BATCH
ROLLOUT_TIMEOUT = 180.0
SETTLE_TIMEOUT = 60.0
LABELER_RETRY = 0.2
"""Seconds between the labeler's tries of an inventory whose Node is not registered: it
dead-letters one of a node that never registers after its `max_deliver` (60) tries."""
LONGEST_LOG_LINE = 16 * 1024
"""A hostile message must not make a huge log line (its huge field echoed)."""
POLICIES = customobjects.GPU_CLUSTER_POLICIES
HEALTH = re.compile(r"health endpoints on http://([0-9.]+):(\d+)")
MALFORMED, NEWER, VALID = "malformed", "newer", "valid"
VERDICTS = {
    "garbage": {MALFORMED},
    "mismatch": {MALFORMED},
    "invalid-node": {MALFORMED},
    "long-subject": {MALFORMED},
    "newer": {NEWER},
    "ghost": {VALID},
    "ghost-inventory": {VALID},
    "stale": {VALID},
    "old-command": {VALID},
}
"""What the bus must make of each category (the others may come out any way)."""


def upgrade_policy() -> dict[str, Any]:
    return {
        "maxParallelUpgrades": PARALLEL,
        "maxUnavailable": "50%",
        "podDeletion": {"force": True, "deleteEmptyDir": True, "timeoutSeconds": 60},
        "drain": {"enable": True, "force": True, "deleteEmptyDir": True, "timeoutSeconds": 60},
        "retry": {"maxAttempts": 1},
    }


@dataclass(frozen=True)
class Sent:
    """A hostile message the server stored."""

    message: Hostile
    stream: str
    seq: int


@dataclass
class Publisher:
    """Publishes batches of hostile messages straight to JetStream, fast (pipelined acks);
    remembers where each was stored, and which the publisher refused."""

    running: Stack
    nc: Any
    js: Any
    sent: list[Sent] = field(default_factory=list)
    refused: list[Hostile] = field(default_factory=list)
    issued: list[tuple[str, bytes]] = field(default_factory=list)
    """Driver commands the orchestrator issued, for `old-command` messages."""
    deferred: list[Hostile] = field(default_factory=list)
    """`old-command` messages drawn before the orchestrator issued any command."""

    refreshed: float = 0.0
    """When `issued` was last read from the commands stream (monotonic)."""

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(cls, running: Stack) -> AsyncIterator[Publisher]:
        nc = await nats.connect(running.nats_url, name="hostile")
        try:
            yield cls(running, nc, nc.jetstream(publish_async_max_pending=BATCH * 2))
        finally:
            await nc.close()

    @property
    def attempted(self) -> int:
        return len(self.sent) + len(self.refused) + len(self.deferred)

    async def _refresh_issued(self) -> None:
        """Read the driver commands the orchestrator issued (at most once a second)."""
        if time.monotonic() - self.refreshed < 1.0:
            return
        self.refreshed = time.monotonic()
        subject = subjects.commands_filter("driver-manager")
        self.issued = [
            (stored.subject, stored.data)
            async for stored in self.running.bus.read(subject)
            if streams.MSG_ID in stored.headers  # the orchestrator's, not a replay of ours
        ]

    async def publish(self, batch: list[Hostile]) -> None:
        pending = []
        for message in batch[: MESSAGES - self.attempted]:
            if message.category == "old-command":
                await self._refresh_issued()
                if not self.issued:
                    self.deferred.append(message)
                    continue
                subject, data = self.issued[message.pick % len(self.issued)]
                message = Hostile(message.category, subject, data, message.pick)
            if message.category == "over-limit" or over_the_log(message):
                await self._refused(message)
                continue
            pending.append((message, await self.js.publish_async(message.subject, message.data)))
        acks = await asyncio.gather(*(future for _, future in pending))
        self.sent.extend(
            Sent(m, ack.stream, ack.seq) for (m, _), ack in zip(pending, acks, strict=True)
        )

    async def _refused(self, message: Hostile) -> None:
        """The product's publisher refuses a message over the payload limit, and stays
        connected (nats-server would close a connection that sends one), and an event over
        what the event log stores (the server would refuse it too)."""
        with pytest.raises(MessageTooLarge):
            await self.running.bus.publish_raw(message.subject, message.data)
        self.refused.append(message)

    async def publish_deferred(self) -> None:
        """Publish the `old-command` messages drawn before any command was issued."""

        async def commands_issued() -> bool:
            await self._refresh_issued()
            return bool(self.issued)

        if self.deferred:
            await self.running.wait_until("a driver command issued", commands_issued, 60)
        deferred, self.deferred = self.deferred, []
        await self.publish(deferred)

    def from_thread(self, loop: asyncio.AbstractEventLoop) -> Callable[[list[Hostile]], None]:
        """`publish` for a thread other than the loop's."""

        def publish(batch: list[Hostile]) -> None:
            asyncio.run_coroutine_threadsafe(self.publish(batch), loop).result(timeout=60)

        return publish


def publish_hostile(traffic: Traffic, publish: Callable[[list[Hostile]], None]) -> int:
    """The hypothesis suite: `EXAMPLES` batches of hostile messages, each published as it is
    drawn; returns how many batches ran. Derandomized: every run publishes the same
    messages (and `old-command` ones pick among the commands issued by then)."""
    examples = 0

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(batch=traffic.batch())
    def publish_batch(batch: list[Hostile]) -> None:
        nonlocal examples
        examples += 1
        publish(batch)

    publish_batch()
    return examples


async def durable_consumers(running: Stack) -> list[ConsumerInfo]:
    """Every durable consumer the services created, on the events and commands streams."""
    found = []
    for layout in streams.layouts(running.bus.prefix)[:2]:
        for info in await running.bus.js.consumers_info(layout.name):
            if info.config.durable_name and info.config.ack_policy == AckPolicy.EXPLICIT:
                found.append(info)
    return found


def expected_durables(nodes: list[str]) -> set[str]:
    names = {"upgrade-orchestrator", "discovery-labeler"}
    for node in nodes:
        names.add(f"driver-manager-{subjects.encode_node(node)}")
        names.add(streams.node_durable("discovery", node, "commands"))
        names.add(streams.node_durable("discovery", node, "driver-events"))
    return names


def filters_of(info: ConsumerInfo) -> list[str]:
    config = info.config
    return list(
        config.filter_subjects or ([config.filter_subject] if config.filter_subject else [])
    )


def verdict(subject: str, data: bytes) -> str:
    """What the bus's rules (gpuop.bus.dispatching) make of `data` on `subject`: malformed
    (not a valid envelope, or about another node than the subject's), newer (a type this
    version does not know, whatever its node), or valid."""
    try:
        envelope, _ = decode(data)
    except MalformedMessage:
        return MALFORMED
    except UnknownEventType:
        return NEWER
    token = subjects.node_key(subject)
    try:
        if token != subject and subjects.encode_node(envelope.subject) != token:
            return MALFORMED
    except subjects.InvalidSubject:
        return MALFORMED
    return VALID


def promised(consumer: str, message: Hostile, seen: str, nodes: list[str]) -> str:
    """The outcome the rules promise `consumer` gives `message`, which the bus sees as
    `seen`: dead-lettered (and why), or acked (as an unknown type, or handled)."""
    if seen == MALFORMED:
        return "dead-lettered:malformed"
    if seen == NEWER:
        return "acked:unknown-type"
    envelope, payload = decode(message.data)
    if role(consumer) == "labeler" and isinstance(payload, hw.HardwareDiscovered):
        assert envelope.node not in nodes, message  # only ghosts get valid inventories
        return "dead-lettered:max_deliver"  # the Node never registers
    return "acked:handled"


def role(consumer: str) -> str:
    """The consumer's role, whatever its node: `driver-manager-gpu-node-1` -> `driver-manager`."""
    if consumer == "upgrade-orchestrator":
        return "orchestrator"
    if consumer == "discovery-labeler":
        return "labeler"
    if consumer.startswith("driver-manager-"):
        return "driver-manager"
    return "discovery-" + ("commands" if consumer.endswith("-commands") else "driver-events")


def owner(running: Stack, consumer: str) -> str:
    """The process that runs `consumer`."""
    if consumer == "upgrade-orchestrator":
        return running.leader() or next(iter(running.replicas))
    if consumer == "discovery-labeler":
        return "discovery-cluster"
    for node in running.node_names:
        token = subjects.encode_node(node)
        if consumer == f"driver-manager-{token}":
            return f"driver-manager-{node}"
        if consumer.startswith(f"discovery-{token}-"):
            return f"discovery-{node}"
    raise AssertionError(f"no process runs consumer {consumer}")


async def scrape(running: Stack) -> dict[str, dict[tuple[str, ...], float]]:
    """Every service's /metrics, summed over the processes: family -> labels -> value."""
    totals: dict[str, dict[tuple[str, ...], float]] = collections.defaultdict(
        lambda: collections.defaultdict(float)
    )
    async with aiohttp.ClientSession() as session:
        for log in running.logs:
            found = HEALTH.search(log.read_text(errors="replace"))
            assert found, f"{log.name} never said where its /metrics are"
            url = f"http://{found[1]}:{found[2]}/metrics"
            async with session.get(url) as response:
                text = await response.text()
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    labels = tuple(sorted(sample.labels.items()))
                    totals[sample.name][tuple(f"{k}={v}" for k, v in labels)] += sample.value
    return totals


def total(metrics: dict[str, dict[tuple[str, ...], float]], name: str, **labels: str) -> float:
    wanted = {f"{k}={v}" for k, v in labels.items()}
    return sum(v for key, v in metrics.get(name, {}).items() if wanted <= set(key))


async def settled(running: Stack, sent: list[Sent]) -> None:
    """Wait until every durable consumer has nothing pending and nothing unacknowledged;
    when one does not, say which of `sent` it holds, and where its process waits."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while True:
        unsettled = [
            info
            for info in await durable_consumers(running)
            if info.num_pending or info.num_ack_pending
        ]
        if not unsettled:
            return
        if time.monotonic() > deadline:
            owners = {owner(running, info.name) for info in unsettled}
            for name in owners:  # each logs where its tasks wait
                process = running.agents.get(name) or running.replicas[name]
                process.send_signal(signal.SIGUSR1)
            await asyncio.sleep(1.0)
            tails = "\n".join(running.tail_of(name, 30000) for name in sorted(owners))
            held = [
                (info.name, item.message.category, item.seq, item.message.data[:300])
                for info in unsettled
                for item in sent
                if item.seq > info.ack_floor.stream_seq
                and any(streams.subject_matches(f, item.message.subject) for f in filters_of(info))
            ]
            raise AssertionError(f"consumers not settled: {unsettled}\n{held[:20]}\n{tails}")
        await asyncio.sleep(0.25)


@pytest.mark.timeout(300)
async def test_a_rollout_completes_while_ten_thousand_hostile_messages_are_settled_by_the_rules(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    began = time.monotonic()
    async with stack(
        tmp_path, nats_server.url, nodes_count=NODES, gpus=GPUS, seed=4, labeler_retry=LABELER_RETRY
    ) as running:
        nodes = running.node_names
        await running.start_replica()
        await running.start_replica()
        # paused: the leader consumes (and builds the sagas) but admits no node yet
        await running.start_rollout({**upgrade_policy(), "paused": True})

        async def consumers_up() -> bool:
            names = {info.name for info in await durable_consumers(running)}
            return expected_durables(nodes) <= names

        await running.wait_until("every service consuming", consumers_up, 90)
        consumers = await durable_consumers(running)
        filters = [f for info in consumers for f in filters_of(info)]
        async with Publisher.connect(running) as publisher:
            traffic = Traffic(nodes, filters, running.bus.max_payload)
            began_publishing = time.monotonic()
            publishing = asyncio.ensure_future(
                asyncio.to_thread(
                    publish_hostile, traffic, publisher.from_thread(asyncio.get_running_loop())
                )
            )

            async def published(count: int) -> None:
                while publisher.attempted < count:
                    if publishing.done():
                        publishing.result()
                        raise AssertionError(f"only {publisher.attempted} messages published")
                    await asyncio.sleep(0.05)

            await published(RESUME_AT)
            await customobjects.patch(
                running.kube, POLICIES, "default", {"spec": {"upgradePolicy": {"paused": False}}}
            )

            async def published_by_the_end_of_the_rollout() -> int:
                while not await every_node_done(running):
                    await asyncio.sleep(0.25)
                return publisher.attempted

            rolled = asyncio.ensure_future(published_by_the_end_of_the_rollout())
            examples = await publishing
            await publisher.publish_deferred()
            published_in = time.monotonic() - began_publishing
            assert examples == EXAMPLES and publisher.attempted == MESSAGES

            await running.wait_until(
                "every node upgrade-done", lambda: every_node_done(running), ROLLOUT_TIMEOUT
            )
            during_the_rollout = await rolled - RESUME_AT

            await settled(running, publisher.sent)
            consumers = await durable_consumers(running)
            letters = [m async for m in running.bus.read(f"{running.bus.prefix}.dlq.>")]
            stored = {
                (m.stream, m.seq)
                async for m in running.bus.read(subjects.stream_filter(subjects.Kind.COMMAND))
            }
            commands = await running.bus.js.stream_info(streams.layouts(running.bus.prefix)[1].name)
            metrics = await scrape(running)
            alive = {
                name: process.returncode
                for name, process in {**running.replicas, **running.agents}.items()
            }
            lines = await running.export()
        sent, refused = publisher.sent, publisher.refused

    assert all(code is None for code in alive.values()), alive
    assert during_the_rollout >= RESUME_AT, during_the_rollout  # the nodes rolled under fire
    assert running.unclean_exits() == {}

    # the rollout completed, and the log of what the services published keeps every
    # invariant (the hostile messages are left out: valid ones could look like driver
    # results, and the replay refuses the malformed ones)
    ours = {(sent_.stream, sent_.seq) for sent_ in sent}
    theirs = [line for line in lines if _stored_at(line) not in ours]
    log = log_of(theirs, tmp_path / "rollout.jsonl")
    walk = invariants.check(log, PARALLEL)
    assert not walk.violations, "\n".join(walk.violations)
    assert set(walk.paths) == set(nodes)
    for node in nodes:
        assert invariants.states(walk, node)[-1] is UpgradeState.UPGRADE_DONE

    # every consumer is done with everything it was given: nothing pending, nothing held
    for info in consumers:
        assert info.num_pending == 0 and info.num_ack_pending == 0, info
        assert info.ack_floor.stream_seq == info.delivered.stream_seq, info

    # every dead letter is one of ours, with its reason
    dead: dict[tuple[str, str, int], dict[str, str]] = {}
    for letter in letters:
        headers = letter.headers
        original = headers[streams.DLQ_SUBJECT].split(".")[1]
        key = (headers[streams.DLQ_CONSUMER], original, int(headers[streams.DLQ_SEQ]))
        assert key not in dead, f"dead-lettered twice: {key}"
        assert headers[streams.DLQ_REASON].strip(" -"), letter
        dead[key] = headers

    # every hostile message settled by the rules, consumer by consumer
    outcomes: collections.Counter[str] = collections.Counter()
    categories: collections.Counter[str] = collections.Counter()
    readers_of = [(info.name, filters_of(info)) for info in consumers]
    accounted: set[tuple[str, str, int]] = set()
    node_tokens = {subjects.encode_node(node) for node in nodes}
    for item in sent:
        message = item.message
        categories[message.category] += 1
        seen = verdict(message.subject, message.data)
        allowed = VERDICTS.get(message.category)
        assert allowed is None or seen in allowed, (message.category, seen, message.data[:300])
        kind = message.subject.split(".")[1]
        readers = [
            name
            for name, patterns in readers_of
            if any(streams.subject_matches(p, message.subject) for p in patterns)
        ]
        if not readers:
            # no agent runs for the node: the command waits in its stream, unread, until
            # the stream's limits drop it (asserted below)
            assert kind == subjects.Kind.COMMAND, message.subject
            assert message.subject.split(".")[3] not in node_tokens, message.subject
            assert (item.stream, item.seq) in stored, message.subject
            outcomes["unread:stored"] += 1
            continue
        for consumer in readers:
            key = (consumer, kind, item.seq)
            want = promised(consumer, message, seen, nodes)
            if want.startswith("dead-lettered:"):
                assert key in dead, (want, consumer, message.category, message.subject)
                assert dead[key][streams.DLQ_KIND] == want.split(":")[1], (dead[key], want)
                # only an original at the payload limit is cut, to fit beside the headers
                cut = streams.DLQ_TRUNCATED in dead[key]
                assert cut == (message.category == "near-limit"), (dead[key], message.category)
                accounted.add(key)
            else:
                assert key not in dead, (want, consumer, message.category, dead[key])
            outcomes[f"{role(consumer)} {want}"] += 1
    assert accounted == set(dead), f"dead letters of no hostile message: {set(dead) - accounted}"
    assert commands.config.retention == RetentionPolicy.LIMITS, commands.config
    assert commands.config.max_age == streams.DEFAULT_EVENTS_MAX_AGE, commands.config

    # the services' own counters say the same
    by_kind = collections.Counter(headers[streams.DLQ_KIND] for headers in dead.values())
    for kind in ("malformed", "permanent", "max_deliver"):
        counted = total(metrics, "gpuop_bus_dead_lettered_total", reason=kind)
        assert counted == by_kind[kind], (kind, counted, by_kind)
    newer = sum(n for name, n in outcomes.items() if name.endswith("acked:unknown-type"))
    assert total(metrics, "gpuop_bus_consumed_total", outcome="unknown_type") == newer
    assert total(metrics, "gpuop_bus_unknown_types_total") == newer
    answered = total(metrics, "gpuop_driver_commands_total", outcome="replayed")
    answered += total(metrics, "gpuop_driver_commands_total", outcome="dropped")
    agent_valid = sum(n for name, n in outcomes.items() if name == "driver-manager acked:handled")
    assert answered == agent_valid, (answered, agent_valid)

    # a hostile message makes no huge log line
    for path in running.logs:
        longest = max(
            (len(line) for line in path.read_text(errors="replace").splitlines()), default=0
        )
        assert longest <= LONGEST_LOG_LINE, (path.name, longest)

    assert refused and all(m.category == "over-limit" or over_the_log(m) for m in refused)
    came_up = {*categories, *(m.category for m in refused)}
    assert came_up == {*QUOTAS, *RARE}, categories  # each one came up
    report = [
        f"{len(sent)} stored, {len(refused)} refused (over the payload limit, or events over "
        f"what the log stores), "
        f"published in {published_in:.1f} s ({during_the_rollout} while nodes rolled), "
        f"whole test {time.monotonic() - began:.1f} s",
        f"categories: {dict(sorted(categories.items()))}",
        *(f"  {name}: {n}" for name, n in sorted(outcomes.items())),
    ]
    print("\n".join(report))


def over_the_log(message: Hostile) -> bool:
    """An event larger than the event log stores (`streams.EVENT_BYTES`)."""
    kind = message.subject.split(".")[1]
    return kind == subjects.Kind.EVENT and len(message.data) > streams.EVENT_BYTES


def _stored_at(line: str) -> tuple[str, int]:
    entry = json.loads(line)
    return entry["stream"], entry["seq"]
