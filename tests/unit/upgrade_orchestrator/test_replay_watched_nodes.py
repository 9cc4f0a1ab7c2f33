"""`gpuop replay` decides health events as the live remediation starter does: it puts to the
circuit breaker only events about GPU nodes the node watch knew (`NodeObserved` in the log,
not `NodeRemoved` since; before the log records any observation, any node), so a valid
health event about a node nobody watches needs no refusal, while a watched node's missing
refusal is still reported; and it counts every event it folds, remediation events too."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gpuop.cli.replay import replay_log
from gpuop.events import kube, new_event, subjects
from gpuop.events.device import DeviceHealthChanged
from gpuop.events.remediation import NodeRemediationStateChanged, RemediationRefused
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import replaying
from tests.support.remediations import Remediating, remediating
from tests.support.sagas import policy

NODES = ("gpu-node-1", "gpu-node-2")
GHOST = "ghost-node"


def tripping() -> GPUClusterPolicySpec:
    spec = policy(max_unavailable=2)
    return spec.model_copy(
        update={"remediation": spec.remediation.model_copy(update={"max_per_hour": 1})}
    )


async def tripped(harness: Remediating) -> list[str]:
    for node in NODES:
        await harness.fault(node)
    await harness.settle(until_ended=NODES[:1])
    return await harness.export()


def message(line: str) -> dict[str, object]:
    found = json.loads(line)["message"]
    assert isinstance(found, dict)
    return found


def is_type(line: str, type_: str) -> bool:
    return message(line)["type"] == type_


def observed(node: str, when: str) -> str:
    """A `NodeObserved` line as the node watch records a GPU node it lists."""
    event = kube.NodeObserved(ready=True, unschedulable=False)
    envelope = new_event(event, node=node, source="/gpuop/upgrade-orchestrator", now=None)
    data = envelope.model_dump(mode="json", by_alias=True, exclude_none=True)
    data["time"] = when
    subject = subjects.event_subject("kube", node, kube.NodeObserved.NAME)
    return json.dumps(
        {"stream": replaying.EVENTS_STREAM, "seq": 0, "subject": subject, "time": when,
         "message": data}
    )  # fmt: skip


def ghost_of(line: str) -> str:
    """The health event `line` about a node that does not exist, under a new id."""
    found = json.loads(line)
    found["message"]["id"] = "ghost-" + str(found["message"]["id"])
    found["message"]["subject"] = GHOST
    found["subject"] = found["subject"].replace(
        subjects.encode_node("gpu-node-2"), subjects.encode_node(GHOST)
    )
    return json.dumps(found)


def renumbered(lines: list[str]) -> list[str]:
    """The events stream's lines with sequence numbers in list order."""
    out = []
    for seq, line in enumerate(lines, start=1):
        found = json.loads(line)
        if found["stream"] == replaying.EVENTS_STREAM:
            found["seq"] = seq
        out.append(json.dumps(found))
    return out


def with_ghost(lines: list[str], *, watch: bool) -> list[str]:
    """`lines` in stream order, the watch's observations of both nodes first (when `watch`),
    and a health event about a ghost node after the refusal, while the breaker is full."""
    ordered = [json.loads(line) for line in lines]
    ordered.sort(key=lambda line: (line["stream"], line["seq"]))
    events = [json.dumps(line) for line in ordered if line["stream"] == replaying.EVENTS_STREAM]
    commands = [json.dumps(line) for line in ordered if line["stream"] != replaying.EVENTS_STREAM]
    health = next(
        line for line in events
        if is_type(line, DeviceHealthChanged.TYPE) and '"gpu-node-2"' in line
    )  # fmt: skip
    refusal = next(i for i, line in enumerate(events) if is_type(line, RemediationRefused.TYPE))
    events.insert(refusal + 1, ghost_of(health))
    if watch:
        first = str(message(events[0])["time"])
        events = [observed(node, first) for node in NODES] + events
    return renumbered(events) + commands


async def cli(lines: list[str], tmp_path: Path) -> int:
    path = tmp_path / "log.jsonl"
    path.write_text("\n".join(lines))
    return await replay_log(argparse.Namespace(file=str(path), policy=None), {})


async def test_a_health_event_about_an_unwatched_node_needs_no_refusal(tmp_path: Path) -> None:
    async with remediating(tripping(), NODES) as harness:
        lines = with_ghost(await tripped(harness), watch=True)
    replayed = replaying.replay(replaying.parse_log(lines))
    assert replayed.unrecorded == [] and not replayed.breaker_differs
    assert await cli(lines, tmp_path) == 0


async def test_a_watched_nodes_missing_refusal_is_still_reported(tmp_path: Path) -> None:
    async with remediating(tripping(), NODES) as harness:
        lines = with_ghost(await tripped(harness), watch=True)
    tampered = [line for line in lines if not is_type(line, RemediationRefused.TYPE)]
    replayed = replaying.replay(replaying.parse_log(tampered))
    [missing] = replayed.unrecorded
    assert "gpu-node-2" in missing and GHOST not in missing
    assert await cli(tampered, tmp_path) == 1


async def test_before_the_watch_listed_any_node_every_node_counts(tmp_path: Path) -> None:
    """As the starter before the node watch's first listing: the ghost was put to the
    breaker, which refuses it, so a log without its refusal is reported."""
    async with remediating(tripping(), NODES) as harness:
        lines = with_ghost(await tripped(harness), watch=False)
    [missing] = replaying.replay(replaying.parse_log(lines)).unrecorded
    assert GHOST in missing
    assert await cli(lines, tmp_path) == 1


async def test_a_removed_node_is_no_longer_watched(tmp_path: Path) -> None:
    async with remediating(tripping(), NODES) as harness:
        lines = with_ghost(await tripped(harness), watch=True)
    tampered = [line for line in lines if not is_type(line, RemediationRefused.TYPE)]
    health = next(
        i for i, line in enumerate(tampered)
        if is_type(line, DeviceHealthChanged.TYPE) and '"gpu-node-2"' in line
    )  # fmt: skip
    removed = json.loads(observed("gpu-node-2", str(message(tampered[health])["time"])))
    removed["message"]["type"] = kube.NodeRemoved.TYPE
    removed["subject"] = removed["subject"].rsplit(".", 1)[0] + "." + kube.NodeRemoved.NAME
    removed["message"]["data"] = {}
    removed["message"]["id"] = "removed-gpu-node-2"
    tampered.insert(health, json.dumps(removed))
    assert replaying.replay(replaying.parse_log(renumbered(tampered))).unrecorded == []


async def test_a_log_of_remediations_only_counts_its_events(tmp_path: Path, capsys: object) -> None:
    async with remediating(tripping(), NODES) as harness:
        lines = await tripped(harness)
    log = replaying.parse_log(lines)
    replayed = replaying.replay(log)
    transitions = sum(isinstance(r.payload, NodeRemediationStateChanged) for r in log)
    assert replayed.events >= transitions > 0
    assert await cli(lines, tmp_path) == 0
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert out.startswith(f"replayed {replayed.events} events for 2 nodes")
