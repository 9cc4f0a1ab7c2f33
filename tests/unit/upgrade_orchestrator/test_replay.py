"""`gpuop events export` and `gpuop replay`: a log recorded from the orchestrator's runtime
replays identically (skip labels included: what admission made of them is in the log); a
changed policy diverges (exit 1); a malformed file exits 2."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml

from gpuop.bus import InMemoryBus
from gpuop.cli.events import export_lines, render
from gpuop.cli.main import main
from gpuop.events import driver as dm
from gpuop.events import new_event
from gpuop.events import upgrade as up
from gpuop.events.driver import Component
from gpuop.events.hardware import HardwareHeartbeat
from gpuop.policy import Drain
from gpuop.saga import NodeStatus, replaying
from tests.support.recording import NODES, record_rollout
from tests.support.sagas import policy


@pytest.fixture
async def recorded(tmp_path: Path) -> Path:
    path = tmp_path / "log.jsonl"
    lines = await record_rollout(policy(drain=Drain(enable=True)))
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_the_export_holds_events_and_commands_in_time_order(recorded: Path) -> None:
    lines = [json.loads(line) for line in recorded.read_text().splitlines()]
    assert {line["stream"] for line in lines} == {"GPUOP_EVENTS", "GPUOP_COMMANDS"}
    assert [line["time"] for line in lines] == sorted(line["time"] for line in lines)
    assert all(set(line) == {"stream", "seq", "subject", "time", "message"} for line in lines)
    assert all(line["message"]["specversion"] == "1.0" for line in lines)


def test_replay_reproduces_every_command_and_transition(recorded: Path) -> None:
    log = replaying.parse_log(recorded.read_text().splitlines())
    replayed = replaying.replay(log)
    expected = replaying.recorded_outputs(log)
    comparison = replaying.compare(expected, replayed.outputs)
    assert comparison.identical, comparison.report()
    assert replayed.nodes == set(NODES)
    assert comparison.commands > 0 and comparison.transitions >= 9 * len(NODES)
    for node in NODES:  # the same outputs per kind, whatever the interleaving of the streams
        assert sorted(replayed.outputs[node], key=repr) == sorted(expected[node], key=repr)


def test_the_cli_prints_one_summary_line_when_identical(
    recorded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", str(recorded)]) == 0
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith("replayed ") and f"for {len(NODES)} nodes: " in line
    assert line.endswith(" transitions identical")


@pytest.mark.parametrize(
    "changed",
    [
        {"driver": {"gpu": {"version": "590.9", "source": "/srv/drivers"}}},
        {
            "driver": {"gpu": {"version": "580.2", "source": "/srv/drivers"}},
            "upgradePolicy": {"drain": {"enable": False}},
        },
    ],
    ids=["other-version", "drain-disabled"],
)
def test_a_changed_policy_is_reported_as_a_divergence(
    recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], changed: dict[str, object]
) -> None:
    spec = tmp_path / "policy.yaml"
    spec.write_text(yaml.safe_dump({"apiVersion": "gpuop.io/v1alpha1", "spec": changed}))
    assert main(["replay", str(recorded), "--policy", str(spec)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("replay diverged on ")
    assert "  expected: " in out and "  got:      " in out
    assert all(f"node {node}:" in out for node in NODES)


def test_the_recorded_policy_replays_identically_when_passed_explicitly(
    recorded: Path, tmp_path: Path
) -> None:
    spec = tmp_path / "policy.json"
    spec.write_text(json.dumps(policy(drain=Drain(enable=True)).to_wire()))
    assert main(["replay", str(recorded), "--policy", str(spec)]) == 0


async def test_a_policy_changed_mid_rollout_is_replayed_where_it_took_effect() -> None:
    first, then = policy(drain=Drain(enable=True)), policy(drain=Drain(enable=False))
    log = replaying.parse_log(await record_rollout(first, switch_to=then))
    applied = [r.envelope for r in log if isinstance(r.payload, up.PolicyApplied)]
    assert len(applied) == 2 and applied[0].causationid is None
    assert applied[1].causationid is not None  # recorded just before deciding that event
    expected = replaying.recorded_outputs(log)
    assert replaying.compare(expected, replaying.replay(log).outputs).identical
    assert not replaying.compare(expected, replaying.replay(log, first).outputs).identical


def test_without_a_recorded_policy_replay_asks_for_one(recorded: Path) -> None:
    log = replaying.parse_log(recorded.read_text().splitlines())
    unrecorded = [r for r in log if not isinstance(r.payload, up.PolicyApplied)]
    with pytest.raises(replaying.ReplayInputError, match=r"no policy recorded.*--policy"):
        replaying.replay(unrecorded)


def test_a_malformed_line_exits_2_naming_it(
    recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = recorded.read_text().splitlines()
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join([lines[0], "{not json", *lines[1:]]) + "\n")
    assert main(["replay", str(broken)]) == 2
    assert "line 2: not JSON" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('{"stream": "OTHER", "seq": 1, "subject": "x", "message": {}}', "unknown stream"),
        ('{"stream": "GPUOP_EVENTS", "seq": "1", "subject": "x", "message": {}}', "integer seq"),
        ('{"stream": "GPUOP_EVENTS", "seq": 1, "subject": "x", "message": {}}', "invalid envelope"),
        ("[1, 2]", "not a JSON object"),
    ],
)
def test_bad_lines_are_refused(line: str, says: str) -> None:
    with pytest.raises(replaying.ReplayInputError, match=f"line 1: .*{says}"):
        replaying.parse_log([line])


def test_a_line_nested_too_deep_to_parse_is_refused_not_a_crash() -> None:
    with pytest.raises(replaying.ReplayInputError, match="line 1: not JSON"):
        replaying.parse_log(["[" * 100_000])


def test_a_missing_file_or_policy_exits_2(
    recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", str(tmp_path / "absent.jsonl")]) == 2
    invalid = tmp_path / "invalid.yaml"
    invalid.write_text("driver: {gpu: {}}\n")
    assert main(["replay", str(recorded), "--policy", str(invalid)]) == 2
    assert "invalid.yaml" in capsys.readouterr().err


async def test_the_export_leaves_out_a_message_nested_too_deep_to_parse(
    bus: InMemoryBus, capsys: pytest.CaptureFixture[str]
) -> None:
    await bus.publish_raw("gpuop.evt.driver.n1.loaded", b"[" * 5000)
    beat = HardwareHeartbeat(
        boot_id=str(uuid.uuid4()), inventory_hash="a" * 64, uptime_seconds=1, gpu_count=1
    )
    await bus.publish(new_event(beat, node="n1", source="/test"))
    lines = await export_lines(bus)
    assert [json.loads(line)["seq"] for line in lines] == [2]
    assert "#1 is not JSON" in capsys.readouterr().err
    (stored,) = [m async for m in bus.read("gpuop.evt.driver.>")]
    assert json.loads(render(stored))["error"] == "not JSON"


async def test_skip_labels_leave_nodes_out_narrow_windows_and_replay_identically() -> None:
    gpu, ofed = Component.GPU, Component.OFED
    statuses = {
        "gpu-node-1": NodeStatus(skip=frozenset({gpu, ofed})),  # left alone entirely
        "gpu-node-2": NodeStatus(skip=frozenset({ofed})),  # upgrades the GPU driver only
    }
    log = replaying.parse_log(await record_rollout(policy(ofed=True), statuses=statuses))

    admitted = {r.envelope.node: r.payload for r in log if isinstance(r.payload, up.NodeAdmitted)}
    assert sorted(admitted) == ["gpu-node-2", "gpu-node-3"]
    assert admitted["gpu-node-2"].components == (gpu,)
    assert admitted["gpu-node-3"].components == ()  # the whole saga
    changes = [r for r in log if isinstance(r.payload, up.NodeUpgradeStateChanged)]
    assert {r.envelope.node for r in changes} == {"gpu-node-2", "gpu-node-3"}
    assert {r.payload.components for r in changes if r.envelope.node == "gpu-node-2"} == {(gpu,)}
    installs = {
        (r.envelope.node, r.payload.component)
        for r in log
        if isinstance(r.payload, dm.InstallDriver)
    }
    assert installs == {("gpu-node-2", gpu), ("gpu-node-3", gpu), ("gpu-node-3", ofed)}
    commands = [r for r in log if r.stream == replaying.COMMANDS_STREAM]
    assert not [r for r in commands if r.envelope.node == "gpu-node-1"]

    expected = replaying.recorded_outputs(log)
    comparison = replaying.compare(expected, replaying.replay(log).outputs)
    assert comparison.identical, comparison.report()
    assert "gpu-node-1" not in expected


async def test_replay_installs_the_recorded_flavour_without_the_inventory() -> None:
    # the runtime's sagas were built with the flavour resolved from the nodes' inventories;
    # the log carries it in SagaStarted and holds no inventory to resolve it from again
    log = replaying.parse_log(await record_rollout(policy(), flavour=dm.Flavour.OPEN))
    installs = [r.payload for r in log if isinstance(r.payload, dm.InstallDriver)]
    assert installs and {i.flavour for i in installs} == {dm.Flavour.OPEN}

    expected = replaying.recorded_outputs(log)
    comparison = replaying.compare(expected, replaying.replay(log).outputs)
    assert comparison.identical, comparison.report()

    # a start record without the flavour would replay installs of any flavour: a divergence
    lines = await record_rollout(policy(), flavour=dm.Flavour.OPEN)
    forgotten = [
        line.replace(',"flavour":"open"', "") if "saga-started" in line else line for line in lines
    ]
    assert forgotten != lines
    unflavoured = replaying.parse_log(forgotten)
    assert not replaying.compare(
        replaying.recorded_outputs(unflavoured), replaying.replay(unflavoured).outputs
    ).identical


async def test_a_rollout_through_the_preflight_rung_replays_identically() -> None:
    dcgm = {"image": "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04",
            "command": ["dcgmi", "diag", "-r", "1"]}  # fmt: skip
    spec = policy(validation={"rungs": ["nvml", "pod", "preflight"], "preflight": dcgm})
    lines = await record_rollout(spec)
    log = replaying.parse_log(lines)
    replayed = replaying.replay(log)
    comparison = replaying.compare(replaying.recorded_outputs(log), replayed.outputs)
    assert comparison.identical, comparison.report()
    succeeded = [line for line in lines if "validation-pod-succeeded" in line]
    assert len(succeeded) == 2 * len(NODES), "the pod and the diagnostic on every node"
