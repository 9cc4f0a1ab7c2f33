"""The leader's work: start rollouts, admit nodes, report progress, keep the sagas moving.

`Controller.run` runs while this replica holds the Lease. It watches the GPUClusterPolicy
(`policies`), the GPU nodes (`observing`) and the sagas' bucket (the store's index, rebuilt
from KV first: `indexing`), starts consuming the event log (`intake`) into the runner, and
rebuilds from KV, re-issuing every saga's pending step (`Runner.resume`). The reconcile
reads the sagas from the index, never by listing KV.
Whenever something changed (a decision, a node, the policy) and at least every
`resync_seconds`, `reconcile`:

1. creates a saga (`new_saga`, in the rollout of the desired versions: `current_rollout`,
   recorded in the policy's status so every replica uses the same id) for each GPU
   node the policy's `nodeSelector` selects that needs one (`start_reason`, from its
   inventory in KV `gpuop_nodes`): its running versions differ from the policy's
   (`version-change`), or it runs no GPU driver (`no-driver`; `kernel-drift` when its last
   saga was done on another kernel than the one it runs now), unless the node's saga of an
   earlier rollout is still running. A node whose saga of this rollout is done gets a
   second one (`reinstall_saga_id`) only when its driver is gone. A node without a driver
   and without GPU pods is brought up (`bring_up`): no upgrade slot, behind the taint
   `gpuop.io/driver-not-ready:NoSchedule` instead of a cordon. The saga is recorded as a
   `SagaStarted` event with its reason (after the policy, as `PolicyApplied`), so `gpuop
   replay` can build the same saga from the log. A saga of an earlier rollout that was
   never admitted (nothing was done to the node) is replaced;
2. runs the admission pass over the selected nodes and those whose saga is under way (it
   admits nothing while the policy is paused), which records admissions as events, and
   watches the pods of the nodes whose saga waits for jobs, deletes pods or drains (`jobs`,
   one informer per node, shared with the executor's drains: `nodepods`; the pods that
   hold a node's GPUs through ResourceClaims of any driver, from the claim facts on the
   bus, `gpuop.inventory.claims.follow_all`);
3. publishes the rollout's events and writes the policy's status (conditions, counts, and
   how many nodes the admission pass leaves out: skip labels, `cordonedNodes: skip`).

Cancelling `run` (leadership lost, service stopping) stops everything it started; the next
leader continues from KV and the durable consumer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

from gpuop.bus import Buckets, Bus, KeyExists, KeyValue, RevisionConflict
from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.events import hardware, ids, subjects
from gpuop.events.driver import Component, Flavour
from gpuop.events.upgrade import TERMINAL_STATES, SagaReason, UpgradeState
from gpuop.inventory import claims
from gpuop.kube import client, pods
from gpuop.kube.errors import KubeError
from gpuop.kube.recording import EventRecorder
from gpuop.policy import ConditionType, GPUClusterPolicySpec, condition, flavours, selectors
from gpuop.policy.conditions import Condition, RolloutRecord
from gpuop.saga import Decision, NodeSaga, new_saga
from gpuop.saga.upgrade import folding
from gpuop.saga.upgrade.records import parameters_loaded_by, reinstall_saga_id, start_reason
from gpuop.services.upgrade_orchestrator import device_apis, intake, jobs, migs, remediations
from gpuop.services.upgrade_orchestrator.acting import Outbox
from gpuop.services.upgrade_orchestrator.config import OrchestratorConfig
from gpuop.services.upgrade_orchestrator.deadlines import DeadlineScheduler
from gpuop.services.upgrade_orchestrator.executing import KubeExecutor
from gpuop.services.upgrade_orchestrator.kinds import KindRunner, is_a_node
from gpuop.services.upgrade_orchestrator.observing import NodeWatcher
from gpuop.services.upgrade_orchestrator.policies import PolicyWatcher
from gpuop.services.upgrade_orchestrator.publishing import Publisher
from gpuop.services.upgrade_orchestrator.rollouts import (
    RolloutReporter,
    counts,
    current_rollout,
    pool_progress,
)
from gpuop.services.upgrade_orchestrator.running import Runner
from gpuop.services.upgrade_orchestrator.stalls import StallWatch
from gpuop.services.upgrade_orchestrator.store import SagaStore

log = logging.getLogger(__name__)

WATCHER_STOP_SECONDS = 5.0
"""How long a leader that stops waits for its cancelled watches before it goes on."""

COMPONENT = "gpuop-upgrade-orchestrator"
"""The reporting component of the Kubernetes Events it records."""


def _raise_if_cancelled() -> None:
    """Stop for a cancel that a library swallowed: on Python 3.11 a cancel that arrives as
    an `asyncio.timeout` expires (the Kubernetes client's and the bus's request timeouts)
    comes out as a timeout error, which the reconcile logs and carries on from."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _under_way(saga: NodeSaga) -> bool:
    """Admitted and not ended: the node is in its maintenance window."""
    return saga.state not in TERMINAL_STATES and saga.state is not UpgradeState.UPGRADE_REQUIRED


def _waiting_untouched(saga: NodeSaga) -> bool:
    """Waiting for admission with the node as gpuop found it: a newer rollout may take its
    place, as it never started."""
    untouched = not (saga.cordoned or saga.touched or saga.operands_paused)
    return saga.state is UpgradeState.UPGRADE_REQUIRED and untouched


class Controller:
    """Everything the leader runs, wired together."""

    def __init__(
        self,
        bus: Bus,
        kube: client.Kube,
        config: OrchestratorConfig,
        *,
        clock: Clock = SYSTEM_CLOCK,
        has_gpu_pods: Callable[[str], Awaitable[bool]] | None = None,
    ) -> None:
        self._bus = bus
        self._has_gpu_pods = has_gpu_pods or self._gpu_pods_listed
        """Whether GPU pods run on a node: a list through the API server, or the test's."""
        self._publish = Publisher(bus, clock)
        self._kube = kube
        self._config = config
        self._clock = clock
        self._wake = asyncio.Event()
        self.policies = PolicyWatcher(kube, on_change=self._wake.set, clock=clock)
        self.nodes = NodeWatcher(bus, kube, on_change=self._wake.set, clock=clock)
        self.pod_watches = jobs.PodWatches(bus, kube, clock=clock)
        self._reporter = RolloutReporter(bus)
        self._resumed = False
        self._runner: Runner | None = None
        self._remediations: remediations.Starter | None = None
        self._switches: device_apis.Starter | None = None
        self._stalls: StallWatch | None = None

    async def kind_runners(
        self, runner: Runner, store: SagaStore, inventories: KeyValue
    ) -> list[KindRunner[Any]]:
        """The kinds the runner runs beside the one it plans (the driver upgrade, whose
        sagas this controller starts: `runner.upgrades`), each with its store and the
        starter whose hooks start its sagas (`kinds.KindRunner`); `store` holds the upgrades
        (a remediation may fold into the node's upgrade), `inventories` the nodes'."""
        store_ = await SagaStore.open(self._bus, remediations.REMEDIATION)
        await store_.load()  # the breaker counts the starts before the intake's first event
        self._remediations = remediations.Starter(
            runner, store, store_, inventories, clock=self._clock, known=self._watched
        )
        migs_ = await SagaStore.open(self._bus, migs.MIG_RECONFIGURATION)
        reconfigurations = migs.Starter(
            runner, migs_, inventories, kube=self._kube,
            namespace=self._config.lease_namespace, clock=self._clock, known=self._watched,
        )  # fmt: skip
        switching = await SagaStore.open(self._bus, device_apis.DEVICE_API_SWITCH)
        await switching.load()  # what ran before: a failed switch is not started again
        self._switches = switches = device_apis.Starter(
            runner, switching,
            labels=lambda node: self.nodes.labels.get(node, {}), clock=self._clock,
            known=self._watched,
        )  # fmt: skip
        return [self._remediations.runner(), reconfigurations.runner(), switches.runner()]

    def _watched(self, node: str) -> bool:
        """Whether `node` is a GPU node the node watch knows (before its first listing is
        in: any node at all), for the kinds' starters."""
        if not self.nodes.synced:
            return is_a_node(node)
        return node in self.nodes.statuses

    def _decided(self, decision: Decision) -> None:
        self._wake.set()

    async def run(self) -> None:
        """Lead until cancelled."""
        store = await SagaStore.open(self._bus)
        # the index admission reads, rebuilt from KV: the last leader's writes are in KV only
        log.info("indexed %d sagas from KV", await store.load())
        inventories = await self._bus.kv(Buckets.NODES)
        recorder = EventRecorder(
            self._kube, component=COMPONENT, namespace=self._config.event_namespace,
            clock=self._clock,
        )  # fmt: skip
        node_claims = claims.NodeClaims()
        executor = KubeExecutor(
            self._kube, recorder, watched_node=self.nodes.node,
            node_pods=self.pod_watches.node_pods,
            # the validation pod's default namespace: the orchestrator's own (the release's)
            own_namespace=self._config.lease_namespace,
            claims=node_claims,
            served=lambda node: device_apis.served(self._bus, node),
        )  # fmt: skip
        outbox = Outbox(self._bus, executor, clock=self._clock)
        deadlines = DeadlineScheduler(self._bus, clock=self._clock)
        self._stalls = StallWatch(recorder, deadlines)
        runner = Runner(
            self._bus, store, outbox, deadlines, lambda: self.policies.in_force,
            clock=self._clock, on_change=self._decided,
        )  # fmt: skip
        runner.kinds = tuple(await self.kind_runners(runner, store, inventories))
        self._runner = runner
        watchers = [
            asyncio.create_task(self.policies.run(), name="policy-watch"),
            asyncio.create_task(self.nodes.run(), name="node-watch"),
            asyncio.create_task(store.follow(clock=self._clock), name="saga-watch"),
            asyncio.create_task(claims.follow_all(self._bus, node_claims), name="claims-read"),
        ]
        subscription = None
        try:
            while True:
                await self._woken_or_resync()
                self._wake.clear()
                _raise_if_cancelled()
                for task in watchers:
                    if task.done():
                        task.result()  # a watcher that died takes the leader down with it
                if self.policies.in_force is None:
                    continue
                if not self._resumed:
                    # consume first, so outcomes of the re-issued actions are not missed
                    ack_wait = self._config.lease_duration_seconds
                    subscription = await intake.start(self._bus, runner, ack_wait=ack_wait)
                    # results the dead leader held come back within the ack wait: no
                    # deadline overtakes them (`deadlines`)
                    deadlines.hold_until(self._clock.now() + timedelta(seconds=ack_wait))
                    found = await runner.resume()
                    log.info("took over %d sagas from KV", found)
                    self._resumed = True
                await self.reconcile(store, inventories, runner, deadlines)
        finally:
            if subscription is not None:
                await subscription.stop()
            for task in watchers:
                task.cancel()
            # a watch blocked in a read may take long to see its cancellation; the next
            # controller must not wait for it (a stuck one was seen to hold it five minutes)
            _, stuck = await asyncio.wait(watchers, timeout=WATCHER_STOP_SECONDS)
            for task in stuck:
                log.warning(
                    "%s did not stop within %.0f s; leaving it",
                    task.get_name(),
                    WATCHER_STOP_SECONDS,
                )
            await self.pod_watches.close()
            await outbox.close()
            await deadlines.close()

    async def _woken_or_resync(self) -> None:
        # asyncio.wait, not asyncio.timeout, for the reason `_raise_if_cancelled` gives
        waiter = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait([waiter], timeout=self._config.resync_seconds)
        finally:
            waiter.cancel()
            await asyncio.gather(waiter, return_exceptions=True)

    async def reconcile(
        self, store: SagaStore, inventories: KeyValue, runner: Runner, deadlines: DeadlineScheduler
    ) -> None:
        """Start sagas, admit nodes, report progress (see the module docstring)."""
        await runner.settle()  # decisions stored whose publishes the bus failed
        spec = self.policies.spec
        if spec is None or not self.nodes.synced:
            return
        rollout = current_rollout(spec, self.policies.rollout, self.policies.generation)
        rollout_id = rollout.id
        await runner.record_policy(spec)  # the policy the new sagas are built from
        now = self._clock.now()
        selected = self._selected(spec)
        # a node's saga under way keeps its slot even when the selector no longer picks it
        under_way = {e.saga.node for e in store.index.live() if _under_way(e.saga)}
        for node in selected:
            started = await self._start_saga(node, spec, rollout_id, store, inventories, now)
            if started is not None:
                await runner.announce(runner.upgrades, started)
                deadlines.schedule(started)
        managed = {
            node: status
            for node, status in self.nodes.statuses.items()
            if node in selected or node in under_way
        }
        planned = await runner.admit(managed, now, every=self.nodes.statuses)
        entries = store.sagas()
        all_sagas = [e.saga for e in entries]
        self.pod_watches.follow(all_sagas, spec.upgrade_policy.wait_for_completion.pod_selector)
        sagas = [
            entry.saga
            for entry in entries
            if entry.saga.rollout_id == rollout_id and entry.saga.node in managed
        ]
        skipped = frozenset(planned.skipped) if planned is not None else frozenset()
        skipped &= {saga.node for saga in sagas if saga.state is UpgradeState.UPGRADE_REQUIRED}
        await self._reporter.report(rollout_id, spec, sagas, now, skipped)
        stalled = None
        if self._stalls is not None:
            stalled = await self._stalls.check([s for s in sagas if _under_way(s)], now)
        await self._write_status(sagas, spec, rollout, now, skipped, stalled)
        if self._switches is not None:  # last: nodes whose deviceAPI the policy changed
            await self._switches.reconcile(self.nodes.labels, now)

    def _selected(self, spec: GPUClusterPolicySpec) -> list[str]:
        """The GPU nodes the policy's `nodeSelector` selects, by name."""
        selector = spec.upgrade_policy.node_selector
        return sorted(
            node
            for node in self.nodes.statuses
            if selectors.matches(selector, self.nodes.labels.get(node, {}))
        )

    async def _start_saga(
        self,
        node: str,
        spec: GPUClusterPolicySpec,
        rollout_id: str,
        store: SagaStore,
        inventories: KeyValue,
        now: datetime,
    ) -> NodeSaga | None:
        stored = store.cached(node)  # stale at worst: the write below then conflicts
        found = spec.driver.pool_for(self.nodes.labels.get(node, {}))
        pool = found.name if found is not None else None
        again = (
            stored is not None
            and stored.saga.rollout_id == rollout_id
            and stored.saga.state is UpgradeState.UPGRADE_DONE
        )  # done in this rollout: started again only for a driver that is gone (below)
        if (
            stored is not None
            and stored.saga.rollout_id == rollout_id
            and not again
            and (stored.saga.pool == pool or not _waiting_untouched(stored.saga))
        ):
            return None  # the same saga; or a node that moved pools finishes its window first
        if (
            stored is not None
            and stored.saga.state not in TERMINAL_STATES
            and not _waiting_untouched(stored.saga)
        ):
            return None  # the earlier rollout's saga finishes its maintenance window first
        entry = await inventories.get(subjects.encode_node(node))
        if entry is None:
            return None  # discovery has not reported the node yet
        inventory = hardware.HardwareDiscovered.model_validate_json(entry.value)
        if stored is not None and again and not self._news(stored.saga, node, inventory):
            return None
        running = {Component.GPU: inventory.driver_version, Component.OFED: inventory.ofed_version}
        last = stored.saga if stored is not None else None
        flavour, running_flavour = gpu_flavours(spec, pool, inventory)
        running_parameters = parameters_loaded_by(last)
        reason = start_reason(
            spec, running, inventory.kernel_release, last, pool,
            flavour=flavour, running_flavour=running_flavour,
            running_parameters=running_parameters,
        )  # fmt: skip
        if reason is None or (again and reason is SagaReason.VERSION_CHANGE):
            return None
        bring_up = reason is not SagaReason.VERSION_CHANGE and not await self._has_gpu_pods(node)
        unschedulable = self.nodes.statuses[node].unschedulable
        saga = new_saga(
            node=node,
            rollout_id=rollout_id,
            policy=spec,
            running=running,
            now=now,
            boot_id=inventory.boot_id,
            unschedulable=unschedulable,
            operands=self._config.operands,
            pool=pool,
            reason=reason,
            bring_up=bring_up,
            kernel_release=inventory.kernel_release,
            saga_id=reinstall_saga_id(rollout_id, node, reason, now) if again else None,
            flavour=flavour,
            running_flavour=running_flavour,
            running_parameters=running_parameters,
        )
        try:
            if stored is None:
                await store.create(saga)
            else:
                await store.replace(saga, stored.revision)
        except (KeyExists, RevisionConflict):
            return None  # written meanwhile (the store read it again); the next pass looks again
        started = folding.start_of(saga, running)
        await self._publish.event(
            started, node=node, id=ids.started(saga.saga_id), correlationid=rollout_id, now=now
        )
        joins = rollout_id if pool is None else f"{rollout_id} (driver pool {pool})"
        how = ", brought up without a slot" if bring_up else ""
        log.info("node %s joins %s (%s%s)", node, joins, reason, how, extra={"node": node})
        return saga

    def _news(self, done: NodeSaga, node: str, inventory: hardware.HardwareDiscovered) -> bool:
        """Whether `inventory` may start a reinstall after `done`: not one the saga saw
        (taken while it reloaded the driver), nor a driver another saga kind unloaded."""
        seen = inventory.inventory_hash == done.inventory_hash
        held = self._runner is not None and node in self._runner.held()
        return not seen and self.nodes.statuses[node].held_by is None and not held

    async def _gpu_pods_listed(self, node: str) -> bool:
        """Whether GPU pods run on (or wait for) the node: one list, for a node without a
        driver only. Unknown (the API failing) counts as yes: the node then takes the
        upgrade path, which moves its pods, rather than being brought up under them."""
        try:
            return bool(await pods.gpu_pods_on(self._kube, node))
        except KubeError as error:
            log.warning("cannot list the pods of %s: %s", node, error, extra={"node": node})
            return True

    async def _write_status(
        self,
        sagas: list[NodeSaga],
        spec: GPUClusterPolicySpec,
        rollout: RolloutRecord,
        now: datetime,
        skipped: frozenset[str] = frozenset(),
        stalled: Condition | None = None,
    ) -> None:
        current = counts(sagas)
        done = current.get(UpgradeState.UPGRADE_DONE, 0)
        ended = all(saga.state in TERMINAL_STATES for saga in sagas)
        waiting_on_skipped = bool(skipped) and all(
            saga.state in TERMINAL_STATES or saga.node in skipped for saga in sagas
        )
        generation = self.policies.generation
        upgraded = f"{done} of {len(sagas)} nodes upgraded"
        if skipped:
            upgraded += f", {len(skipped)} skipped"
        if ended:
            progressing = condition(
                ConditionType.PROGRESSING, False, "RolloutEnded", upgraded,
                now=now, observed_generation=generation,
            )  # fmt: skip
        elif waiting_on_skipped:
            # nothing moves until a skip label goes or a node is uncordoned
            progressing = condition(
                ConditionType.PROGRESSING, False, "NodesSkipped",
                f"{upgraded}: the skipped nodes wait for their skip label to be removed "
                "(or, with cordonedNodes: skip, to be uncordoned)",
                now=now, observed_generation=generation,
            )  # fmt: skip
        elif spec.upgrade_policy.paused:
            # as a paused Deployment says it: whether it progresses is up to the operator
            finishing = sum(_under_way(saga) for saga in sagas)
            progressing = condition(
                ConditionType.PROGRESSING, "Unknown", "RolloutPaused",
                f"paused (upgradePolicy.paused): {upgraded}, {finishing} finishing their "
                "upgrade, no other node is started until `gpuop upgrade resume`",
                now=now, observed_generation=generation,
            )  # fmt: skip
        elif not _in_a_window(spec, now):
            finishing = sum(_under_way(saga) for saga in sagas)
            progressing = condition(
                ConditionType.PROGRESSING, "Unknown", "OutsideMaintenanceWindow",
                f"no maintenance window is open (upgradePolicy.maintenanceWindows): {upgraded}, "
                f"{finishing} finishing their upgrade, the others wait for the next window",
                now=now, observed_generation=generation,
            )  # fmt: skip
        else:
            progressing = condition(
                ConditionType.PROGRESSING, True, "RolloutInProgress", upgraded,
                now=now, observed_generation=generation,
            )  # fmt: skip
        ready = condition(
            ConditionType.READY,
            done == len(sagas),
            "DriversCurrent" if done == len(sagas) else "DriversOutdated",
            f"{done} of {len(sagas)} nodes run the desired drivers",
            now=now,
            observed_generation=generation,
        )
        breaker = () if self._remediations is None else (self._remediations.condition(spec, now),)
        await self.policies.write_status(
            progressing,
            ready,
            *breaker,
            *(() if stalled is None else (stalled,)),
            nodes=current,
            rollout=rollout,
            skipped=len(skipped),
            pools=pool_progress(sagas, spec, skipped),
            upgraded=f"{done}/{len(sagas)}",
        )


def gpu_flavours(
    spec: GPUClusterPolicySpec, pool: str | None, inventory: hardware.HardwareDiscovered
) -> tuple[Flavour, Flavour | None]:
    """The GPU driver's kernel modules the policy wants on a node of `pool` (its
    `kernelModuleType` resolved from the node's inventory and the version: `flavours`), and
    those the node runs (None: no driver, or a discovery that does not say). A difference
    is a reload, as a version change is (`start_reason`)."""
    gpu, _ = spec.driver.components_of(pool)
    resolved = flavours.resolve(gpu.kernel_module_type, inventory, gpu.version)
    return resolved.flavour, inventory.driver_flavour


def _in_a_window(spec: GPUClusterPolicySpec, now: datetime) -> bool:
    """Whether nodes may be admitted at `now` (no windows: always)."""
    windows = spec.upgrade_policy.maintenance_windows
    return not windows or any(window.contains(now) for window in windows)
