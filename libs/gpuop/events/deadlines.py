"""The expiry of a saga's deadline, recorded as an event.

Every wait in the upgrade saga has a deadline (unlike upstream, where some waits never end).
The orchestrator's deadline scheduler publishes `DeadlineExpired` when one passes, and the
decision core reads it from the log like any other event, so time enters the core only
through the log and a replay makes the same decisions. Retry backoffs are deadlines too (step
`backoff`).

Published and consumed by the upgrade orchestrator; the subject's node token is the saga's
node. A deadline can expire after the saga has moved on (it was persisted, the step then
finished, the orchestrator restarted): the core ignores one whose state, step and attempt no
longer match the saga.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import AwareDatetime

from gpuop.events.envelope import Event
from gpuop.events.fields import Attempt, CorrelationId, Token


class DeadlineExpired(Event):
    """A deadline of a node's saga passed before the step it guards finished."""

    DOMAIN: ClassVar[str] = "saga"
    NAME: ClassVar[str] = "deadline-expired"

    saga_id: CorrelationId
    """The saga whose deadline it is."""
    state: Token
    """The saga's state when the deadline was set (a state of the saga's kind: upstream's
    upgrade states for a driver upgrade)."""
    step: Token
    """The wait inside that state: `drain`, `unload`, `operands-pause`, `reboot`, `backoff`."""
    attempt: Attempt
    """The step's attempt when the deadline was set."""
    deadline: AwareDatetime
    """When the deadline was due (the event's own time may be later)."""
