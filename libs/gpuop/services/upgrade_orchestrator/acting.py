"""The outbox: what the runner does once a decision's saga is safely in KV.

`Outbox.carry_out` publishes a decision of any kind: one public state change per transition
(the upgrade's `NodeUpgradeStateChanged`, ...), then the node-agent commands, each under its
deterministic id as the kind names them (`SagaKind.outputs`; a re-publish after a crash is
dropped by the server's duplicate window and by the agents), and hands its Kubernetes
actions to the node's action queue, the same for every kind, so the actions of two kinds on
one node run one after the other, in the order decided.

Each node write costs the API server a request, so the queue gets fewer than the core asks
for (`node_writes`): of the state labels of a decision that passed through states only the
last, since the others would be overwritten at once (upstream, too, writes one label per
reconcile); and when the decision also cordons or uncordons, that label goes into the same
PATCH (`Cordon.label`), which runs in the label's place, before the decision's Event.

Kubernetes actions of one node run in order, in a background task per node, because a
drain can take minutes and the event intake must not wait for it; each outcome is published
as an event (id derived from the action's id), and the core learns of it from the log. An
action already running (re-issued by `pending` after a restart while the first execution
is still going) is not started twice. A temporary API failure is retried a few times; if it
persists the step's deadline fails the saga, so nothing waits forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

from gpuop.bus import Bus
from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.events import ids
from gpuop.kube import errors
from gpuop.saga import machine
from gpuop.saga.actions import Cordon, SetStateLabel, Uncordon
from gpuop.saga.kinds import Output
from gpuop.saga.machine import IssuedCommand, SagaRecord
from gpuop.services.upgrade_orchestrator import traces
from gpuop.services.upgrade_orchestrator.executing import KubeActions
from gpuop.services.upgrade_orchestrator.publishing import Publisher

log = logging.getLogger(__name__)

_Queued = tuple[str, Any, str | None]
"""A queued Kubernetes action: saga id, action, traceparent of the step that issued it."""


def outcome_event_id(action: Any) -> str:
    """Id of the event reporting how `action` ended: one per action, so a repeat dedupes."""
    return ids.outcome(action.id)


def node_writes(kube_actions: Sequence[Any]) -> tuple[Any, ...]:
    """A decision's Kubernetes actions as they are run: its last state label only, written
    by its cordon or uncordon when it has one (in the label's place), the rest in order."""
    labels = [a for a in kube_actions if isinstance(a, SetStateLabel)]
    if not labels:
        return tuple(kube_actions)
    last = labels[-1]
    carrier = next((a for a in kube_actions if isinstance(a, Cordon | Uncordon)), None)
    kept: list[Any] = []
    for action in kube_actions:
        if action is last:
            kept.append(last if carrier is None else dataclasses.replace(carrier, label=last.value))
        elif not isinstance(action, SetStateLabel) and action is not carrier:
            kept.append(action)
    return tuple(kept)


class Outbox:
    """Publishes a persisted decision's messages and runs its Kubernetes actions."""

    def __init__(
        self,
        bus: Bus,
        kube_actions: KubeActions,
        *,
        clock: Clock = SYSTEM_CLOCK,
        retries: int = 5,
        retry_delay: float = 1.0,
    ) -> None:
        self._publish = Publisher(bus, clock)
        self._kube_actions = kube_actions
        self._clock = clock
        self._retries = retries
        self._retry_delay = retry_delay
        self._queues: dict[str, asyncio.Queue[_Queued]] = {}
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._in_flight: set[str] = set()
        """Ids of the actions queued or running."""

    async def carry_out(
        self, decision: machine.Decision[Any, Any], outputs: Sequence[Output], correlation: str
    ) -> None:
        """Publish the decision's `outputs` (its kind's `SagaKind.outputs`: the state changes,
        then the commands), its public events under `correlation`, then queue its Kubernetes
        actions. The public state changes go first: nothing that could lead to the node's
        next decision (an agent's answer, an action's outcome) exists before them, so a
        leader that dies midway leaves them in the saga's `last_transitions` for its
        successor's `resume`, not overwritten by a later decision."""
        saga: SagaRecord[Any] = decision.saga
        traced = traces.recording()
        for out in outputs:
            if not isinstance(out, IssuedCommand):
                await self._publish.event(
                    out.payload, node=saga.node, id=out.id, correlationid=correlation
                )
                continue
            await self._publish.command(
                out.payload,
                node=saga.node,
                id=out.id,
                correlationid=saga.saga_id,
                traceparent=traces.step_traceparent(saga.saga_id, out.attempt, out.step)
                if traced
                else None,
            )
        for action in node_writes(decision.kube_actions):
            self._queue(saga, action, traced=traced)

    def _queue(self, saga: SagaRecord[Any], action: Any, *, traced: bool) -> None:
        if action.id in self._in_flight:
            return
        self._in_flight.add(action.id)
        queue = self._queues.setdefault(saga.node, asyncio.Queue())
        traceparent = traces.current_step_traceparent(saga) if traced else None
        queue.put_nowait((saga.saga_id, action, traceparent))
        if saga.node not in self._workers or self._workers[saga.node].done():
            self._workers[saga.node] = asyncio.create_task(
                self._work(saga.node, queue), name=f"kube-actions-{saga.node}"
            )

    async def _work(self, node: str, queue: asyncio.Queue[_Queued]) -> None:
        while not queue.empty():
            saga_id, action, traceparent = queue.get_nowait()
            try:
                with traces.acting(node, action, traceparent):
                    await self._execute(node, saga_id, action)
            except Exception:
                # the step's deadline or the next leader's re-issue picks the action up again
                log.exception("%s on node %s failed", type(action).__name__, node)
            finally:
                self._in_flight.discard(action.id)
        # nothing awaited since the queue was found empty, so no action is left behind: the
        # node's next action starts a new worker, and a node at rest holds no memory here
        del self._queues[node], self._workers[node]

    async def _execute(self, node: str, saga_id: str, action: Any) -> None:
        for attempt in range(1, self._retries + 1):
            try:
                outcome = await self._kube_actions.execute(node, action)
            except errors.KubeError as error:
                if not error.temporary or attempt == self._retries:
                    log.warning(
                        "%s on node %s failed: %s", type(action).__name__, node, error,
                        extra={"node": node},
                    )  # fmt: skip
                    return
                await self._clock.sleep(self._retry_delay * attempt)
                continue
            if outcome is not None:
                await self._publish.event(
                    outcome,
                    node=node,
                    id=outcome_event_id(action),
                    correlationid=saga_id,
                    causationid=action.id,
                )
            return

    async def idle(self) -> None:
        """Wait until every queued Kubernetes action has run."""
        while running := [task for task in self._workers.values() if not task.done()]:
            await asyncio.gather(*running, return_exceptions=True)

    async def close(self) -> None:
        """Stop running actions (an interrupted one is re-issued by the next leader)."""
        workers = list(self._workers.values())
        for task in workers:
            task.cancel()
        for task in workers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._workers.clear()
        self._queues.clear()
