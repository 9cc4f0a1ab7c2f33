"""Follows a rollout through the public upgrade events: one line per node transition, then a
summary. Used by `gpuop demo`; reads only `gpuop.evt.upgrade.>`, as any external tool would.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from gpuop.bus import Bus
from gpuop.events import MalformedMessage, UnknownEventType, decode, subjects
from gpuop.events.upgrade import (
    TERMINAL_STATES,
    NodeUpgradeStateChanged,
    RolloutCompleted,
    RolloutFailed,
    UpgradeState,
)


@dataclass
class RolloutOutcome:
    """Where every node ended, as the events told it."""

    nodes: list[str]
    states: dict[str, UpgradeState] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def done(self) -> int:
        return sum(1 for s in self.states.values() if s is UpgradeState.UPGRADE_DONE)

    @property
    def failed(self) -> int:
        return sum(1 for s in self.states.values() if s is UpgradeState.UPGRADE_FAILED)

    @property
    def finished(self) -> bool:
        return all(self.states.get(n) in TERMINAL_STATES for n in self.nodes)

    def summary(self) -> str:
        return json.dumps(
            {
                "nodes": len(self.nodes),
                "done": self.done,
                "failed": self.failed,
                "seconds": round(self.seconds, 1),
            }
        )


async def follow(bus: Bus, nodes: list[str], started: float) -> RolloutOutcome:
    """Print each transition until every node is done or failed (or the rollout ends)."""
    outcome = RolloutOutcome(nodes)
    async for stored in bus.read(f"{bus.prefix}.evt.upgrade.>", follow=True):
        try:
            _, payload = decode(stored.data)
        except (MalformedMessage, UnknownEventType):
            continue
        elapsed = time.monotonic() - started
        if isinstance(payload, NodeUpgradeStateChanged):
            node = subjects.decode_node(stored.subject.split(".")[3])
            outcome.states[node] = payload.to_state
            if payload.to_state is UpgradeState.UPGRADE_FAILED:
                outcome.reasons[node] = payload.reason
            came_from = payload.from_state or "-"
            print(
                f"[{elapsed:6.1f}s] {node:<14} {came_from} -> {payload.to_state}"
                f"  (attempt {payload.attempt}; {payload.reason})",
                flush=True,
            )
        elif isinstance(payload, RolloutCompleted | RolloutFailed):
            print(f"[{elapsed:6.1f}s] rollout {type(payload).__name__[7:].lower()}", flush=True)
        if outcome.finished:
            break
    outcome.seconds = time.monotonic() - started
    return outcome
