"""The XID escalation order has one home, `XidAction` (its members' order, `rank`): what
calls for a remediation is read from it."""

from __future__ import annotations

import pytest

from gpuop.events import device as dev
from gpuop.saga.remediation import kind

GPU = "GPU-00000000-0000-0000-0000-000000000001"


def test_the_escalation_order_is_the_members_order() -> None:
    assert [a.value for a in sorted(dev.XidAction, key=lambda a: a.rank)] == [
        "none",
        "restart-application",
        "mark",
        "reset-gpu",
        "reboot",
        "drain-and-replace",
    ]


@pytest.mark.parametrize("action", list(dev.XidAction))
def test_a_fault_calls_for_a_remediation_from_reset_gpu_up(action: dev.XidAction) -> None:
    event = dev.DeviceHealthChanged(
        gpu_uuid=GPU, healthy=False, reason=dev.HealthReason.XID, xid=48, action=action
    )

    assert kind.calls_for_remediation(event) is (action.rank >= dev.XidAction.RESET_GPU.rank)
    # `mark` alone is neither: the GPU leaves service while the fault lasts, unremediated
    marks_only = action is dev.XidAction.MARK
    assert kind.calls_for_remediation(event) is not (action.keeps_gpu_healthy or marks_only)
