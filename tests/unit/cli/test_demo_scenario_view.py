"""`gpuop demo --scenario remediation|mig`'s view: the tracker keeps each target's
remediation or MIG reconfiguration (kind, states, times, GPUs), the holders the device
plugin named and the GPUs telemetry holds unhealthy; following ends once every target's
saga ended, not before a target is chosen; the live screen shows each row's saga kind and
the targets' progress."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import cast

from gpuop.bus import Bus
from gpuop.bus.protocol import StoredMessage
from gpuop.events import Envelope, decode, new_event
from gpuop.events.device import DeviceHealthChanged, HealthReason, XidAction
from gpuop.events.driver import Component
from gpuop.events.fields import NamespacedName
from gpuop.events.mig import ConfigState, MigState, NodeMigStateChanged
from gpuop.events.remediation import NodeRemediationStateChanged, RemediationState
from gpuop.events.remediation_commands import GpuHoldersListed
from gpuop.events.upgrade import NodeUpgradeStateChanged, UpgradeState
from gpuop_sim.cli import rollout_view, screens
from gpuop_sim.cli.rollout_view import Tracker

R = RemediationState
NODES = ["gpu-node-1", "gpu-node-2", "gpu-node-3"]
GPU = "GPU-20bce083-dbf9-2d4f-3c35-c858915accc5"
T0 = datetime(2026, 12, 3, 17, 0, tzinfo=UTC)


def remediation(node: str, before: R | None, after: R, at: float, saga: str = "rem-1") -> Envelope:
    event = NodeRemediationStateChanged(
        saga_id=saga, from_state=before, to_state=after, reason=f"now {after}", gpu_uuids=(GPU,)
    )
    return new_event(event, node=node, source="test", now=T0 + timedelta(seconds=at))


def mig(node: str, before: MigState | None, after: MigState, at: float) -> Envelope:
    event = NodeMigStateChanged(
        saga_id="mig-1", config="all-balanced", from_state=before, to_state=after,
        config_state=ConfigState.SUCCESS if after is MigState.MIG_CONFIG_DONE
        else ConfigState.PENDING,
    )  # fmt: skip
    return new_event(event, node=node, source="test", now=T0 + timedelta(seconds=at))


def feed(tracker: Tracker, envelope: Envelope) -> str | None:
    decoded, payload = decode(envelope.to_bytes())
    return tracker.observe(decoded, payload)


def plain(lines: list[str]) -> list[str]:
    return [screens._ESCAPE.sub("", line) for line in lines]


def test_a_remediation_is_kept_with_its_states_time_gpus_and_holders() -> None:
    tracker = Tracker(NODES, kind=rollout_view.REMEDIATION, targets=["gpu-node-1"])
    health = DeviceHealthChanged(
        gpu_uuid=GPU, healthy=False, reason=HealthReason.XID, xid=48, action=XidAction.RESET_GPU
    )
    feed(tracker, new_event(health, node="gpu-node-1", source="test"))
    assert tracker.unhealthy == {"gpu-node-1": {GPU}}
    line = feed(tracker, remediation("gpu-node-1", None, R.ADMISSION_REQUIRED, 0))
    assert line is not None and "remediation: - -> remediation-admission-required" in line
    holders = GpuHoldersListed(
        command_id="c1", gpu_uuids=(GPU,), pods=(NamespacedName(namespace="ml", name="a"),)
    )
    feed(tracker, new_event(holders, node="gpu-node-1", source="test"))
    assert not tracker.finished
    feed(tracker, remediation("gpu-node-1", R.ADMISSION_REQUIRED, R.RESET_REQUIRED, 2))
    feed(tracker, remediation("gpu-node-1", R.RESET_REQUIRED, R.DONE, 7.5))
    recovered = health.model_copy(update={"healthy": True, "reason": HealthReason.RECOVERED})
    feed(tracker, new_event(recovered, node="gpu-node-1", source="test"))

    run = tracker.runs["gpu-node-1"]
    assert run.states == [R.ADMISSION_REQUIRED, R.RESET_REQUIRED, R.DONE]
    assert (run.seconds, run.gpus, run.state) == (7.5, (GPU,), R.DONE)
    assert tracker.holders == {"gpu-node-1": ("ml/a",)}
    assert tracker.unhealthy == {"gpu-node-1": set()}
    assert tracker.rows["gpu-node-1"].kind == rollout_view.REMEDIATION
    assert tracker.finished and tracker.counts() == (1, 0, 0)


def test_a_new_saga_on_the_node_starts_a_new_run() -> None:
    tracker = Tracker(NODES, kind=rollout_view.REMEDIATION, targets=["gpu-node-1"])
    feed(tracker, remediation("gpu-node-1", R.RESET_REQUIRED, R.FAILED, 1))
    assert tracker.finished and tracker.counts() == (0, 1, 0)
    feed(tracker, remediation("gpu-node-1", None, R.ADMISSION_REQUIRED, 5, saga="rem-2"))
    assert not tracker.finished and tracker.runs["gpu-node-1"].states == [R.ADMISSION_REQUIRED]


def test_no_targets_chosen_yet_never_finishes_and_an_upgrade_alone_does_not_end_it() -> None:
    tracker = Tracker(NODES[:1], kind=rollout_view.MIG, targets=[])
    upgrade = NodeUpgradeStateChanged(
        rollout_id="r", from_state=None, to_state=UpgradeState.UPGRADE_DONE,
        components=(Component.GPU,), target_versions={Component.GPU: "580.1"},
    )  # fmt: skip
    feed(tracker, new_event(upgrade, node="gpu-node-1", source="test"))
    assert tracker.outcome.finished and not tracker.finished
    tracker.targets = ["gpu-node-1"]
    assert not tracker.finished
    feed(tracker, mig("gpu-node-1", None, MigState.MIG_CONFIG_REQUIRED, 0))
    feed(tracker, mig("gpu-node-1", MigState.VERIFICATION_REQUIRED, MigState.MIG_CONFIG_DONE, 4))
    run = tracker.runs["gpu-node-1"]
    assert tracker.finished and (run.config_state, run.seconds) == ("success", 4.0)


def test_the_frame_names_each_rows_saga_and_counts_the_targets() -> None:
    tracker = Tracker(NODES, kind=rollout_view.REMEDIATION, targets=NODES[:2])
    feed(tracker, remediation("gpu-node-1", R.RELEASE_REQUIRED, R.DONE, 1))
    feed(tracker, remediation("gpu-node-2", R.HOLDERS_REQUIRED, R.EVICTION_REQUIRED, 1, "r2"))
    frame = plain(screens.LiveScreen(tracker, title="GPU remediation").render())
    assert frame[2].split()[:3] == ["NODE", "SAGA", "STATE"]
    assert frame[3].split()[:4] == ["gpu-node-1", "remediation", "remediation-done", "1"]
    assert frame[4].split()[:3] == ["gpu-node-2", "remediation", "gpu-pods-eviction-required"]
    assert frame[5].split()[:2] == ["gpu-node-3", "-"]
    [bar] = [line for line in frame if line.startswith("[")]
    assert bar.endswith("] 1/2 done, 0 failed, 1 remediating")


class StoredBus:
    prefix = "gpuop"

    def __init__(self, envelopes: list[Envelope]) -> None:
        self.stored = [
            StoredMessage("GPUOP_EVENTS", seq, "s", e.to_bytes(), e.time, {})
            for seq, e in enumerate(envelopes, start=1)
        ]

    async def read(
        self, subject: str, *, since: datetime | None = None, follow: bool = False
    ) -> AsyncIterator[StoredMessage]:
        for stored in self.stored:
            yield stored


async def test_following_ends_when_every_target_ended_and_not_at_a_failed_upgrade() -> None:
    bus = StoredBus([
        mig("gpu-node-1", None, MigState.MIG_CONFIG_REQUIRED, 0),
        mig("gpu-node-1", MigState.APPLY_REQUIRED, MigState.MIG_CONFIG_FAILED, 2),
        remediation("gpu-node-3", None, R.ADMISSION_REQUIRED, 3),
    ])  # fmt: skip
    tracker = Tracker(NODES, kind=rollout_view.MIG, targets=["gpu-node-1"])
    await rollout_view.follow(cast(Bus, bus), tracker, print_lines=False)
    assert "gpu-node-3" not in tracker.runs  # it returned at the target's end
    assert tracker.counts() == (0, 1, 0)
