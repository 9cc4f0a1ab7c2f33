"""Deadlines fire as events: `DeadlineExpired` published into the log when a saga's pending
step runs out of time.

The runner calls `schedule` with every saga it persisted or rebuilt; the scheduler keeps one
timer per node and saga kind (a newer saga replaces the node's timer of its kind: a node may
be in an upgrade and a remediation at once) and, when the deadline passes,
publishes `core.deadline_event(saga)` under an id derived from the saga, state, step and
attempt, so two replicas or a restarted process firing the same deadline store it once.
The core ignores a deadline whose step has since finished, so a timer that fires late is
harmless. Time comes from the one clock.

A new leader holds every deadline until `hold_until` (the controller passes its takeover time
plus the intake's ack wait): a step's result that the dead leader had fetched but not acked is
only handed out again after that wait, and a deadline published sooner would come before it
in the log and fail a step that had in fact ended in time. Seen in the chaos test: a
validation that passed, failed by a deadline that the successor fired at once on takeover.

An expiry the bus does not take (a server lost, its streams between leaders for longer than
the publish's own retries) is tried again every `PUBLISH_RETRY_SECONDS` until it is stored:
a timer that gave up would leave its node waiting on nothing, for ever. `unbounded` names
the sagas no timer bounds, which the orchestrator reports (`stalls`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from gpuop.bus import Bus, BusError
from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.events import ids
from gpuop.events.deadlines import DeadlineExpired
from gpuop.saga.machine import SagaRecord, deadline_event
from gpuop.saga.upgrade.kind import NAME as UPGRADE
from gpuop.services.upgrade_orchestrator import traces
from gpuop.services.upgrade_orchestrator.publishing import Publisher

log = logging.getLogger(__name__)


PUBLISH_RETRY_SECONDS = 5.0
"""Seconds between tries of a deadline's expiry that the bus did not take."""

_Step = tuple[str, str, str, int]
"""What names a deadline (`deadline_event_id`): saga id, state, step token, attempt."""


def _pending_step(saga: SagaRecord[Any]) -> _Step | None:
    """The saga's pending step, if it has a deadline: what its `DeadlineExpired` is named
    after, found without building it."""
    if saga.deadline is None:
        return None
    return (saga.saga_id, f"{saga.state}", saga.step.token, saga.attempt)


def deadline_event_id(expired: DeadlineExpired) -> str:
    """The one id of this deadline's expiry, whoever publishes it."""
    return ids.deadline(expired.saga_id, f"{expired.state}", expired.step, expired.attempt)


class DeadlineScheduler:
    """One timer per node, for the deadline of its saga's pending step."""

    def __init__(self, bus: Bus, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self._publish = Publisher(bus, clock)
        self._clock = clock
        self._timers: dict[tuple[str, str], tuple[_Step, asyncio.Task[None], SagaRecord[Any]]]
        self._timers = {}
        """(Node, kind) -> (the pending step whose deadline is armed, its timer, the saga)."""
        self._held_until: datetime | None = None
        self._fired: dict[tuple[str, str], _Step] = {}
        """(Node, kind) -> the step whose expiry this scheduler stored last."""

    def hold_until(self, moment: datetime) -> None:
        """Fire no deadline before `moment`, however long ago it passed (see the module
        docstring); timers armed from here on wait for it."""
        self._held_until = moment

    def schedule(self, saga: SagaRecord[Any], kind: str = UPGRADE) -> None:
        """Fire the saga's deadline when it passes (a saga of any `kind`); forget the node's
        earlier one of that kind. Called with every decision, so the `DeadlineExpired` and
        its id are only made when the timer fires: the pending step names the deadline well
        enough to tell a new one from the one armed."""
        key = _pending_step(saga)
        slot = (saga.node, kind)
        current = self._timers.get(slot)
        if current is not None and current[0] == key and not current[1].done():
            return
        self.cancel(saga.node, kind)
        if key is None:
            return
        task = asyncio.create_task(self._fire(saga, kind), name=f"deadline-{saga.node}-{kind}")
        self._timers[slot] = (key, task, saga)

    def cancel(self, node: str, kind: str = UPGRADE) -> None:
        """Drop the node's timer of `kind`."""
        current = self._timers.pop((node, kind), None)
        if current is not None:
            current[1].cancel()

    async def _fire(self, saga: SagaRecord[Any], kind: str) -> None:
        due = saga.deadline
        if due is None:
            return
        if self._held_until is not None and self._held_until > due:
            due = self._held_until
        delay = (due - self._clock.now()).total_seconds()
        if delay > 0:
            await self._clock.sleep(delay)
        expired = deadline_event(saga)  # made only now: nearly every timer is replaced first
        if expired is None:
            return
        node = saga.node
        log.info("deadline of %s (%s) passed on node %s", expired.step, expired.state, node)
        while True:
            try:
                await self._publish.event(
                    expired,
                    node=node,
                    id=deadline_event_id(expired),
                    correlationid=expired.saga_id,
                    traceparent=traces.step_traceparent(
                        expired.saga_id, expired.attempt, expired.step
                    ),
                )
            except BusError as error:
                log.warning(
                    "cannot publish the deadline of %s on node %s, trying again in %.0f s: %s",
                    expired.step, node, PUBLISH_RETRY_SECONDS, error, extra={"node": node},
                )  # fmt: skip
                await self._clock.sleep(PUBLISH_RETRY_SECONDS)
                continue
            key = _pending_step(saga)
            assert key is not None  # a saga with a deadline has a pending step
            self._fired[(node, kind)] = key
            return

    def unbounded(
        self, sagas: Iterable[SagaRecord[Any]], kind: str = UPGRADE
    ) -> list[SagaRecord[Any]]:
        """The sagas of `sagas` (each in its window: waiting on a step) that wait on nothing
        with an end: their pending step has no deadline, or no timer of this scheduler waits
        for it and its expiry was never stored (a timer never armed, or one that died)."""
        found = []
        for saga in sagas:
            key = _pending_step(saga)
            slot = (saga.node, kind)
            current = self._timers.get(slot)
            armed = current is not None and current[0] == key and not current[1].done()
            if key is None or not (armed or self._fired.get(slot) == key):
                found.append(saga)
        return found

    def pending(self, kind: str = UPGRADE) -> dict[str, str]:
        """Node -> id of the deadline its saga of `kind` waits for (for tests and status)."""
        return {
            node: deadline_event_id(expired)
            for (node, of), (_, task, saga) in self._timers.items()
            if of == kind and not task.done() and (expired := deadline_event(saga)) is not None
        }

    async def close(self) -> None:
        """Cancel every timer."""
        timers = [task for _, task, _ in self._timers.values()]
        self._timers.clear()
        for task in timers:
            task.cancel()
        for task in timers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
