"""`gpuop demo`'s view of a rollout: the tracker fed with public events, and the live screen
drawn from it (rows, progress bar, latest events, footer, cut to the terminal, redrawn in
place, cursor restored however it ends)."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import cast

import pytest

from gpuop.bus import Bus
from gpuop.bus.errors import BusUnavailable
from gpuop.bus.protocol import StoredMessage
from gpuop.events import Envelope, decode, new_event
from gpuop.events.driver import Component, DriverLoaded
from gpuop.events.upgrade import NodeUpgradeStateChanged, RolloutCompleted, UpgradeState
from gpuop_sim.cli import rollout_view, screens
from gpuop_sim.cli.rollout_view import Tracker
from tests.support.buses import heartbeat
from tests.support.sagas import BOOT_A, inventory

S = UpgradeState
NODES = ["gpu-node-1", "gpu-node-2", "gpu-node-3"]


def changed(node: str, before: UpgradeState | None, after: UpgradeState) -> Envelope:
    event = NodeUpgradeStateChanged(
        rollout_id="rollout-gpu-580.2",
        from_state=before,
        to_state=after,
        reason=f"now {after}",
        components=(Component.GPU,),
        target_versions={Component.GPU: "580.2"},
    )
    return new_event(event, node=node, source="test", now=datetime.now(UTC))


def feed(tracker: Tracker, envelope: Envelope) -> str | None:
    decoded, payload = decode(envelope.to_bytes())
    return tracker.observe(decoded, payload)


@pytest.fixture
def tracker() -> Tracker:
    tracked = Tracker(NODES)
    feed(tracked, new_event(inventory(BOOT_A, gpu="570.1"), node="gpu-node-1", source="test"))
    feed(tracked, heartbeat("gpu-node-1", 1))
    feed(tracked, changed("gpu-node-1", S.UNCORDON_REQUIRED, S.UPGRADE_DONE))
    feed(tracked, changed("gpu-node-2", S.VALIDATION_REQUIRED, S.UPGRADE_FAILED))
    feed(tracked, changed("gpu-node-3", S.CORDON_REQUIRED, S.DRAIN_REQUIRED))
    return tracked


def test_the_tracker_keeps_states_drivers_lines_and_quiet_events_out(tracker: Tracker) -> None:
    assert tracker.rows["gpu-node-1"].driver == "570.1"
    assert tracker.rows["gpu-node-2"].reason == "now upgrade-failed"
    assert (tracker.outcome.done, tracker.outcome.failed) == (1, 1)
    assert not tracker.outcome.finished
    kinds = [seen.kind for seen in tracker.latest]
    assert "hardware.heartbeat" not in kinds and kinds[0] == "hardware.discovered"
    line = feed(tracker, changed("gpu-node-3", S.DRAIN_REQUIRED, S.UPGRADE_DONE))
    assert line is not None and line.endswith(
        "gpu-node-3     drain-required -> upgrade-done  (attempt 1; now upgrade-done)"
    )
    assert tracker.outcome.finished
    completed = RolloutCompleted(rollout_id="r", done=2, failed=1, total=3, duration_seconds=3.0)
    assert str(feed(tracker, new_event(completed, node="_cluster", source="t"))).endswith(
        "rollout completed"
    )


def plain(lines: list[str]) -> list[str]:
    return [screens._ESCAPE.sub("", line) for line in lines]


def test_a_frame_shows_nodes_progress_latest_events_and_the_footer(tracker: Tracker) -> None:
    screen = screens.LiveScreen(tracker, title="GPU driver a -> b", footer=["events   tail it"])
    frame = plain(screen.render())
    assert frame[0].startswith("GPU driver a -> b   0:00 elapsed")
    assert frame[3].split()[:4] == ["gpu-node-1", "upgrade-done", "1", "570.1"]
    assert frame[4].split()[:3] == ["gpu-node-2", "upgrade-failed", "1"]
    assert "(unloaded)" in frame[5]  # no inventory seen for it
    [bar] = [line for line in frame if line.startswith("[")]
    assert bar.endswith("] 1/3 done, 1 failed, 1 upgrading")
    assert "Latest events" in frame and frame[-1] == "events   tail it"
    assert any("upgrade.state-changed" in line and "drain-required" in line for line in frame)

    short = plain(screen.render(height=10))
    assert len(short) == 10 and "Latest events" not in short and short[-1] == "events   tail it"


def test_lines_are_cut_to_the_width_keeping_escapes_whole() -> None:
    coloured = f"ab{screens.GREEN}cdef{screens.RESET}gh"
    assert screens.fit(coloured, 4) == f"ab{screens.GREEN}cd{screens.RESET}"
    assert screens.fit(coloured, 40) == coloured
    assert screens.visible_length(coloured) == 8


async def test_frames_are_redrawn_in_place_and_the_cursor_comes_back(tracker: Tracker) -> None:
    stream = io.StringIO()
    screen = screens.LiveScreen(tracker, title="t", stream=stream)
    with pytest.raises(KeyboardInterrupt):
        async with screen.showing():
            screen.draw()
            raise KeyboardInterrupt
    drawn = stream.getvalue()
    assert drawn.startswith(screens.HIDE_CURSOR)
    frame = len(screen.render(1000))
    assert f"\x1b[{frame}F" in drawn  # back to the first line of the previous frame
    assert drawn.endswith(f"{screens.SHOW_CURSOR}\n")  # what follows starts a clean line
    assert drawn.splitlines()[-1].endswith(screens.SHOW_CURSOR)


class BreakingBus:
    """Serves the stored events, breaking off once after the first two."""

    prefix = "gpuop"

    def __init__(self, envelopes: list[Envelope]) -> None:
        self.stored = [
            StoredMessage("GPUOP_EVENTS", seq, "s", e.to_bytes(), e.time, {})
            for seq, e in enumerate(envelopes, start=1)
        ]
        self.reads: list[datetime | None] = []

    async def read(
        self, subject: str, *, since: datetime | None = None, follow: bool = False
    ) -> AsyncIterator[StoredMessage]:
        self.reads.append(since)
        for stored in self.stored:
            if since is None or stored.time >= since:
                yield stored
            if len(self.reads) == 1 and stored.seq == 2:
                raise BusUnavailable("reading gpuop.evt.> stopped: TimeoutError()")


async def test_following_takes_a_broken_read_up_again_after_the_last_event() -> None:
    envelopes = [
        changed("gpu-node-1", S.CORDON_REQUIRED, S.DRAIN_REQUIRED),
        changed("gpu-node-1", S.DRAIN_REQUIRED, S.UPGRADE_DONE),
        changed("gpu-node-2", S.DRAIN_REQUIRED, S.UPGRADE_FAILED),
    ]
    bus = BreakingBus(envelopes)
    outcome = await rollout_view.follow(cast(Bus, bus), Tracker(NODES[:2]), print_lines=False)
    assert (outcome.done, outcome.failed) == (1, 1)
    assert bus.reads == [None, envelopes[1].time]


def test_a_loaded_gpu_driver_shows_before_discovery_scans_again(tracker: Tracker) -> None:
    loaded = DriverLoaded(command_id="c1", component=Component.GPU, version="580.2")
    ofed = DriverLoaded(command_id="c2", component=Component.OFED, version="25.01-0.6.0.0")

    feed(tracker, new_event(loaded, node="gpu-node-1", source="test"))
    feed(tracker, new_event(ofed, node="gpu-node-1", source="test"))

    assert tracker.rows["gpu-node-1"].driver == "580.2"  # the GPU's, not the NIC driver's
