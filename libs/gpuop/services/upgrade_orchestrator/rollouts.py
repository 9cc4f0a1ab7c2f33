"""Rollouts: which one the policy asks for, and how far it got, told on the bus and in the
policy's status.

A rollout is named after the versions it installs (`rollout_id_for`), and, from the second
rollout of a policy on, after the policy generation that asked for them, since versions can
come back (`gpuop upgrade abort`) and a rollout's ids must never repeat an earlier one's (the
server and the agents would drop its messages as duplicates). The controller records the id
in the policy's status (`RolloutRecord`), so every replica uses the same and a takeover
continues the same rollout. The
`RolloutReporter` publishes the public rollout events on `gpuop.evt.upgrade._cluster.*`:
`RolloutStarted` once, `RolloutProgress` whenever the counts per state change (or the
count of nodes admission leaves out, `skipped`, which stay in upgrade-required),
`RolloutCompleted` when every node is done, `RolloutFailed` when every node ended and some
failed with no retry left, or with reason `superseded` when the policy asked for other
versions before it ended (`gpuop upgrade abort`, or a new `gpuop upgrade start`; told by the
leader that saw the change). A leader publishes each of them once; they have deterministic
ids, so a new leader repeating them within the server's duplicate window stores nothing
twice; a repeated progress report is harmless. The reporter keeps the counts of the current
rollout only.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Collection, Sequence
from datetime import datetime

from gpuop.bus import Bus
from gpuop.events import ids, subjects
from gpuop.events import upgrade as up
from gpuop.events.driver import Component
from gpuop.events.upgrade import UpgradeState
from gpuop.policy import GPUClusterPolicySpec, parameters
from gpuop.policy.conditions import PoolProgress, RolloutRecord
from gpuop.policy.drivers import DEFAULT_POOL
from gpuop.saga import NodeSaga
from gpuop.saga.upgrade.records import desired_targets
from gpuop.services.upgrade_orchestrator.publishing import Publisher

_UNSAFE = re.compile(r"[^A-Za-z0-9._:/-]")
KERNEL_MODULE_PARAMETERS = "kernelModuleParameters"
"""The suffix of the rollout's record of a digest of the GPU driver's parameters."""
KERNEL_MODULE_TYPE = "kernelModuleType"
"""The suffix of the rollout's record of a GPU driver's `kernelModuleType` (`versions_of`)."""


def rollout_id_for(policy: GPUClusterPolicySpec, generation: int | None = None) -> str:
    """The rollout that installs the policy's versions: `rollout-gpu-580.1[-ofed-25.04]`,
    then, with driver pools, `-pools-<digest>` of every pool's versions (so that a change of
    one pool's driver is a new rollout, and the id stays short), and `-g<generation>` when a
    generation is given."""
    parts = [f"{c}-{t.version}" for c, t in desired_targets(policy).items()]
    if policy.driver.pools:
        pooled = sorted((k, v) for k, v in versions_of(policy).items() if "/" in k)
        digest = hashlib.sha256(repr(pooled).encode()).hexdigest()[:10]
        parts.append(f"pools-{digest}")
    suffix = f"-g{generation}" if generation is not None else ""
    return _UNSAFE.sub("_", "rollout-" + "-".join(parts) + suffix)


def versions_of(policy: GPUClusterPolicySpec) -> dict[str, str]:
    """The version the policy asks for, per component it manages (`gpu`, `ofed`) and, per
    driver pool, per component of the pool (`<pool>/gpu`, `<pool>/ofed`); and the GPU
    driver's `kernelModuleType` where it is not `auto` (`gpu.kernelModuleType`,
    `<pool>/gpu.kernelModuleType`), so that a change of it is a new rollout, whose sagas
    reload the nodes that run the other kernel modules (`auto` leaves the key out: a policy
    that never set it keeps the rollout it had); and a digest of its `kernelModuleParameters`
    where it sets any, so that a change of them alone is a new rollout too, whose sagas
    reload the modules of the nodes their last saga loaded with others."""
    found: dict[str, str] = {}
    for pool in (None, *(p.name for p in policy.driver.pools)):
        prefix = "" if pool is None else f"{pool}/"
        for c, t in desired_targets(policy, pool).items():
            found[f"{prefix}{c}"] = t.version
        gpu, _ = policy.driver.components_of(pool)
        if gpu.kernel_module_type != "auto":
            found[f"{prefix}{Component.GPU}.{KERNEL_MODULE_TYPE}"] = gpu.kernel_module_type
        options = parameters.options(gpu.kernel_module_parameters)
        if options:
            digest = hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()
            found[f"{prefix}{Component.GPU}.{KERNEL_MODULE_PARAMETERS}"] = digest[:16]
    return found


def current_rollout(
    policy: GPUClusterPolicySpec, recorded: RolloutRecord | None, generation: int | None
) -> RolloutRecord:
    """The rollout of the policy's versions: the recorded one while the versions are the
    same; else a new one, named after the generation unless it is the policy's first."""
    versions = versions_of(policy)
    if recorded is not None and recorded.versions == versions:
        return recorded
    named = None if recorded is None else (generation or 0)
    return RolloutRecord(id=rollout_id_for(policy, named), versions=versions)


def counts(sagas: Sequence[NodeSaga]) -> dict[UpgradeState, int]:
    """Nodes per state, states without nodes left out, in the enum's order."""
    counted = Counter(saga.state for saga in sagas)
    return {state: counted[state] for state in UpgradeState if counted[state]}


def pool_progress(
    sagas: Sequence[NodeSaga], policy: GPUClusterPolicySpec, skipped: Collection[str] = ()
) -> tuple[PoolProgress, ...]:
    """How far each driver pool's nodes got, the nodes of no pool as `default`; nothing
    when the policy has no pools (and no saga follows one)."""
    names = [pool.name for pool in policy.driver.pools]
    names += sorted({s.pool for s in sagas if s.pool is not None} - set(names))
    if not names:
        return ()
    found = []
    for name in (None, *names):
        members = [s for s in sagas if s.pool == name]
        try:
            versions = {str(c): t.version for c, t in desired_targets(policy, name).items()}
        except KeyError:
            versions = {}  # a pool the policy dropped: its sagas under way finish
        found.append(
            PoolProgress(
                name=name or DEFAULT_POOL,
                total=len(members),
                done=sum(s.state is UpgradeState.UPGRADE_DONE for s in members),
                failed=sum(s.state is UpgradeState.UPGRADE_FAILED for s in members),
                skipped=sum(s.node in skipped for s in members),
                versions=versions,
            )
        )
    return tuple(found)


def finally_failed(saga: NodeSaga) -> bool:
    """In upgrade-failed with no retry scheduled."""
    return saga.state is UpgradeState.UPGRADE_FAILED and saga.retry_at is None


class RolloutReporter:
    """Publishes one rollout's public events as its sagas move."""

    def __init__(self, bus: Bus) -> None:
        self._publisher = Publisher(bus)
        self._reported: dict[str, dict[UpgradeState, int]] = {}
        self._skipped: dict[str, int] = {}
        self._started: dict[str, datetime] = {}
        self._announced: set[str] = set()
        """Rollouts whose `RolloutStarted` this reporter published: once each, since the
        server drops a repeat only within its duplicate window (two minutes), and the
        controller reports at every reconcile."""
        self._current: str | None = None
        self._ended: set[str] = set()

    async def report(
        self,
        rollout_id: str,
        policy: GPUClusterPolicySpec,
        sagas: Sequence[NodeSaga],
        now: datetime,
        skipped: Collection[str] = (),
    ) -> None:
        """Publish what changed since the last report of this rollout; `skipped` names the
        nodes of `sagas` that admission leaves out (`admission.Admission.skipped`)."""
        if self._current not in (None, rollout_id):
            await self._superseded(self._current, rollout_id, now)
            self._forget_all_but(rollout_id)
        self._current = rollout_id
        self._ended.discard(rollout_id)
        if not sagas:
            return
        started = self._started.get(rollout_id)
        if started is None:  # looked for once: every reconcile reports, over every saga
            started = min((s.history[0].at if s.history else s.step_started) for s in sagas)
            self._started[rollout_id] = started
        if rollout_id not in self._announced:
            upgrade = policy.upgrade_policy
            await self._publish(
                rollout_id,
                "started",
                up.RolloutStarted(
                    rollout_id=rollout_id,
                    trigger=up.RolloutTrigger.POLICY,
                    target_versions={c: t.version for c, t in desired_targets(policy).items()},
                    total=len(sagas),
                    max_parallel_upgrades=upgrade.max_parallel_upgrades,
                    max_unavailable=upgrade.max_unavailable,
                ),
                now,
            )
            self._announced.add(rollout_id)
        current = counts(sagas)
        left_out = sum(saga.node in skipped for saga in sagas)
        if self._reported.get(rollout_id) == current and self._skipped.get(rollout_id) == left_out:
            return
        self._reported[rollout_id] = current
        self._skipped[rollout_id] = left_out
        done = current.get(UpgradeState.UPGRADE_DONE, 0)
        failed = current.get(UpgradeState.UPGRADE_FAILED, 0)
        total = len(sagas)
        progress = up.RolloutProgress(
            rollout_id=rollout_id,
            done=done,
            failed=failed,
            total=total,
            counts=current,
            skipped=left_out,
        )
        await self._publish(rollout_id, None, progress, now)  # a repeat is harmless
        if done == total:
            seconds = max((now - started).total_seconds(), 0.0)
            completed = up.RolloutCompleted(
                rollout_id=rollout_id, done=done, failed=0, total=total, duration_seconds=seconds
            )
            await self._publish(rollout_id, "completed", completed, now)
            self._ended.add(rollout_id)
        elif all(s.state is UpgradeState.UPGRADE_DONE or finally_failed(s) for s in sagas):
            failed_nodes = tuple(sorted(s.node for s in sagas if finally_failed(s)))
            rollout_failed = up.RolloutFailed(
                rollout_id=rollout_id,
                done=done,
                failed=failed,
                total=total,
                reason=up.RolloutFailureReason.NODES_FAILED,
                message=f"{len(failed_nodes)} nodes failed with no retry left",
                failed_nodes=failed_nodes[:256],
            )
            await self._publish(rollout_id, "failed", rollout_failed, now)
            self._ended.add(rollout_id)

    def _forget_all_but(self, rollout_id: str) -> None:
        """Drop what is kept of every other rollout: rollout ids never come back, and a
        leader runs through one rollout after another for as long as it leads."""
        self._reported = {r: c for r, c in self._reported.items() if r == rollout_id}
        self._skipped = {r: n for r, n in self._skipped.items() if r == rollout_id}
        self._started = {r: at for r, at in self._started.items() if r == rollout_id}
        self._announced &= {rollout_id}
        self._ended &= {rollout_id}

    async def _superseded(self, rollout_id: str, by: str, now: datetime) -> None:
        """Tell that `rollout_id`, started and not ended, gave way to `by`."""
        reported = self._reported.get(rollout_id)
        if rollout_id in self._ended or reported is None:
            return
        self._ended.add(rollout_id)
        superseded = up.RolloutFailed(
            rollout_id=rollout_id,
            done=reported.get(UpgradeState.UPGRADE_DONE, 0),
            failed=reported.get(UpgradeState.UPGRADE_FAILED, 0),
            total=sum(reported.values()),
            reason=up.RolloutFailureReason.SUPERSEDED,
            message=f"the policy asks for other versions now: {by}",
        )
        await self._publish(rollout_id, f"superseded-by-{by}", superseded, now)

    async def _publish(
        self, rollout_id: str, what: str | None, event: up.RolloutEvent, now: datetime
    ) -> None:
        await self._publisher.event(
            event,
            node=subjects.CLUSTER,
            id=ids.rollout_event(rollout_id, what) if what else None,
            correlationid=rollout_id,
            now=now,
        )
