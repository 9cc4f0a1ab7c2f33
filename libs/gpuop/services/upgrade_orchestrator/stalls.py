"""Nodes that wait on nothing: a saga in its window whose pending step no deadline bounds
(`DeadlineScheduler.unbounded`) would never end, done or failed, and nothing would say why.
Called by the controller's reconcile with the rollout's sagas under way.

A saga is reported once its step has been pending for `REPORT_AFTER` (a decision is
persisted a moment before its deadline is armed): a Warning Event on the node, reason
`UpgradeStalled`, naming the state and the step; and the policy's condition `Stalled`, True
with the nodes while any is, False once none is. A reported saga's deadline is armed again:
a deadline already past then fails the step with its reason, as it would have.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from gpuop.kube.errors import KubeError
from gpuop.kube.recording import EventRecorder, EventType
from gpuop.policy import ConditionType, condition
from gpuop.policy.conditions import Condition
from gpuop.saga import NodeSaga
from gpuop.saga.machine import SagaRecord
from gpuop.services.upgrade_orchestrator.deadlines import DeadlineScheduler

log = logging.getLogger(__name__)

REPORT_AFTER = timedelta(seconds=10)
"""How long a step must have been pending before its saga is reported as waiting on nothing."""
REASON = "UpgradeStalled"
"""The reason of the Event about a node that waits on nothing."""


class StallWatch:
    """Finds and reports the sagas under way that wait on nothing."""

    def __init__(self, recorder: EventRecorder, deadlines: DeadlineScheduler) -> None:
        self._recorder = recorder
        self._deadlines = deadlines
        self._reported: dict[str, tuple[str, str, str]] = {}
        """Node -> (saga, state, step) reported last, so each stall is recorded once."""
        self._said = False
        """Whether the policy's status holds the condition (then it is kept current)."""

    async def check(self, under_way: list[NodeSaga], now: datetime) -> Condition | None:
        """Report the sagas of `under_way` that wait on nothing; the `Stalled` condition to
        write (None while no node ever stalled)."""
        stalled = [
            saga
            for saga in self._deadlines.unbounded(under_way)
            if now - saga.step_started >= REPORT_AFTER
        ]
        for saga in stalled:
            where = (saga.saga_id, f"{saga.state}", saga.step.token)
            if self._reported.get(saga.node) != where:
                await self._report(saga)
                self._reported[saga.node] = where
            self._deadlines.schedule(saga)
        nodes = sorted(saga.node for saga in stalled)
        if not nodes and not self._said:
            return None
        self._said = True
        if nodes:
            return condition(
                ConditionType.STALLED, True, "NodesWaitOnNothing",
                f"{len(nodes)} node(s) wait on no step with a deadline: {', '.join(nodes)}",
                now=now,
            )  # fmt: skip
        return condition(
            ConditionType.STALLED, False, "EveryNodeBounded",
            "every node under way waits on a step with a deadline", now=now,
        )  # fmt: skip

    async def _report(self, saga: SagaRecord[Any]) -> None:
        message = (
            f"node {saga.node} waits in {saga.state} on step {saga.step.token}, which no "
            "deadline bounds: nothing it waits on can end it"
        )
        log.error("%s", message, extra={"node": saga.node})
        try:
            await self._recorder.node_event(
                saga.node, REASON, message, event_type=EventType.WARNING
            )
        except KubeError as error:  # a record: the condition still says it
            log.warning("cannot record that %s is stalled: %s", saga.node, error)
