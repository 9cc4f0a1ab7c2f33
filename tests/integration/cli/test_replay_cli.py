"""`gpuop events export` and `gpuop replay` as a person runs them: a recorded rollout loaded
into a real nats-server, exported by one process and replayed by another."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from gpuop.bus import NatsBus, NatsServer
from gpuop.saga import replaying
from tests.support.processes import gpuop
from tests.support.recording import NODES, record_rollout
from tests.support.sagas import policy


async def test_export_then_replay_exits_0_1_or_2(nats_server: NatsServer, tmp_path: Path) -> None:
    recorded = replaying.parse_log(await record_rollout(policy()))
    bus = NatsBus(nats_server.url, name="loader")
    await bus.start()
    try:
        for entry in recorded:  # stream order: the sequence of each stream is kept
            await bus.publish(entry.envelope)
    finally:
        await bus.close()

    exported = tmp_path / "log.jsonl"
    nats = ["--nats", nats_server.url]
    code, _, err = await gpuop("events", "export", "--out", str(exported), *nats)
    assert code == 0, err
    assert f"exported {len(recorded)} messages" in err
    assert len(exported.read_text().splitlines()) == len(recorded)

    code, out, err = await gpuop("replay", str(exported))
    assert code == 0, out + err
    assert out.startswith("replayed ") and f" for {len(NODES)} nodes: " in out
    assert len(out.splitlines()) == 1

    changed = tmp_path / "policy.yaml"
    changed.write_text(yaml.safe_dump({"driver": {"gpu": {"version": "590.9"}}}))
    code, out, _ = await gpuop("replay", str(exported), "--policy", str(changed))
    assert code == 1
    assert "expected: " in out and "got: " in out

    broken = tmp_path / "broken.jsonl"
    broken.write_text(exported.read_text() + json.dumps({"stream": "GPUOP_EVENTS"}) + "\n")
    code, _, err = await gpuop("replay", str(broken))
    assert code == 2
    assert f"line {len(recorded) + 1}:" in err
