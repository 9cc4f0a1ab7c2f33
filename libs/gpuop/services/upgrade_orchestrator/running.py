"""The runner: feeds each event of the log to the decision core, persist first, then act.

For every delivery of the intake consumer (`intake`), `Runner.handle` reads the node's saga
with its revision, takes one `folding.step` with the event and the event's recorded time
(the fold `gpuop replay` takes too), and, if the saga changed, writes it with
compare-and-set; only then does the outbox publish the commands and state changes and run
the Kubernetes actions, and the deadline scheduler arm the new step's deadline. A
`RevisionConflict` (another writer got there first) makes it read again and decide again on
the newer saga.

A decision stored is carried out even when the bus fails under its publishes: it waits in the
node's `unsettled` list until its outbox run succeeds, and every later event of the node (the
same delivery handled again included, `gpuop.bus.dispatching` calls a handler again in place
while the bus fails) carries those out first, in order, before it is decided; the reconcile
pass does too (`settle`). Deciding the delivery again would not do: the stored saga has moved
on, the event decides nothing, and the decision's state change and commands would be lost,
leaving the saga waiting for the answer to a command never sent until its step's deadline. A
handler cancelled between the two (its term ended: the subscription's stop cancels what runs
past its grace) leaves its event unacked; when the event comes back (to this leader or the
next) and decides nothing, the saga's pending step is carried out again (`resume`'s path, for
that node).

`resume` is the restart path: it rebuilds from KV and re-issues every saga's `pending()`
commands and actions with their original ids, so whatever the crash interrupted is done
once (duplicates are dropped by the server and by the agents) and the deadlines run again.

Admission is not an event of its own making: `admit` runs `admission.plan` over the stored
sagas (as the store's index holds them, the done ones only counted: `indexing`) and records
each admission as a `NodeAdmitted` event (deterministic id), which comes back through the
intake like any event, so a replay of the log admits the same nodes at the
same points, each with the components its admission lets it upgrade (fewer than its saga's when a
node skip label left some out when it was admitted), so a replay narrows the same sagas.
What admission read to decide (the nodes' readiness, cordons and skip labels) is not needed
to replay it; the node watch records it as `NodeObserved` all the same. Likewise the
policy: before deciding with a spec other than the last one it recorded, the runner
publishes `PolicyApplied` naming the event about to be decided as its cause, so a replay
decides that event and the later ones with it.

Every saga kind (`kinds.KindRunner`, one per kind of `gpuop.saga.registry.KINDS`: the
driver upgrade, GPU remediation, MIG reconfiguration) runs through this one path, none of
them named: an event is decided, under the node's lock, for the node's saga of each kind
that consumes it (`SagaKind.inbound`), in the registry's order, each kind's starting hook
given the event first (a GPU's health starts a remediation) and its `after` hook last.
`admit` admits the waiting sagas of every kind but the planned one (the runner's `store`'s,
the upgrade's: `admission.plan` weighs its rollouts) first, oldest first, under the one
`maxUnavailable` budget (`admission.cluster_budget`), then plans the planned kind's, with
every node another kind holds or reserves marked `NodeStatus.held_by`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from gpuop.bus import (
    Bus,
    BusError,
    BusUnavailable,
    Delivery,
    PublishTimeout,
    RevisionConflict,
    TemporaryError,
)
from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.events import Event, ids, subjects
from gpuop.events.driver import Component
from gpuop.events.upgrade import NodeAdmitted, PolicyApplied, UpgradeState
from gpuop.policy import GPUClusterPolicySpec
from gpuop.saga import NodeSaga, NodeStatus, admission, machine
from gpuop.saga.kinds import Output
from gpuop.saga.machine import IssuedCommand
from gpuop.services.upgrade_orchestrator import traces
from gpuop.services.upgrade_orchestrator.acting import Outbox
from gpuop.services.upgrade_orchestrator.deadlines import DeadlineScheduler
from gpuop.services.upgrade_orchestrator.kinds import KindRunner, StartRecorder, stored_id
from gpuop.services.upgrade_orchestrator.publishing import Publisher
from gpuop.services.upgrade_orchestrator.store import SagaStore
from gpuop.services.upgrade_orchestrator.upgrades import StartRecording

log = logging.getLogger(__name__)

ANNOUNCED_FOR = 60.0
"""Seconds an admission may stay undecided before the next pass admits the node again (one
was seen never to reach the intake while the event stream's leader moved, and the node
waited, holding its slot, until the end of the rollout)."""
CONFLICT_RETRIES = 8
"""Re-reads after a lost compare-and-set before the delivery is retried later."""


def admitted_event_id(saga: NodeSaga) -> str:
    """The one id of the admission of this saga's attempt."""
    return ids.admitted(saga.saga_id, saga.attempt)


class Runner:
    """Decides and acts for every node saga of every kind in the store."""

    def __init__(
        self,
        bus: Bus,
        store: SagaStore,
        outbox: Outbox,
        deadlines: DeadlineScheduler,
        policy: Callable[[], GPUClusterPolicySpec | None],
        *,
        clock: Clock = SYSTEM_CLOCK,
        on_change: Callable[[Any], None] | None = None,
        kinds: Sequence[KindRunner[Any]] = (),
    ) -> None:
        self._publish = Publisher(bus, clock)
        self._store = store
        self.upgrades: KindRunner[NodeSaga] = KindRunner(
            store.kind,
            store,
            recorded=StartRecording(StartRecorder(bus, self._publish), policy).record_start,
        )
        """The kind `admit` plans (`admission.plan`), with the store the runner was given."""
        self.kinds = tuple(kinds)
        """The other saga kinds this runner decides for, each with its store."""
        self._outbox = outbox
        self._deadlines = deadlines
        self._policy = policy
        self.policy = policy
        """The policy in force (None: none valid yet), for the kinds' starting hooks."""
        self.bus = bus
        self._clock = clock
        self._on_change = on_change
        self._announced: dict[str, tuple[int, bool, float]] = {}
        """Saga id -> (attempt, canary, `clock.monotonic()` of the publish) of admissions
        published and not yet decided, every kind's."""
        self._recorded: GPUClusterPolicySpec | None = None
        """The policy last recorded as `PolicyApplied` by this process."""
        self._locks: dict[str, asyncio.Lock] = {}
        self._unsettled: dict[str, list[tuple[KindRunner[Any], machine.Decision[Any, Any]]]] = {}
        """Node -> decisions stored whose outbox run has not succeeded yet, oldest first."""

    def runners(self) -> tuple[KindRunner[Any], ...]:
        """Every kind this runner runs, the planned one first (the registry's order)."""
        return (self.upgrades, *self.kinds)

    async def handle(self, delivery: Delivery) -> None:
        """The intake consumer's handler."""
        if isinstance(delivery.payload, Event):
            envelope = delivery.envelope
            await self.apply(
                envelope.node,
                delivery.payload,
                envelope.time,
                cause=envelope.id,
                redelivered=delivery.attempt > 1,
            )

    async def record_policy(self, policy: GPUClusterPolicySpec, cause: str | None = None) -> None:
        """Publish `PolicyApplied` when `policy` differs from the one last recorded, before
        deciding with it (`cause`: the event about to be decided), so a replay of the log
        decides with the same policy."""
        if policy is self._recorded or policy == self._recorded:  # the same object, mostly
            return
        await self._publish.event(
            PolicyApplied(spec=policy.to_wire()), node=subjects.CLUSTER, causationid=cause
        )
        self._recorded = policy

    async def apply(
        self,
        node: str,
        event: Event,
        now: datetime,
        *,
        cause: str | None = None,
        redelivered: bool = False,
    ) -> machine.Decision[Any, Any] | None:
        """Decide `event` for the node's saga of every kind at `now`, persist, then act;
        the first decision made (the registry's order), or None when the node has no saga
        the event changed. `cause` is the id of the event's envelope, recorded with a change
        of policy. A `redelivered` event that changes no saga may have been cut off between
        storing its decision and carrying it out (a term that ended under it): the saga's
        pending step is carried out again, as a takeover's `resume` does."""
        policy = self._policy()
        if policy is None:
            raise TemporaryError("no valid GPUClusterPolicy yet", delay=1.0)
        if isinstance(event, NodeAdmitted):  # decided now: it no longer holds a slot itself
            self._announced.pop(event.saga_id, None)
        await self.record_policy(policy, cause)
        started = traces.now_ns()
        runners = self.runners()
        async with self._node_lock(node):
            await self._settle(node)
            for runner in runners:
                if runner.starter is not None:
                    await runner.starter(node, event, now, cause)
            decisions = [
                await self._decide(runner, node, event, policy, now, cause, started, redelivered)
                for runner in runners
                if runner.kind.inbound(event)
            ]
            for runner in runners:
                if runner.after is not None:
                    await runner.after(node, event, now, cause)
            return next((decision for decision in decisions if decision is not None), None)

    async def _decide(
        self,
        runner: KindRunner[Any],
        node: str,
        event: Event,
        policy: GPUClusterPolicySpec,
        now: datetime,
        cause: str | None,
        started: int,
        redelivered: bool,
    ) -> machine.Decision[Any, Any] | None:
        """One fold step for the node's saga of `runner`'s kind, persisted, then acted on in
        its `decide <event>` span; read again and decided again on a lost compare-and-set."""
        kind = runner.kind
        for _ in range(CONFLICT_RETRIES):
            stored = await runner.store.get(node)
            if stored is None:
                return None
            decision = kind.step(stored.saga, event, policy, now)
            if decision is None:
                if redelivered:
                    await self._resume(runner, node)
                return None
            try:
                await runner.store.replace(decision.saga, stored.revision)
            except RevisionConflict:
                log.info("%s saga of node %s changed meanwhile; deciding again", kind.name, node)
                continue
            with traces.deciding(
                kind, stored.saga, decision, event, now=now, cause=cause, started_ns=started
            ):
                await self.act(runner, decision)
            return decision
        raise TemporaryError(f"{kind.name} saga of node {node} keeps changing", delay=0.5)

    async def act(self, runner: KindRunner[Any], decision: machine.Decision[Any, Any]) -> None:
        """Carry out a persisted decision and arm its deadline (a starting hook calls it for
        the saga it stored, under the node's lock the runner holds), after the node's
        decisions still unsettled. Raises the bus's error when a publish fails; the decision
        then stays unsettled, for the next event of the node or `settle`."""
        self._unsettled.setdefault(decision.saga.node, []).append((runner, decision))
        await self._settle(decision.saga.node)

    async def settle(self) -> None:
        """Carry out every node's unsettled decisions (the controller's reconcile pass: a node
        whose events stopped must not wait for one). A node whose bus still fails is logged
        and tried again on the next pass."""
        for node in list(self._unsettled):
            async with self._node_lock(node):
                try:
                    await self._settle(node)
                except BusError as error:
                    log.warning("decisions of node %s still not carried out: %s", node, error)

    async def _settle(self, node: str) -> None:
        waiting = self._unsettled.get(node)
        while waiting:
            runner, decision = waiting[0]
            kind = runner.kind
            outputs = kind.outputs(decision)
            try:
                await self._outbox.carry_out(decision, outputs, kind.correlation(decision.saga))
            except (PublishTimeout, BusUnavailable):
                raise  # the bus's weather: tried again by the node's next event or `settle`
            except BaseException:
                waiting.pop(0)  # anything else fails its event's handler, once, as it would
                raise
            self._deadlines.schedule(decision.saga, kind.name)
            waiting.pop(0)
            if self._on_change is not None:
                self._on_change(decision)
        self._unsettled.pop(node, None)

    async def announce(self, runner: KindRunner[Any], saga: Any) -> None:
        """Carry out what a new saga asks before anything happens to the node (an upgrade's
        state label, `upgrade-required`, as upstream shows a node that waits for its
        upgrade): its `pending` decision."""
        policy = self._policy()
        if policy is not None:
            again = runner.kind.pending(saga, policy)
            outputs = runner.kind.outputs(again)
            await self._outbox.carry_out(again, outputs, runner.kind.correlation(saga))

    def _node_lock(self, node: str) -> asyncio.Lock:
        """Held while one node's saga is read and acted on: the intake consumes before
        `resume` runs (so no outcome of a re-issued action is missed), and a resume that
        re-issued a step read before a decision the intake made meanwhile would queue that
        step's label after the decision's, leaving the node labelled with a state its saga
        left (seen in the chaos test: a done node labelled uncordon-required)."""
        return self._locks.setdefault(node, asyncio.Lock())

    async def resume(self) -> int:
        """Rebuild from KV: re-issue every saga's pending step and arm its deadline, each
        saga read again under its node's lock, kind by kind. Returns the sagas found."""
        found = 0
        for runner in self.runners():
            nodes = [stored.saga.node for stored in await runner.store.all()]
            for node in nodes:
                async with self._node_lock(node):
                    await self._resume(runner, node)
            found += len(nodes)
        return found

    async def _resume(self, runner: KindRunner[Any], node: str) -> None:
        stored = await runner.store.get(node)
        if stored is None:
            return
        kind = runner.kind
        if runner.recorded is not None:
            await runner.recorded(stored.saga)
        policy = self._policy()
        if policy is not None:
            again = kind.pending(stored.saga, policy)
            outputs = kind.outputs(again)
            if again.transitions and await self._published(node, outputs):
                outputs = [out for out in outputs if isinstance(out, IssuedCommand)]
            await self._outbox.carry_out(again, outputs, kind.correlation(stored.saga))
        self._deadlines.schedule(stored.saga, kind.name)

    async def _published(self, node: str, outputs: Sequence[Output]) -> bool:
        """Whether the last public state change among `outputs` is in the log (the outbox
        publishes a decision's state changes in order, so the earlier ones are too). The
        server drops a republished id only within its duplicate window: a takeover long
        after a saga's last decision would store its state changes twice without this."""
        events = [out for out in outputs if not isinstance(out, IssuedCommand)]
        if not events:
            return False
        last = events[-1]
        payload = last.payload
        subject = subjects.event_subject(
            payload.DOMAIN, node, payload.subject_token(), prefix=self.bus.prefix
        )
        return await stored_id(self.bus, subject) == last.id

    async def admit(
        self,
        nodes: Mapping[str, NodeStatus],
        now: datetime | None = None,
        *,
        every: Mapping[str, NodeStatus] | None = None,
    ) -> admission.Admission | None:
        """Run an admission pass and record each admission as a `NodeAdmitted` event.
        `nodes` are the nodes the planned kind (the upgrade) manages, `every` all the GPU
        nodes (default `nodes`): another kind's saga may be on a node the upgrades do not
        select."""
        policy = self._policy()
        if policy is None:
            return None
        now = now or self._clock.now()
        if self.kinds:
            nodes = await self._admit_waiting(nodes, policy, now, every or nodes)
        return await self._admit_planned(nodes, policy, now)

    async def _admit_planned(
        self, nodes: Mapping[str, NodeStatus], policy: GPUClusterPolicySpec, now: datetime
    ) -> admission.Admission:
        """`admission.plan` over the planned kind's sagas (the upgrades' rollouts)."""
        # the index, not a listing of KV: the sagas still in play are weighed, the done
        # ones counted, so a pass costs no more as nodes finish (issue 24). It holds this
        # leader's writes as they return, the only writer's; an admission of a saga that
        # moved on meanwhile is ignored when decided on the saga read from KV
        sagas = [entry.saga for entry in self._store.index.live()]
        announced = self._announced
        planned = (
            [self._as_planned(s) if s.saga_id in announced else s for s in sagas]
            if announced
            else sagas
        )
        result = admission.plan(planned, nodes, policy, now, done=self._store.index.done)
        by_node = {saga.node: saga for saga in sagas} if result.nodes else {}
        for node in result.nodes:
            canary = node in result.canary
            components = result.components.get(node, ())
            await self._admitted(self.upgrades, by_node[node], now, canary, components)
        return result

    async def _admitted(
        self,
        runner: KindRunner[Any],
        saga: Any,
        now: datetime,
        canary: bool = False,
        components: tuple[Component, ...] = (),
    ) -> None:
        """Record the admission of `saga`'s attempt as a `NodeAdmitted` (its one id)."""
        self._announced[saga.saga_id] = (saga.attempt, canary, self._clock.monotonic())
        correlation = runner.kind.correlation(saga)
        admitted = NodeAdmitted(
            rollout_id=correlation,
            saga_id=saga.saga_id,
            attempt=saga.attempt,
            canary=canary,
            components=components,
        )
        await self._publish.event(
            admitted,
            node=saga.node,
            id=admitted_event_id(saga),
            correlationid=correlation,
            traceparent=traces.current_step_traceparent(saga),
            now=now,
        )

    def held(self) -> dict[str, str]:
        """Node -> the kind whose saga holds it, or reserves it while waiting for its
        admission (as the stores' indexes know them), of every kind but the planned one."""
        held: dict[str, str] = {}
        for runner in self.kinds:
            kind = runner.kind
            for stored in runner.store.sagas():
                if kind.holds(stored.saga) or kind.waiting(stored.saga):
                    held.setdefault(stored.saga.node, kind.name)
        return held

    async def _admit_waiting(
        self,
        nodes: Mapping[str, NodeStatus],
        policy: GPUClusterPolicySpec,
        now: datetime,
        every: Mapping[str, NodeStatus],
    ) -> dict[str, NodeStatus]:
        """Admit the other kinds' waiting sagas while the one `maxUnavailable` budget
        allows (a node unavailable already costs nothing more), oldest first; returns
        `nodes` with every node a kind holds or reserves marked `held_by`, for the planned
        kind's pass."""
        waiting: list[tuple[KindRunner[Any], Any]] = []
        holding: dict[str, str] = {}
        for runner in self.kinds:
            kind = runner.kind
            for stored in runner.store.sagas():
                saga = stored.saga
                if kind.waiting(saga) and not self._pending(saga.saga_id):
                    waiting.append((runner, saga))
                elif kind.holds(saga) or kind.waiting(saga):
                    holding.setdefault(saga.node, kind.name)
        marked = {
            node: replace(status, held_by=holding.get(node, status.held_by))
            for node, status in nodes.items()
        }
        if waiting:
            # over every GPU node, not only those the upgrades select: a kind's saga may be on
            # any of them, and the budget is the cluster's
            cluster = {
                node: replace(status, held_by=holding.get(node, status.held_by))
                for node, status in {**every, **nodes}.items()
            }
            sagas = [entry.saga for entry in self._store.index.live()]
            free = admission.cluster_budget(sagas, cluster, policy.upgrade_policy).free
            waiting.sort(key=lambda pair: (pair[1].step_started, pair[1].node))
            for runner, saga in waiting:
                status = marked.get(saga.node) or every.get(saga.node)
                if status is None or not status.exists or not self._free(saga.node, holding):
                    continue
                down = not status.ready or status.unschedulable
                if not down and free <= 0:
                    continue
                if not down:
                    free -= 1
                holding[saga.node] = runner.kind.name
                await self._admitted(runner, saga, now)
        for runner in self.kinds:
            for stored in runner.store.sagas():
                saga = stored.saga
                if runner.kind.waiting(saga) and saga.node in marked:
                    marked[saga.node] = replace(marked[saga.node], held_by=runner.kind.name)
        return marked

    def _free(self, node: str, holding: Mapping[str, str]) -> bool:
        """Whether no other saga holds `node`: the planned kind's (the node's upgrade,
        admitted and not ended: the kind waits for its end), nor another kind's (one saga
        at a time)."""
        planned = self.upgrades
        stored = planned.store.cached(node)
        if stored is not None and planned.kind.holds(stored.saga):
            return False
        return node not in holding

    def _pending(self, saga_id: str) -> bool:
        """Whether an admission of the saga was published and not decided yet, less than
        `ANNOUNCED_FOR` ago (an older one is forgotten: the saga is admitted again)."""
        announced = self._announced.get(saga_id)
        if announced is None:
            return False
        if self._clock.monotonic() - announced[2] > ANNOUNCED_FOR:
            del self._announced[saga_id]
            return False
        return True

    def _as_planned(self, saga: NodeSaga) -> NodeSaga:
        """An admitted saga whose admission the intake has not decided yet holds its slot."""
        announced = self._announced.get(saga.saga_id)
        if saga.state is not UpgradeState.UPGRADE_REQUIRED or announced is None:
            return saga
        attempt, canary, at = announced
        if attempt != saga.attempt:
            return saga
        if self._clock.monotonic() - at > ANNOUNCED_FOR:
            # never decided: the admission is published again (the same id, so a copy the
            # log does hold is dropped as a duplicate, or decided once and then ignored)
            # rather than the node holding its slot, and waiting, for ever
            log.warning(
                "the admission of %s was not decided within %.0f s; admitting it again",
                saga.saga_id,
                ANNOUNCED_FOR,
                extra={"node": saga.node},
            )
            del self._announced[saga.saga_id]
            return saga
        return saga.model_copy(
            update={"state": UpgradeState.CORDON_REQUIRED, "canary": canary or saga.canary}
        )
