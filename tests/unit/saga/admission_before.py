"""Admission's pass as it was before it went over the sagas once (issue 24): the reference
`tests/unit/saga/test_saga_admission_pass.py` holds `admission.plan` to, over random fleets.

Frozen: a change of admission's rules changes `admission.plan` and this copy alike, so that
the property keeps testing only that the faster pass decides as the plain one does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from gpuop.events.driver import Component
from gpuop.events.upgrade import UpgradeState
from gpuop.policy import GPUClusterPolicySpec, unavailable_budget
from gpuop.saga.admission import (
    Admission,
    NodeStatus,
    _current_wave,
    _holds_slot,
    _rules,
    _wanted,
    _wave_of,
    admitted_components,
    skip_reason,
)
from gpuop.saga.tallies import DoneSagas
from gpuop.saga.upgrade.records import NodeSaga

S = UpgradeState


def plan(
    sagas: Iterable[NodeSaga],
    nodes: Mapping[str, NodeStatus],
    policy: GPUClusterPolicySpec,
    now: datetime,
    *,
    done: DoneSagas | None = None,
) -> Admission:
    """Which upgrade-required nodes to admit now, and why (see the module docstring).

    `done`: settled sagas counted instead of passed in `sagas` (`tallies`), the result the
    same as with every saga passed; a node in both is taken from `sagas`."""
    upgrade = policy.upgrade_policy
    existing = [status for status in nodes.values() if status.exists]
    by_node = {s.node: s for s in sagas if s.node in nodes and nodes[s.node].exists}

    def counted_done(name: str) -> bool:
        return name in nodes and nodes[name].exists and name not in by_node

    done_pools = done.pools_where(counted_done) if done is not None else set()
    total = len(existing)
    hold = upgrade.failed_nodes_hold_slot
    in_progress = sum(_holds_slot(s, hold) for s in by_node.values())

    def cordoned(name: str) -> bool:
        saga = by_node.get(name)
        return nodes[name].unschedulable or (saga is not None and saga.cordoned)

    def held_elsewhere(name: str) -> bool:
        return nodes[name].held_by is not None

    def down(status: NodeStatus) -> bool:
        """Unavailable whatever its saga: NotReady, cordoned by someone else, held."""
        return not status.ready or status.unschedulable or status.held_by is not None

    # one cheap look per node, its saga only when it has one in play (issue 24)
    unavailable = sum(map(down, existing)) + sum(
        (s.cordoned or s.state is S.CORDON_REQUIRED) and not down(nodes[s.node])
        for s in by_node.values()
    )
    required = [s for s in by_node.values() if s.state is S.UPGRADE_REQUIRED]
    skipped: dict[str, str] = {}
    for saga in sorted(required, key=lambda s: s.node):
        why = skip_reason(
            saga.components, nodes[saga.node], upgrade, cordoned_by_saga=saga.cordoned
        )
        if why is not None:
            skipped[saga.node] = why
    max_unavailable = upgrade.max_unavailable_of(total)
    budget = unavailable_budget(upgrade.max_unavailable, total, unavailable).free
    pools = sorted(
        {s.pool for s in by_node.values()} | done_pools, key=lambda p: (p is not None, p or "")
    )
    rules = {pool: _rules(policy, pool) for pool in pools}
    members = {pool: [s for s in by_node.values() if s.pool == pool] for pool in pools}
    free: dict[str | None, int] = {}
    for pool in pools:
        waiting = sum(
            s.state is S.UPGRADE_REQUIRED and s.node not in skipped for s in members[pool]
        )
        busy = sum(_holds_slot(s, hold) for s in members[pool])
        parallel = rules[pool].max_parallel
        free[pool] = min(waiting if parallel == 0 else parallel - busy, budget)
    slots = min(sum(free.values()), budget) if pools else min(upgrade.max_parallel_upgrades, budget)
    canaries = {pool: [s for s in members[pool] if s.canary] for pool in pools}
    done_canaries = {
        pool: done.canaries_where(pool, counted_done) if done is not None else 0 for pool in pools
    }
    failed_canaries = {
        pool: tuple(sorted(s.node for s in canaries[pool] if s.state is S.UPGRADE_FAILED))
        for pool in pools
    }
    canary_failed = tuple(sorted(n for nodes_ in failed_canaries.values() for n in nodes_))
    open_canary = {
        pool: max(0, rules[pool].canary - len(canaries[pool]) - done_canaries[pool])
        if rules[pool].canary
        else 0
        for pool in pools
    }
    held_pools = {
        pool
        for pool in pools
        if rules[pool].canary > 0
        and (open_canary[pool] > 0 or not all(s.state is S.UPGRADE_DONE for s in canaries[pool]))
    }

    def wanted(saga: NodeSaga) -> bool:
        versions = rules[saga.pool].versions
        return versions is not None and _wanted(saga, versions)

    candidates = sorted(
        (
            s
            for s in required
            if nodes[s.node].ready
            and not held_elsewhere(s.node)
            and wanted(s)
            and s.node not in skipped
        ),
        key=lambda s: (not cordoned(s.node), s.node),
    )
    wave = _current_wave(by_node.values(), nodes, upgrade.waves.topology_label, skipped)
    if wave is not None:
        label = upgrade.waves.topology_label
        candidates = [s for s in candidates if _wave_of(nodes[s.node], label) == wave]
    windows = upgrade.maintenance_windows
    outside = bool(windows) and not any(w.contains(now) for w in windows)
    admitted: list[str] = []
    admitted_canary: list[str] = []
    components: dict[str, tuple[Component, ...]] = {}
    for saga in candidates if not (upgrade.paused or outside) else ():
        pool = saga.pool
        if failed_canaries[pool] or rules[pool].paused:
            continue  # a failed canary, or a pause, holds its own pool back
        as_canary = saga.canary or open_canary[pool] > 0
        if pool in held_pools and not as_canary:
            continue
        if (free[pool] <= 0 or budget <= 0) and not cordoned(saga.node):
            continue
        admitted.append(saga.node)
        free[pool] -= 1
        budget -= 1
        narrowed = admitted_components(saga, nodes[saga.node])
        if narrowed != saga.components:
            components[saga.node] = narrowed
        if as_canary:
            admitted_canary.append(saga.node)
            if not saga.canary:
                open_canary[pool] -= 1
    return Admission(
        at=now,
        nodes=tuple(admitted),
        canary=tuple(admitted_canary),
        total=total,
        in_progress=in_progress,
        max_unavailable=max_unavailable,
        unavailable=unavailable,
        slots=slots,
        held_by_canary=bool(held_pools),
        canary_failed=canary_failed,
        paused=upgrade.paused,
        skipped=skipped,
        components=components,
        outside_window=outside,
        wave=None if wave is None else wave[1],
        held_pools=tuple(sorted(p for p in held_pools if p is not None)),
    )
