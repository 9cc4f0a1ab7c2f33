"""The device-API switch's step deadlines.

The steps it shares with the driver upgrade take the upgrade's deadlines
(`upgradePolicy.deadlines`: `cordon`, the GPU pods' deletion, `validationPod`, `uncordon`);
the switch itself, and a switch back, take `SWITCH_SECONDS`: the device plugin stops one
kubelet plugin and registers the other, which the kubelet accepts in seconds. Admission and
the final states have none.
"""

from __future__ import annotations

from gpuop.policy import UpgradePolicy
from gpuop.saga.device_api.records import SwitchStep, SwitchStepKind

K = SwitchStepKind
SWITCH_SECONDS = 300
"""How long the device plugin may take to serve the other API and say so."""


def limit_seconds(step: SwitchStep, policy: UpgradePolicy) -> float | None:
    """Seconds `step` may take; None for a step without a deadline."""
    deadlines = policy.deadlines
    limits = {
        K.CORDON: deadlines.cordon,
        K.DRAIN: policy.pod_deletion_limit,
        K.SWITCH: SWITCH_SECONDS,
        K.VALIDATE: deadlines.validation_pod,
        K.SWITCH_BACK: SWITCH_SECONDS,
        K.UNCORDON: deadlines.uncordon,
    }
    limit = limits.get(step.kind)
    return None if limit is None else float(limit)
