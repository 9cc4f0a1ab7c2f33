"""A rollout that reaches the end of its maintenance window stops admitting, resumes when the
next window opens, and its log replays identically."""

from __future__ import annotations

from datetime import datetime, timedelta

from gpuop.events import upgrade as up
from gpuop.events.upgrade import UpgradeState
from gpuop.saga import NodeSaga, replaying
from tests.support.orchestrator import Stack
from tests.support.recording import NODES, record_rollout
from tests.support.sagas import T0, policy

WORKING_HOURS = {"start": "09:00", "end": "17:00"}  # every day, UTC; T0 is 12:00


async def test_a_rollout_stops_at_the_end_of_its_window_and_resumes_at_the_next() -> None:
    spec = policy(max_parallel_upgrades=1, maintenance_windows=[WORKING_HOURS])
    closed_at: list[datetime] = []

    def evening_after_the_first(sagas: list[NodeSaga], stack: Stack) -> None:
        done = sum(s.state is UpgradeState.UPGRADE_DONE for s in sagas)
        if done == 1 and not closed_at:
            stack.clock.advance((T0.replace(hour=17) - stack.clock.now()).total_seconds())
            closed_at.append(stack.clock.now())  # the window just closed
        elif closed_at and stack.clock.now() < closed_at[0] + timedelta(hours=16):
            stack.clock.advance(3600)  # the night passes, an hour per admission pass

    lines = await record_rollout(spec, between_passes=evening_after_the_first)
    log = replaying.parse_log(lines)
    admitted = {
        entry.envelope.node: entry.envelope.time
        for entry in log
        if isinstance(entry.payload, up.NodeAdmitted)
    }
    assert set(admitted) == set(NODES)
    first = min(admitted.values())
    later = sorted(t for t in admitted.values() if t != first)
    assert closed_at and all(t >= closed_at[0] + timedelta(hours=16) for t in later), (
        "no node was admitted between 17:00 and the next morning's 09:00"
    )
    comparison = replaying.compare(replaying.recorded_outputs(log), replaying.replay(log).outputs)
    assert comparison.identical, comparison.report()
