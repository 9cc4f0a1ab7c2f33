"""Admission: which upgrade-required nodes may start now, under the policy's limits.

Pure. The orchestrator's runtime calls `plan` (or `admit`) with the sagas of the rollout and
the managed nodes whenever a saga or a node changes, then feeds each admitted node's saga
`core.Admitted(canary=...)`; the done sagas it counts instead of passing them
(`tallies.DoneSagas`), so a pass costs no more as nodes finish. The arithmetic is upstream's
`GetUpgradesAvailable` (k8s-operator-libs, `upgrade_inplace.go`); its budget part, the one
`maxUnavailable` budget every saga kind shares, is `gpuop.policy.unavailable_budget`
(`cluster_budget` weighs it without a pass):

    total        managed nodes (that exist)
    in_progress  sagas past upgrade-required and not done (upgrade-failed only when
                 `failedNodesHoldSlot`)
    max_unavail  `maxUnavailable` of total, a percentage rounded up
    avail        maxParallelUpgrades - in_progress   (0 = no limit: every required node)
    unavail_now  nodes NotReady, cordoned by someone else, or cordoned by their saga (or
                 about to be: a saga in cordon-required, still staging its packages)
    avail        = min(avail, max_unavail); 0 when unavail_now >= max_unavail; else cut so
                   that unavail_now + avail <= max_unavail (when max_unavail < total)

gpuop's differences: each node counts as unavailable once (upstream counts a cordoned
cordon-required node twice); failed nodes hold no parallel slot unless configured (they still
count as unavailable while cordoned), so one broken node never blocks the rest; a NotReady
node is not admitted (it could not make progress), nor one another kind of saga holds
(`NodeStatus.held_by`: a remediation or MIG reconfiguration, counted as unavailable: one
budget for every kind); an upgrade-required node that is already cordoned is admitted even
with no slot left, first, as upstream does (`cordonedNodes: upgradeFirst`, the default).

Nodes left out (`Admission.skipped`, counted as skipped in the rollout's status), as upstream
leaves a node labelled `nvidia.com/gpu-driver-upgrade.skip=true` in upgrade-required: a node
whose skip labels (`SKIP_LABELS`, `NodeStatus.skip`) cover every component its saga upgrades,
and, with `cordonedNodes: skip`, a node someone else cordoned (not its own saga, as a retry
finds it) until it is uncordoned. A node whose labels skip only some of the components is
admitted for the others (`Admission.components`, recorded in `NodeAdmitted` so that a replay
narrows the saga alike), keeping those a failed attempt touched. The labels are read here,
at admission, and nowhere else: a saga past upgrade-required goes on whatever labels appear.

What the operator controls (`gpuop upgrade pause` and `start`, through the policy): while
`upgradePolicy.paused` is set nothing is admitted, and sagas already admitted go on; an
upgrade-required saga whose targets are not the versions the policy asks for now (one of an
earlier rollout, superseded before it was admitted) is never admitted.

New nodes (`NodeSaga.bring_up`: a node with no driver and no GPU pods, kept behind the
taint `gpuop.io/driver-not-ready:NoSchedule` instead of cordoned): admitted as soon as they
are Ready, without a slot. They hold no parallel slot, are never unavailable on their saga's
account, and neither the canary, waves nor maintenance windows hold them back (they disrupt
nothing); a pause, a skip label and a NotReady node do, as for any node.

Driver pools (`driver.pools`): a saga follows the pool it started in (`NodeSaga.pool`;
None: the default drivers). Every pool is admitted in the same pass, each within its own
`maxParallelUpgrades` (the pool's, else the cluster's, counted over the pool's sagas) and
its own canary (likewise), and all of them within the one budget above: `maxUnavailable`
and the nodes unavailable now are counted over the whole cluster, so two pools never take
more nodes down together than one could alone. A paused pool, or one with a failed canary,
admits nothing while the others go on; a saga of a pool the policy no longer has is never
admitted.

The canary (`canary.nodes` = N > 0): the first N nodes admitted are marked canary. Until all
of them reached upgrade-done, no other node is admitted (a canary retried after a failure is
re-admitted as a canary). While any canary is in upgrade-failed, nothing at all is admitted,
and `Admission.canary_failed` names the failed ones so the runtime can report the rollout held
(or failed, once they have no retry left).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType

from gpuop.events.driver import Component
from gpuop.events.upgrade import UpgradeState
from gpuop.policy import Budget, GPUClusterPolicySpec, UpgradePolicy, unavailable_budget
from gpuop.saga.tallies import DoneSagas
from gpuop.saga.upgrade.records import NodeSaga, desired_targets

S = UpgradeState

SKIP_LABELS: Mapping[Component, str] = MappingProxyType(
    {
        Component.GPU: "nvidia.com/gpu-driver-upgrade.skip",
        Component.OFED: "nvidia.com/ofed-driver-upgrade.skip",
    }
)
"""The node labels that, set to `true`, keep a component out of driver upgrades: upstream's
`nvidia.com/<drv>-driver-upgrade.skip` (k8s-operator-libs' `UpgradeSkipNodeLabelKeyFmt`),
with the GPU Operator's driver name `gpu` and the Network Operator's `ofed`, so a node
labelled for either operator is left alone by gpuop too."""


def skipped_by(labels: Mapping[str, str]) -> frozenset[Component]:
    """The components a node's labels keep out of driver upgrades (`SKIP_LABELS`)."""
    return frozenset(c for c, label in SKIP_LABELS.items() if labels.get(label) == "true")


@dataclass(frozen=True)
class NodeStatus:
    """What admission needs to know of one managed node."""

    ready: bool = True
    """The node's Ready condition is True."""
    unschedulable: bool = False
    """Cordoned by someone other than its saga (an administrator, another controller)."""
    exists: bool = True
    """The node object exists; a removed node counts for nothing."""
    held_by: str | None = None
    """The kind of another saga that holds the node now (a GPU remediation, a MIG
    reconfiguration): the node counts as unavailable, and is not admitted until it is free.
    Every kind's sagas share the one `maxUnavailable` budget this way."""
    skip: frozenset[Component] = frozenset()
    """Components the node's skip labels keep out of upgrades (`skipped_by` its labels)."""
    labels: Mapping[str, str] = field(default_factory=dict, compare=False)
    """The node's labels, for the waves' topology label."""

    @property
    def unavailable(self) -> bool:
        """Unavailable whatever its saga: NotReady, cordoned by someone else, or held by
        another kind's saga."""
        return not self.ready or self.unschedulable or self.held_by is not None


@dataclass(frozen=True)
class Admission:
    """The result of one admission pass, with the figures behind it."""

    at: datetime
    """When the pass ran."""
    nodes: tuple[str, ...]
    """Nodes to admit now, in order."""
    canary: tuple[str, ...]
    """Of those, the ones admitted as canary nodes."""
    total: int
    """Managed nodes."""
    in_progress: int
    """Sagas holding a parallel slot."""
    max_unavailable: int
    """`maxUnavailable` as a node count."""
    unavailable: int
    """Nodes unavailable now."""
    slots: int
    """Free slots after the arithmetic (already-cordoned nodes may be admitted beyond it)."""
    held_by_canary: bool
    """Non-canary nodes are waiting for the canary nodes to be done."""
    canary_failed: tuple[str, ...]
    """Canary nodes in upgrade-failed: nothing is admitted while there are any."""
    paused: bool = False
    """The policy pauses the rollout: nothing is admitted."""
    skipped: Mapping[str, str] = field(default_factory=dict)
    """Waiting nodes left out, each with why (a skip label, `cordonedNodes: skip`), whatever
    else held the pass back."""
    components: Mapping[str, tuple[Component, ...]] = field(default_factory=dict)
    """Admitted nodes let upgrade fewer components than their saga has (a skip label covers
    some of them): the components each may upgrade (`admitted_components`)."""
    outside_window: bool = False
    """The policy has maintenance windows and none is open: nothing is admitted."""
    wave: str | None = None
    """With waves: the failure domain being upgraded now (its topology label's value; empty:
    the nodes without the label); None: no waves, or nothing left to admit."""
    held_pools: tuple[str, ...] = ()
    """Driver pools whose other nodes wait for the pool's canary nodes."""


def _holds_slot(saga: NodeSaga, failed_hold: bool) -> bool:
    if saga.bring_up or saga.state in (S.UPGRADE_REQUIRED, S.UPGRADE_DONE):
        return False
    return saga.state is not S.UPGRADE_FAILED or failed_hold


def _wanted(saga: NodeSaga, versions: Mapping[Component, str]) -> bool:
    """The saga installs the versions the policy asks for now, not a superseded rollout's
    (a change of source alone supersedes nothing, as it names the same rollout)."""
    return all(versions.get(c) == target.version for c, target in saga.targets.items())


def skip_reason(
    components: Collection[Component],
    status: NodeStatus,
    policy: UpgradePolicy,
    *,
    cordoned_by_saga: bool = False,
) -> str | None:
    """Why admission leaves a waiting saga that upgrades `components` out, or None when it
    may be admitted. `cordoned_by_saga`: the node is cordoned by the saga itself (a retry
    after a failure that left it cordoned), which `cordonedNodes: skip` does not count."""
    if components and set(components) <= status.skip:
        labels = ", ".join(f"{SKIP_LABELS[c]}=true" for c in components)
        return f"skipped: {labels}"
    if policy.cordoned_nodes == "skip" and status.unschedulable and not cordoned_by_saga:
        return "skipped: cordoned by someone else (cordonedNodes: skip)"
    return None


def admitted_components(saga: NodeSaga, status: NodeStatus) -> tuple[Component, ...]:
    """The components an admission now lets the saga upgrade: its own, less those the
    node's skip labels keep out, but never one a failed attempt touched (its driver must be
    finished or rolled back)."""
    return tuple(c for c in saga.components if c not in status.skip or c in saga.touched)


Pool = str | None
"""A driver pool's name; None: the default drivers."""


@dataclass(frozen=True)
class _PoolRules:
    """What admission applies to one driver pool's sagas."""

    max_parallel: int
    canary: int
    paused: bool
    versions: Mapping[Component, str] | None
    """The versions the pool's nodes should run; None: the policy has no such pool now."""


def _rules(policy: GPUClusterPolicySpec, pool: Pool) -> _PoolRules:
    upgrade = policy.upgrade_policy
    try:
        found = policy.driver.pool(pool)
        versions = {c: t.version for c, t in desired_targets(policy, pool).items()}
    except KeyError:
        return _PoolRules(upgrade.max_parallel_upgrades, 0, True, None)
    own = found.upgrade_policy if found is not None else None
    parallel = upgrade.max_parallel_upgrades
    canary = upgrade.canary.nodes
    if own is not None and own.max_parallel_upgrades is not None:
        parallel = own.max_parallel_upgrades
    if own is not None and own.canary is not None:
        canary = own.canary.nodes
    return _PoolRules(parallel, canary, own is not None and own.paused, versions)


@dataclass
class _Tally:
    """The sagas in play, sorted by what admission does with them, and the counts behind
    the budget: one cheap look per node and one pass over the sagas (issue 24), since a
    pass early in a rollout weighs nearly every node's saga, most of them waiting."""

    nodes: Mapping[str, NodeStatus]
    by_node: dict[str, NodeSaga]
    """The sagas of nodes that exist, by node."""
    total: int
    unavailable: int
    in_progress: int = 0
    required: list[NodeSaga] = field(default_factory=list)
    bringing_up: list[NodeSaga] = field(default_factory=list)
    """New nodes' waiting sagas: admitted without a slot."""
    cordoned_waiting: list[NodeSaga] = field(default_factory=list)
    """Waiting sagas of cordoned nodes: admitted first, they need no slot."""
    in_play: set[Pool] = field(default_factory=set)
    required_in: Counter[Pool] = field(default_factory=Counter)
    busy: Counter[Pool] = field(default_factory=Counter)
    canaries_in: dict[Pool, list[NodeSaga]] = field(default_factory=dict)

    def counted_done(self, name: str) -> bool:
        """The node's saga is counted in `DoneSagas` rather than passed."""
        return name in self.nodes and self.nodes[name].exists and name not in self.by_node

    def add(self, saga: NodeSaga, failed_hold: bool) -> None:
        pool = saga.pool
        self.in_play.add(pool)
        if saga.bring_up:
            if saga.state is S.UPGRADE_REQUIRED:
                self.bringing_up.append(saga)
            return
        status = self.nodes[saga.node]
        if saga.state is S.UPGRADE_REQUIRED:
            self.required.append(saga)
            self.required_in[pool] += 1
            if saga.cordoned or status.unschedulable:
                self.cordoned_waiting.append(saga)
        elif _holds_slot(saga, failed_hold):
            self.in_progress += 1
            self.busy[pool] += 1
        # a saga staging its packages holds its place in the budget: it cordons next
        if (saga.cordoned or saga.state is S.CORDON_REQUIRED) and not status.unavailable:
            self.unavailable += 1
        if saga.canary:
            self.canaries_in.setdefault(pool, []).append(saga)


def _tally(sagas: Iterable[NodeSaga], nodes: Mapping[str, NodeStatus], failed_hold: bool) -> _Tally:
    existing = [status for status in nodes.values() if status.exists]
    tally = _Tally(
        nodes=nodes,
        by_node={s.node: s for s in sagas if s.node in nodes and nodes[s.node].exists},
        total=len(existing),
        unavailable=sum(status.unavailable for status in existing),
    )
    for saga in tally.by_node.values():
        tally.add(saga, failed_hold)
    return tally


def cluster_budget(
    sagas: Iterable[NodeSaga], nodes: Mapping[str, NodeStatus], policy: UpgradePolicy
) -> Budget:
    """The one `maxUnavailable` budget now, as `plan` weighs it (`Admission.max_unavailable`,
    `Admission.unavailable`), without the rest of the pass: for the admission of the other
    saga kinds, which share it. `nodes` with `held_by` set on the nodes they hold."""
    tally = _tally(sagas, nodes, policy.failed_nodes_hold_slot)
    return unavailable_budget(policy.max_unavailable, tally.total, tally.unavailable)


def _skips(tally: _Tally, upgrade: UpgradePolicy) -> tuple[dict[str, str], Counter[Pool]]:
    """The waiting nodes left out, each with why, and how many of each pool's."""
    nodes = tally.nodes
    skip_by_cordon = upgrade.cordoned_nodes == "skip"
    skipped: dict[str, str] = {}
    skipped_in: Counter[Pool] = Counter()
    # only a node with a skip label, or cordoned by someone else, can be left out
    for saga in sorted(
        (
            s
            for s in (*tally.required, *tally.bringing_up)
            if nodes[s.node].skip or (skip_by_cordon and nodes[s.node].unschedulable)
        ),
        key=_by_node,
    ):
        why = skip_reason(
            saga.components, nodes[saga.node], upgrade, cordoned_by_saga=saga.cordoned
        )
        if why is not None:
            skipped[saga.node] = why
            if not saga.bring_up:
                skipped_in[saga.pool] += 1
    return skipped, skipped_in


def _pool_slots(
    tally: _Tally,
    rules: Mapping[Pool, _PoolRules],
    skipped_in: Counter[Pool],
    budget: int,
) -> dict[Pool, int]:
    """Each pool's free parallel slots (its waiting nodes when it has no limit), none above
    the cluster's budget."""
    free: dict[Pool, int] = {}
    for pool, rule in rules.items():
        waiting = tally.required_in[pool] - skipped_in[pool]
        parallel = rule.max_parallel
        free[pool] = min(waiting if parallel == 0 else parallel - tally.busy[pool], budget)
    return free


@dataclass(frozen=True)
class _Canaries:
    """The canary gate of each pool."""

    failed: Mapping[Pool, tuple[str, ...]]
    """The pool's canary nodes in upgrade-failed."""
    open: Mapping[Pool, int]
    """Canary places not yet given to a node."""
    held: frozenset[Pool]
    """Pools whose other nodes wait for their canary nodes."""


def _canaries(tally: _Tally, rules: Mapping[Pool, _PoolRules], done: DoneSagas | None) -> _Canaries:
    canaries = {pool: tally.canaries_in.get(pool, []) for pool in rules}
    done_canaries = {
        pool: done.canaries_where(pool, tally.counted_done) if done is not None else 0
        for pool in rules
    }
    failed = {
        pool: tuple(sorted(s.node for s in canaries[pool] if s.state is S.UPGRADE_FAILED))
        for pool in rules
    }
    open_places = {
        pool: max(0, rule.canary - len(canaries[pool]) - done_canaries[pool]) if rule.canary else 0
        for pool, rule in rules.items()
    }
    held = frozenset(
        pool
        for pool, rule in rules.items()
        if rule.canary > 0
        and (open_places[pool] > 0 or not all(s.state is S.UPGRADE_DONE for s in canaries[pool]))
    )
    return _Canaries(failed, open_places, held)


@dataclass
class _Choice:
    """The choice of the nodes to admit, as it is made: what is left of the budget, of each
    pool's slots and of its canary places, and what was chosen so far."""

    nodes: Mapping[str, NodeStatus]
    rules: Mapping[Pool, _PoolRules]
    canaries: _Canaries
    free: dict[Pool, int]
    budget: int
    skipped: Mapping[str, str]
    wave: tuple[int, str] | None
    label: str
    open_canary: dict[Pool, int] = field(init=False)
    admitted: list[str] = field(default_factory=list)
    admitted_canary: list[str] = field(default_factory=list)
    components: dict[str, tuple[Component, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.open_canary = dict(self.canaries.open)

    def may_start(self, saga: NodeSaga) -> bool:
        """Ready, free of other kinds, wanted and not skipped."""
        status = self.nodes[saga.node]
        versions = self.rules[saga.pool].versions
        return (
            status.ready
            and status.held_by is None
            and versions is not None
            and _wanted(saga, versions)
            and saga.node not in self.skipped
        )

    def candidate(self, saga: NodeSaga) -> bool:
        """May be admitted now, slots aside."""
        return self.may_start(saga) and (
            self.wave is None or _wave_of(self.nodes[saga.node], self.label) == self.wave
        )

    def no_slot_left(self) -> bool:
        return self.budget <= 0 or max(self.free.values(), default=0) <= 0

    def admit(self, saga: NodeSaga, *, is_cordoned: bool) -> None:
        """Admit the candidate `saga` if its pool's gate, slots and the budget allow."""
        pool = saga.pool
        if self.canaries.failed[pool] or self.rules[pool].paused:
            return  # a failed canary, or a pause, holds its own pool back
        as_canary = saga.canary or self.open_canary[pool] > 0
        if pool in self.canaries.held and not as_canary:
            return
        if (self.free[pool] <= 0 or self.budget <= 0) and not is_cordoned:
            return
        self.admitted.append(saga.node)
        self.free[pool] -= 1
        self.budget -= 1
        narrowed = admitted_components(saga, self.nodes[saga.node])
        if narrowed != saga.components:
            self.components[saga.node] = narrowed
        if as_canary:
            self.admitted_canary.append(saga.node)
            if not saga.canary:
                self.open_canary[pool] -= 1


def _by_node(saga: NodeSaga) -> str:
    return saga.node


def _choose(choice: _Choice, tally: _Tally, *, paused: bool, outside: bool) -> None:
    """Admitted in order: new nodes (no slot), then the cordoned nodes (they need no slot),
    then the others by name. Free slots and the budget only shrink, so once neither is left
    no uncordoned node is even looked at, let alone sorted: the waiting nodes of a full
    rollout cost nothing here."""
    if not paused:
        for saga in sorted(tally.bringing_up, key=_by_node):
            if choice.may_start(saga):
                choice.admitted.append(saga.node)
    if paused or outside:
        return
    for saga in sorted(tally.cordoned_waiting, key=_by_node):
        if choice.candidate(saga):
            choice.admit(saga, is_cordoned=True)
    if choice.no_slot_left():
        return
    first = {s.node for s in tally.cordoned_waiting}
    for saga in sorted((s for s in tally.required if s.node not in first), key=_by_node):
        if choice.no_slot_left():
            break
        if choice.candidate(saga):
            choice.admit(saga, is_cordoned=False)


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
    tally = _tally(sagas, nodes, upgrade.failed_nodes_hold_slot)
    skipped, skipped_in = _skips(tally, upgrade)
    budget = unavailable_budget(upgrade.max_unavailable, tally.total, tally.unavailable)
    done_pools = done.pools_where(tally.counted_done) if done is not None else set()
    pools = sorted(tally.in_play | done_pools, key=lambda p: (p is not None, p or ""))
    rules = {pool: _rules(policy, pool) for pool in pools}
    free = _pool_slots(tally, rules, skipped_in, budget.free)
    if pools:
        slots = min(sum(free.values()), budget.free)
    else:
        slots = min(upgrade.max_parallel_upgrades, budget.free)
    canaries = _canaries(tally, rules, done)
    label = upgrade.waves.topology_label
    wave = _current_wave(tally.by_node.values(), nodes, label, skipped)
    windows = upgrade.maintenance_windows
    outside = bool(windows) and not any(w.contains(now) for w in windows)
    choice = _Choice(nodes, rules, canaries, free, budget.free, skipped, wave, label)
    _choose(choice, tally, paused=upgrade.paused, outside=outside)
    return Admission(
        at=now,
        nodes=tuple(choice.admitted),
        canary=tuple(choice.admitted_canary),
        total=budget.total,
        in_progress=tally.in_progress,
        max_unavailable=budget.max_unavailable,
        unavailable=budget.unavailable,
        slots=slots,
        held_by_canary=bool(canaries.held),
        canary_failed=tuple(sorted(n for failed in canaries.failed.values() for n in failed)),
        paused=upgrade.paused,
        skipped=skipped,
        components=choice.components,
        outside_window=outside,
        wave=None if wave is None else wave[1],
        held_pools=tuple(sorted(p for p in canaries.held if p is not None)),
    )


_UNLABELLED = (1, "")
"""Where nodes without the topology label sort: after every labelled domain."""


def _wave_of(status: NodeStatus, label: str) -> tuple[int, str]:
    value = status.labels.get(label)
    return (0, value) if value is not None else _UNLABELLED


def _current_wave(
    sagas: Iterable[NodeSaga],
    nodes: Mapping[str, NodeStatus],
    label: str,
    skipped: Mapping[str, str],
) -> tuple[int, str] | None:
    """The first failure domain (in label order) with a node waiting or under way; None
    without waves or when no node is left. Done and failed nodes are finished with, and
    skipped nodes never hold a domain back."""
    if not label:
        return None
    open_domains = [
        _wave_of(nodes[s.node], label)
        for s in sagas
        if s.state not in (S.UPGRADE_DONE, S.UPGRADE_FAILED)
        and s.node not in skipped
        and not s.bring_up
    ]
    return min(open_domains) if open_domains else None


def admit(
    sagas: Iterable[NodeSaga],
    nodes: Mapping[str, NodeStatus],
    policy: GPUClusterPolicySpec,
    now: datetime,
    *,
    done: DoneSagas | None = None,
) -> list[str]:
    """The nodes `plan` admits now."""
    return list(plan(sagas, nodes, policy, now, done=done).nodes)
