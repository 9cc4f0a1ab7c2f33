"""`gpuop upgrade plan`'s arithmetic: the waves a rollout will admit and how long it will take.

Pure. `measure` turns the public state changes of past rollouts into the mean time a node
spends in each state of the upgrade; `durations` fills in a default for each state nobody
measured (shaped by the policy: no wait without a job selector, a short drain step when
draining is off). `forecast` then plays the rollout forward with the orchestrator's own
admission pass (`gpuop.saga.admission.plan`, so `maxParallelUpgrades`, `maxUnavailable`,
cordoned and NotReady nodes and the canary count exactly as they will): every admitted
node holds its slot for the sum of its states' durations, and each completion lets the
next admission pass run. Nodes admitted at the same moment form a wave; the makespan is
when the last node is done. Only the success path is predicted: no failure, retry, reboot
or rollback.
"""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from gpuop.events.upgrade import UpgradeState
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import admission
from gpuop.saga.admission import NodeStatus
from gpuop.saga.upgrade.records import NodeSaga, desired_targets, new_saga

S = UpgradeState

PATH: tuple[UpgradeState, ...] = (
    S.CORDON_REQUIRED,
    S.WAIT_FOR_JOBS_REQUIRED,
    S.POD_DELETION_REQUIRED,
    S.DRAIN_REQUIRED,
    S.OPERANDS_PAUSE_REQUIRED,
    S.DRIVER_RELOAD_REQUIRED,
    S.VALIDATION_REQUIRED,
    S.UNCORDON_REQUIRED,
)
"""The states an admitted node passes through on the success path, in order."""

DEFAULT_SECONDS: Mapping[UpgradeState, float] = {
    S.CORDON_REQUIRED: 2,
    S.WAIT_FOR_JOBS_REQUIRED: 300,
    S.POD_DELETION_REQUIRED: 30,
    S.DRAIN_REQUIRED: 90,
    S.OPERANDS_PAUSE_REQUIRED: 15,
    S.DRIVER_RELOAD_REQUIRED: 240,
    S.VALIDATION_REQUIRED: 60,
    S.UNCORDON_REQUIRED: 2,
}
"""Typical seconds per state on a real GPU node (driver install from a nearby source), used
where no past rollout measured the state."""
SKIPPED_SECONDS = 1.0
"""A state whose step has nothing to do (no job selector, drain disabled) still passes."""
_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_WAITING = (None, S.UPGRADE_REQUIRED, S.UPGRADE_DONE, S.UPGRADE_FAILED)
"""States of nodes not under way; a failed node is planned as retried from the start."""


@dataclass(frozen=True)
class StateChange:
    """One public state change of a node's saga, as the plan reads it."""

    saga: str
    """Whose change it is: the saga id and attempt, or the rollout, node and attempt."""
    state: UpgradeState
    at: datetime


@dataclass(frozen=True)
class Duration:
    """How long a node spends in one state."""

    seconds: float
    samples: int = 0
    """Past state changes it was measured from; 0: a default."""


def measure(changes: Iterable[StateChange]) -> dict[UpgradeState, Duration]:
    """The mean time spent in each state of `PATH`, from consecutive changes of one saga."""
    by_saga: dict[str, list[StateChange]] = defaultdict(list)
    for change in changes:
        by_saga[change.saga].append(change)
    spent: dict[UpgradeState, list[float]] = defaultdict(list)
    for history in by_saga.values():
        history.sort(key=lambda c: c.at)
        for entered, left in itertools.pairwise(history):
            if entered.state in PATH:
                spent[entered.state].append(max((left.at - entered.at).total_seconds(), 0.0))
    return {state: Duration(sum(s) / len(s), len(s)) for state, s in spent.items()}


def durations(
    policy: GPUClusterPolicySpec, measured: Mapping[UpgradeState, Duration] | None = None
) -> dict[UpgradeState, Duration]:
    """Every state of `PATH` with its measured duration, or the default for it."""
    upgrade = policy.upgrade_policy
    skipped = set()
    if not upgrade.wait_for_completion.pod_selector:
        skipped.add(S.WAIT_FOR_JOBS_REQUIRED)
    if not upgrade.drain.enable:
        skipped.add(S.DRAIN_REQUIRED)
    found = {}
    for state in PATH:
        known = (measured or {}).get(state)
        if known is not None:
            found[state] = known
        else:
            found[state] = Duration(SKIPPED_SECONDS if state in skipped else DEFAULT_SECONDS[state])
    return found


@dataclass(frozen=True)
class PlanNode:
    """What the plan knows of one managed node."""

    status: NodeStatus = field(default_factory=NodeStatus)
    state: UpgradeState | None = None
    """Its upgrade state now (None: never upgraded)."""
    needs_upgrade: bool = True
    """It does not run the desired versions (or it is not known to)."""


@dataclass(frozen=True)
class Wave:
    """Nodes admitted at the same moment."""

    number: int
    start: float
    """Seconds from now."""
    nodes: tuple[str, ...]
    canary: tuple[str, ...] = ()


@dataclass(frozen=True)
class Forecast:
    """The predicted rollout."""

    waves: tuple[Wave, ...]
    finishes: Mapping[str, float]
    """Node -> seconds from now until it is done (nodes already under way included)."""
    makespan: float
    """Seconds until the last node is done."""
    node_seconds: float
    """One node's upgrade, admission to done."""
    never_admitted: tuple[str, ...] = ()
    """Nodes that need the upgrade but would not be admitted (NotReady, or skipped: a skip
    label, `cordonedNodes: skip`)."""
    already_done: tuple[str, ...] = ()
    """Nodes that run the desired versions already."""
    under_way: tuple[str, ...] = ()
    """Nodes admitted before now, still upgrading."""


def remaining(state: UpgradeState, spent: Mapping[UpgradeState, Duration]) -> float:
    """Seconds left for a node in `state` (its whole path once admitted)."""
    if state not in PATH:
        return sum(d.seconds for d in spent.values())
    return sum(spent[s].seconds for s in PATH[PATH.index(state) :])


def forecast(
    nodes: Mapping[str, PlanNode],
    policy: GPUClusterPolicySpec,
    spent: Mapping[UpgradeState, Duration],
) -> Forecast:
    """Play the rollout forward from now (see the module docstring). A paused policy is
    played as if resumed: the plan says what `gpuop upgrade resume` would do."""
    # maintenance windows are left out: the plan orders the admissions, the windows say when
    # they may happen (the plan document lists them)
    upgrade = policy.upgrade_policy.model_copy(update={"paused": False, "maintenance_windows": ()})
    resumed = policy.model_copy(update={"upgrade_policy": upgrade})
    per_node = sum(d.seconds for d in spent.values())
    statuses = {name: node.status for name, node in nodes.items()}
    sagas: dict[str, NodeSaga] = {}
    running: list[tuple[float, str]] = []
    done, under_way = [], []
    for name, node in sorted(nodes.items()):
        if node.state not in _WAITING:
            saga = _saga(name, resumed, node.status.labels).model_copy(
                update={"state": node.state, "cordoned": True}
            )
            statuses[name] = replace(node.status, unschedulable=False)  # its saga cordoned it
            heapq.heappush(running, (remaining(node.state, spent), name))
            under_way.append(name)
        elif node.needs_upgrade:
            saga = _saga(name, resumed, node.status.labels)
        else:
            done.append(name)
            continue
        sagas[name] = saga
    waves: list[Wave] = []
    finishes = {name: at for at, name in running}
    now = 0.0
    while True:
        result = admission.plan(sagas.values(), statuses, resumed, _EPOCH + timedelta(seconds=now))
        for name in result.nodes:
            canary = name in result.canary
            sagas[name] = sagas[name].model_copy(
                update={"state": S.DRIVER_RELOAD_REQUIRED, "cordoned": True, "canary": canary}
            )
            finishes[name] = now + per_node
            heapq.heappush(running, (now + per_node, name))
        if result.nodes:
            waves.append(Wave(len(waves) + 1, now, result.nodes, result.canary))
        if not running:
            break
        now = running[0][0]
        while running and running[0][0] <= now + 1e-6:  # nodes finishing together
            _, name = heapq.heappop(running)
            sagas[name] = sagas[name].model_copy(
                update={"state": S.UPGRADE_DONE, "cordoned": False}
            )
    never = tuple(n for n, s in sorted(sagas.items()) if s.state is S.UPGRADE_REQUIRED)
    return Forecast(
        waves=tuple(waves),
        finishes=finishes,
        makespan=max(finishes.values(), default=0.0),
        node_seconds=per_node,
        never_admitted=never,
        already_done=tuple(done),
        under_way=tuple(under_way),
    )


def _saga(node: str, policy: GPUClusterPolicySpec, labels: Mapping[str, str]) -> NodeSaga:
    """An upgrade-required saga of `node` (in the driver pool its labels select) for the
    plan; versions unknown, so every desired component counts as changing."""
    found = policy.driver.pool_for(labels)
    pool = found.name if found is not None else None
    unknown = dict.fromkeys(desired_targets(policy, pool))
    return new_saga(
        node=node, rollout_id="plan", policy=policy, running=unknown, now=_EPOCH, pool=pool
    )
