"""One trace per node upgrade: each saga attempt is a trace whose ids derive from the saga.

The runner, the outbox and the deadline scheduler call this module; the decision core never
does (it stays pure). Ids derive from what the saga record keeps, the way command ids do
(`ids.step(saga_id, token, attempt)`): the trace id from the saga id and attempt, a step's
span id from its token as well. So a command's parent is known when it is published, long
before its step ends, and a leader that takes a saga over after a crash parents on, and
records, the very spans the previous one referred to. The tree of one attempt:

    upgrade saga          the admission step (upgrade-required), root of the trace
      step <token>        each later step, recorded once it ends, from its start in the record
        kube <action>     a Kubernetes action of the step; its outcome event is published in it
        handle <verb>     a node agent handling the step's command, in the agent's process
          decide <event>  the runner deciding on the agent's answer, persisting and acting

An event from outside the trace (an inventory, a node observation, an expired deadline) is
decided under the step it concerns. A step is recorded by whoever decides its end, with the
start the record kept; terminal steps (upgrade-done, a final upgrade-failed) when entered.
What is lost: the span of a step whose deciding leader crashed between persisting and
recording it (its children then point at a span that is not there).

Every kind traces through `deciding`, with ids derived the same way (their commands carry
`step_traceparent`): the `decide <event>` span of one decision, after it records the steps
the decision ended, each `step <token>` a child of the root. A kind's root is `<kind> saga`,
its first step (`admission`, or a remediation's `folded`), recorded when that step ends, its
attributes `gpuop.saga.*`; the upgrade's keeps the names it had before there were other
kinds (`upgrade saga`, one trace per attempt, `gpuop.upgrade.*`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from gpuop.events import Event
from gpuop.observability import tracing
from gpuop.saga import NodeSaga, machine
from gpuop.saga.kinds import SagaKind
from gpuop.saga.machine import SagaRecord, StepResult
from gpuop.saga.upgrade.records import Outcome
from gpuop.saga.upgrade.steps import StepKind

ROOT = "upgrade saga"
"""Name of the root span of every upgrade trace."""
_TERMINAL = frozenset({StepKind.DONE, StepKind.FAILED})
_UNSUCCESSFUL = frozenset({StepResult.FAILED, StepResult.EXPIRED})


def trace_id(saga_id: str, attempt: int) -> int:
    """The trace of one attempt of a saga."""
    return tracing.derived_trace_id(saga_id, str(attempt))


def step_span_id(saga_id: str, attempt: int, token: str) -> int:
    """The span of one step of one attempt (the root is the `admission` step's)."""
    return tracing.derived_span_id(saga_id, str(attempt), token)


def recording() -> bool:
    """Whether this process records spans. Without an SDK provider the answer costs an
    environment lookup, so the outbox asks once per decision, not once per message."""
    return tracing.recording()


def step_context(saga_id: str, attempt: int, token: str) -> otel_context.Context | None:
    """The context whose parent is the step's span; None when tracing is off (asked first:
    deriving the two ids costs more than the rest, on every command and action issued)."""
    if not tracing.recording():
        return None
    return tracing.context_of(trace_id(saga_id, attempt), step_span_id(saga_id, attempt, token))


def step_traceparent(saga_id: str, attempt: int, token: str) -> str | None:
    """The `traceparent` of what the step issues; None when tracing is off."""
    return tracing.traceparent_of(step_context(saga_id, attempt, token))


def current_step_traceparent(saga: SagaRecord[Any]) -> str | None:
    """`step_traceparent` of the saga's pending step."""
    return step_traceparent(saga.saga_id, saga.attempt, saga.step.token)


@contextmanager
def deciding(
    kind: SagaKind[Any],
    before: SagaRecord[Any],
    decision: machine.Decision[Any, Any],
    event: Event,
    *,
    now: datetime,
    cause: str | None,
    started_ns: int,
) -> Iterator[None]:
    """The `decide <event>` span around acting on a persisted decision of any kind made at
    `now` about `before` (`cause`: the event's id; `started_ns`: when deciding began, from
    `now_ns`), after recording the steps the decision ended."""
    if not tracing.recording():
        yield
        return
    attributes = _record_steps(kind, before, decision, now)
    with _decide_span(before, event, attributes, cause, started_ns):
        yield


def _record_steps(
    kind: SagaKind[Any],
    before: SagaRecord[Any],
    decision: machine.Decision[Any, Any],
    now: datetime,
) -> dict[str, str | int]:
    """Record the steps `decision` ended; the attributes of its `decide` span."""
    after = decision.saga
    if isinstance(before, NodeSaga) and isinstance(after, NodeSaga):
        # the upgrade's traces keep the names they had before there were other kinds
        # (`ROOT`, `gpuop.upgrade.*`), which its dashboards read
        _record_ended_steps(before, decision, now)
        return {
            **_saga_attributes(before),
            "gpuop.upgrade.state": str(before.state),
            "gpuop.upgrade.next_state": str(after.state),
            "gpuop.upgrade.step": before.step.token,
        }
    ended = not (kind.holds(after) or kind.waiting(after))
    _record_kind_steps(kind.name, before, decision, now, ended)
    return {
        **_kind_attributes(kind.name, before),
        "gpuop.saga.state": str(before.state),
        "gpuop.saga.next_state": str(after.state),
        "gpuop.saga.step": before.step.token,
    }


@contextmanager
def _decide_span(
    before: SagaRecord[Any],
    event: Event,
    attributes: dict[str, str | int],
    cause: str | None,
    started_ns: int,
) -> Iterator[None]:
    """The `decide <event>` span of any kind's decision about `before`."""
    ours = trace_id(before.saga_id, before.attempt)
    received = trace.get_current_span().get_span_context()
    links: list[trace.Link] = []
    parent = None
    if not (received.is_valid and received.trace_id == ours):
        # decided under the step it concerns; whatever trace the event came in stays linked
        parent = step_context(before.saga_id, before.attempt, before.step.token)
        if received.is_valid:
            links.append(trace.Link(received))
    attributes = {**attributes, "gpuop.message.type": event.TYPE}
    if cause is not None:
        attributes["messaging.message.id"] = cause
    with tracing.tracer(__name__).start_as_current_span(
        f"decide {event.DOMAIN}.{event.NAME}",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        links=links,
        attributes=attributes,
        start_time=started_ns,
    ):
        yield


@contextmanager
def acting(node: str, action: Any, traceparent: str | None) -> Iterator[None]:
    """The `kube <action>` span around a Kubernetes action, child of the step that issued it
    (`traceparent`, taken when it was queued)."""
    with tracing.tracer(__name__).start_as_current_span(
        f"kube {type(action).__name__.lower()}",
        context=tracing.context_from(traceparent),
        attributes={"k8s.node.name": node, "gpuop.action.id": action.id},
    ):
        yield


def now_ns() -> int:
    """The start of a `deciding` span: take it before deciding."""
    return time.time_ns()


def _record_ended_steps(
    before: NodeSaga, decision: machine.Decision[Any, Any], now: datetime
) -> None:
    after = decision.saga
    pending = (after.attempt, after.step.token)
    if (before.attempt, before.step.token) != pending:
        _record_step(before, before.attempt, before.step.token, before.step_started, now, after)
    # steps entered and left within this decision, whose commands point at their spans
    passed = {(c.attempt, c.step) for c in decision.commands} - {pending}
    for attempt, token in sorted(passed):
        _record_step(after, attempt, token, now, now, after)
    if after.step.kind in _TERMINAL and pending != (before.attempt, before.step.token):
        _record_step(after, after.attempt, after.step.token, now, now, after)


def _record_step(
    saga: NodeSaga, attempt: int, token: str, start: datetime, end: datetime, after: NodeSaga
) -> None:
    outcome = _outcome(after, attempt, token)
    root = token == StepKind.ADMISSION.value
    attributes: dict[str, str | int] = {
        **_saga_attributes(saga),
        "gpuop.saga.attempt": attempt,
        "gpuop.upgrade.step": token,
    }
    if outcome is not None:
        attributes["gpuop.upgrade.state"] = str(outcome.state)
        attributes["gpuop.step.result"] = str(outcome.result)
    elif root or token == saga.step.token:
        attributes["gpuop.upgrade.state"] = str(saga.state)
    if root:
        attributes["gpuop.upgrade.canary"] = str(after.canary).lower()
    failed = None
    if outcome is not None and outcome.result in _UNSUCCESSFUL:
        failed = outcome.detail or str(outcome.result)
    tracing.record_span(
        __name__,
        ROOT if root else f"step {token}",
        trace_id=trace_id(saga.saga_id, attempt),
        span_id=step_span_id(saga.saga_id, attempt, token),
        parent=None if root else step_context(saga.saga_id, attempt, StepKind.ADMISSION.value),
        start=start,
        end=end,
        attributes=attributes,
        failed=failed,
    )


def _record_kind_steps(
    kind: str,
    before: SagaRecord[Any],
    decision: machine.Decision[Any, Any],
    now: datetime,
    ended: bool,
) -> None:
    after = decision.saga
    root = _first_step(after)
    pending = (after.attempt, after.step.token)
    if (before.attempt, before.step.token) != pending:
        _record_kind_step(kind, before, before.step.token, before.step_started, now, root)
    passed = {(c.attempt, c.step) for c in decision.commands} - {pending}
    for _, token in sorted(passed):
        _record_kind_step(kind, after, token, now, now, root)
    if ended and pending != (before.attempt, before.step.token):
        _record_kind_step(kind, after, after.step.token, now, now, root)


def _first_step(saga: Any) -> str:
    """The token of the saga's first step (the root of its trace), from its history."""
    history = getattr(saga, "history", ())
    return str(history[0].step) if history else str(saga.step.token)


def _record_kind_step(
    kind: str, saga: SagaRecord[Any], token: str, start: datetime, end: datetime, root: str
) -> None:
    outcome = next(
        (o for o in reversed(getattr(saga, "history", ())) if str(o.step) == token), None
    )
    attributes: dict[str, str | int] = {**_kind_attributes(kind, saga), "gpuop.saga.step": token}
    failed = None
    if outcome is not None:
        attributes["gpuop.saga.state"] = str(outcome.state)
        attributes["gpuop.step.result"] = str(outcome.result)
        if str(outcome.result) in _UNSUCCESSFUL:
            failed = str(outcome.detail) or str(outcome.result)
    is_root = token == root
    tracing.record_span(
        __name__,
        f"{kind} saga" if is_root else f"step {token}",
        trace_id=trace_id(saga.saga_id, saga.attempt),
        span_id=step_span_id(saga.saga_id, saga.attempt, token),
        parent=None if is_root else step_context(saga.saga_id, saga.attempt, root),
        start=start,
        end=end,
        attributes=attributes,
        failed=failed,
    )


def _kind_attributes(kind: str, saga: SagaRecord[Any]) -> dict[str, str | int]:
    return {
        "k8s.node.name": saga.node,
        "gpuop.saga.kind": kind,
        "gpuop.saga.id": saga.saga_id,
        "gpuop.saga.attempt": saga.attempt,
    }


def _outcome(saga: NodeSaga, attempt: int, token: str) -> Outcome | None:
    """How the step ended, as the record kept it (the latest such outcome)."""
    for outcome in reversed(saga.history):
        if outcome.attempt == attempt and outcome.step == token:
            return outcome
    return None


def _saga_attributes(saga: NodeSaga) -> dict[str, str | int]:
    return {
        "k8s.node.name": saga.node,
        "gpuop.saga.id": saga.saga_id,
        "gpuop.saga.attempt": saga.attempt,
        "gpuop.rollout.id": saga.rollout_id,
    }
