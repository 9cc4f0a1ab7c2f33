"""The MIG reconfiguration's step deadlines, from the policy's `mig.deadlines`.

Every wait has one but admission (a node waits for its slot as long as it takes) and the
steps that do not wait (verification, the final states).
"""

from __future__ import annotations

from gpuop.policy.mig import MigPolicy
from gpuop.saga.mig.records import MigStep, MigStepKind

K = MigStepKind


def limit_seconds(step: MigStep, policy: MigPolicy) -> float | None:
    """Seconds `step` may take; None for a step without a deadline."""
    deadlines = policy.deadlines
    limits = {
        K.OPERANDS_PAUSE: deadlines.operands_pause,
        K.LIST_HOLDERS: deadlines.holders,
        K.EVICT_HOLDERS: deadlines.eviction,
        K.APPLY: deadlines.apply,
        K.REBOOT: deadlines.reboot,
        K.REAPPLY: deadlines.apply,
        K.RESTORE: deadlines.restore,
        K.OPERANDS_RESUME: deadlines.operands_resume,
    }
    limit = limits.get(step.kind)
    return None if limit is None else float(limit)
