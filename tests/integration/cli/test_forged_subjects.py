"""Attack: a node's credential publishes, on its own subjects, messages of another type or
about another node, for the readers outside the dispatcher to believe.

gpu-2's credential may publish on `gpuop.evt.<domain>.gpu-2.*` only, but the envelope it
sends names any type and node. Telemetry's cluster exporter must not raise gpu-1's unhealthy
gauge from gpu-2's subject; `gpuop events export` keeps the message (the audit trail) and
says it is forged; `gpuop replay` refuses a log holding a `PolicyApplied` on a node's
subject, exits 1 and names the line. Each attempt's outcome is printed.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gpuop.bus import InMemoryBus
from gpuop.cli import events as events_cli
from gpuop.cli.main import main
from gpuop.events import Envelope, device, new_event, subjects
from gpuop.events.upgrade import PolicyApplied
from gpuop.saga import replaying
from gpuop.services.telemetry.cluster_exporter import ClusterExporter
from gpuop.services.telemetry.config import TelemetryConfig
from tests.support.recording import record_rollout
from tests.support.sagas import policy
from tests.support.waiting import eventually

pytestmark = pytest.mark.security

UUID = "GPU-20bce083-dbf9-2d4f-3c35-c858915accc5"
T0 = datetime(2026, 11, 29, 20, 0, tzinfo=UTC)
SICK = device.DeviceHealthChanged(
    gpu_uuid=UUID, healthy=False, reason=device.HealthReason.XID, xid=79
)


def sick(node: str) -> Envelope:
    return new_event(SICK, node=node, source=f"/gpuop/telemetry/{node}", now=T0)


def on_gpu2(domain: str, name: str) -> str:
    return subjects.event_subject(domain, "gpu-2", name)


async def test_the_cluster_exporter_believes_no_message_off_its_subject(
    bus: InMemoryBus,
) -> None:
    registry = CollectorRegistry()
    ready: list[bool] = []
    exporter = ClusterExporter(
        bus, registry, TelemetryConfig(), readiness=lambda up, _: ready.append(up)
    )
    forged = on_gpu2(device.DeviceHealthChanged.DOMAIN, "health-changed")
    # gpu-2 says gpu-1 is sick, on gpu-2's own subject; then its own GPU falls sick
    await bus.publish_raw(forged, sick("gpu-1").to_bytes())
    await bus.publish(sick("gpu-2"))
    stopping = asyncio.Event()
    task = asyncio.create_task(exporter.run(stopping))
    try:
        await eventually(lambda: bool(ready))  # the history is in the gauges
        unhealthy = registry.get_sample_value("gpuop_gpus_unhealthy")
    finally:
        stopping.set()
        await task
    print(f"\ngpu-2 publishes gpu-1's DeviceHealthChanged on {forged}:")
    print(f"  cluster exporter: gpuop_gpus_unhealthy = {unhealthy} (gpu-2's own GPU only)")
    assert unhealthy == 1


async def test_export_flags_and_replay_refuses_a_forged_policy(
    bus: InMemoryBus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    genuine = await record_rollout(policy())
    applied = next(
        json.loads(line)
        for line in genuine
        if json.loads(line)["message"]["type"] == PolicyApplied.TYPE
    )
    forged_subject = on_gpu2("hardware", "discovered")
    message = Envelope.model_validate(applied["message"]).model_copy(update={"id": "forged-1"})
    await bus.publish_raw(forged_subject, message.to_bytes())

    lines = await events_cli.export_lines(bus)
    said = capsys.readouterr().err
    report = [
        f"\ngpu-2 publishes a PolicyApplied on {forged_subject}:",
        f"  gpuop events export: {len(lines)} line kept; stderr: {said.strip()}",
    ]
    assert len(lines) == 1 and "is forged or corrupt" in said and forged_subject in said

    log = tmp_path / "log.jsonl"
    forged_line = json.loads(lines[0])
    forged_line["seq"] = 10_000
    log.write_text("".join(line + "\n" for line in [*genuine, json.dumps(forged_line)]))
    code = await asyncio.to_thread(main, ["replay", str(log)])
    out = capsys.readouterr().out
    report.append(f"  gpuop replay: exit {code}; {out.strip()}")
    print("\n".join(report))
    assert code == 1
    assert "forged or corrupt" in out and f"line {len(genuine) + 1} " in out
    with pytest.raises(replaying.MisplacedMessages):
        replaying.parse_log(log.read_text().splitlines())
