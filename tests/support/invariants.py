"""What must hold of every rollout, checked on the recorded event log alone (the export of
`gpuop events export`, parsed by `replaying.parse_log`), never on the orchestrator's state:

- never more nodes cordoned by the rollout at once than maxUnavailable allows;
- no node uncordoned after its driver was touched (unload, load, rollback, reboot) until a
  validation succeeded after the last touch;
- no node drained twice in one attempt;
- no command issued twice with different ids for one step (same node, same payload, between
  the same two state changes of the node);
- no state change missing: each one starts from the state the node's last one ended in;
- every node ends upgrade-done, or upgrade-failed with a reason.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpuop.events import Command
from gpuop.events import driver as dm
from gpuop.events import kube as ke
from gpuop.events.upgrade import NodeUpgradeStateChanged, UpgradeState
from gpuop.saga.replaying import Recorded

DRIVER_TOUCHES = (
    dm.DriverUnloaded,
    dm.DriverLoaded,
    dm.DriverRolledBack,
    dm.RebootStarted,
    dm.DriverLoadFailed,
    dm.DriverRollbackFailed,
)
"""Driver events after which the node must validate before it is uncordoned."""


@dataclass
class Walk:
    """What the log says, node by node, as the checks go through it."""

    paths: dict[str, list[NodeUpgradeStateChanged]] = field(
        default_factory=lambda: defaultdict(list)
    )
    cordoned: set[str] = field(default_factory=set)
    most_cordoned: int = 0
    touched: set[str] = field(default_factory=set)
    """Nodes whose driver changed since their last successful validation."""
    drains: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))
    step_ids: dict[tuple[str, int, str, str], set[str]] = field(
        default_factory=lambda: defaultdict(set)
    )
    violations: list[str] = field(default_factory=list)

    def cordon(self, node: str, line: int, max_unavailable: int) -> None:
        if node in self.cordoned:
            return
        self.cordoned.add(node)
        self.most_cordoned = max(self.most_cordoned, len(self.cordoned))
        if len(self.cordoned) > max_unavailable:
            self.violations.append(
                f"line {line}: {len(self.cordoned)} nodes cordoned "
                f"({sorted(self.cordoned)}), maxUnavailable is {max_unavailable}"
            )

    def uncordon(self, node: str, line: int) -> None:
        if node not in self.cordoned:
            return
        self.cordoned.discard(node)
        if node in self.touched:
            self.violations.append(f"line {line}: {node} uncordoned before its driver validated")

    def attempt(self, node: str) -> int:
        path = self.paths.get(node)
        return path[-1].attempt if path else 0


def check(log: Sequence[Recorded], max_unavailable: int) -> Walk:
    """Walk `log` in the export's (time) order; `Walk.violations` lists every broken
    invariant."""
    walk = Walk()
    for entry in sorted(log, key=lambda recorded: recorded.line):
        node, payload = entry.envelope.subject, entry.payload
        if payload is None:
            continue
        if isinstance(payload, Command):
            data = json.dumps(payload.model_dump(mode="json"), sort_keys=True)
            key = (node, len(walk.paths.get(node, ())), entry.envelope.type, data)
            walk.step_ids[key].add(entry.envelope.id)
        elif isinstance(payload, NodeUpgradeStateChanged):
            path = walk.paths[node]
            if path and payload.from_state is not path[-1].to_state:
                walk.violations.append(
                    f"line {entry.line}: {node} moved from {payload.from_state} but the log "
                    f"last had it in {path[-1].to_state}: a state change is missing"
                )
            path.append(payload)
        elif isinstance(payload, ke.NodeCordoned):
            walk.cordon(node, entry.line, max_unavailable)
        elif isinstance(payload, ke.NodeUncordoned):
            walk.uncordon(node, entry.line)
        elif isinstance(payload, ke.NodeObserved):
            # a leader that cordoned or uncordoned and died before saying so: the node's
            # next observation, while its saga waits for that step, shows it instead
            waiting = walk.paths[node][-1].to_state if walk.paths.get(node) else None
            if payload.unschedulable and waiting is UpgradeState.CORDON_REQUIRED:
                walk.cordon(node, entry.line, max_unavailable)
            elif not payload.unschedulable and waiting is UpgradeState.UNCORDON_REQUIRED:
                walk.uncordon(node, entry.line)
        elif isinstance(payload, DRIVER_TOUCHES):
            walk.touched.add(node)
        elif isinstance(payload, dm.DriverValidated):
            walk.touched.discard(node)
        elif isinstance(payload, ke.DrainCompleted):
            drains = (node, walk.attempt(node))
            walk.drains[drains] += 1
            if walk.drains[drains] > 1:
                walk.violations.append(
                    f"line {entry.line}: {node} drained again in attempt {drains[1]}"
                )
    for (node, transitions, type_, _), ids in walk.step_ids.items():
        if len(ids) > 1:
            walk.violations.append(
                f"{node}: {type_} issued with {len(ids)} ids after transition {transitions}"
            )
    for node, path in walk.paths.items():
        last = path[-1]
        if last.to_state is UpgradeState.UPGRADE_FAILED and not last.reason:
            walk.violations.append(f"{node} ended upgrade-failed without a reason")
        elif last.to_state not in (UpgradeState.UPGRADE_DONE, UpgradeState.UPGRADE_FAILED):
            walk.violations.append(f"{node} ended in {last.to_state}, neither done nor failed")
    return walk


def states(walk: Walk, node: str) -> list[UpgradeState]:
    """The states `node` went through, in order."""
    return [change.to_state for change in walk.paths.get(node, [])]
