"""The operands' confirmations of a pause or a resume, counted alike by every kind's phases.

A phase that paused (or resumed) the node's operands waits for each one's `OperandPaused`
(or `OperandResumed`) answering its pending step; `count` adds one to the saga's record and
says when every operand has confirmed. Pure.
"""

from __future__ import annotations

from typing import Any

from gpuop.events import device as dev
from gpuop.saga.machine import Draft, Trigger


def count(
    draft: Draft[Any, Any],
    trigger: Trigger,
    kind: type[dev.OperandPaused | dev.OperandResumed],
    field: str = "paused",
) -> bool:
    """Count `trigger`, a `kind` answering the pending step, into the saga's `field` (the
    operands that confirmed, in the saga's order); True once every operand has. Another
    step's answer, an operand the saga does not wait for, or one counted already changes
    nothing."""
    saga = draft.saga
    if not isinstance(trigger, kind) or trigger.command_id != draft.step_id():
        return False
    done = getattr(saga, field)
    if trigger.service not in saga.operands or trigger.service in done:
        return False
    confirmed = tuple(s for s in saga.operands if s in {*done, trigger.service})
    draft.update(**{field: confirmed})
    return len(confirmed) == len(saga.operands)
