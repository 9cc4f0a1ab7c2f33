"""The simulated kubelet's node status keeps the conditions it does not own (another
component's, such as gpuop's `GPUHealthy`), as the kubelet's status patch does, and so does
the lifecycle controller's verdict on a silent kubelet; its own are reported fresh."""

from __future__ import annotations

from datetime import UTC, datetime

from gpuop_sim.cluster import machines

NOW = datetime(2026, 12, 3, 17, 0, tzinfo=UTC)
GPU_HEALTHY = {
    "type": "GPUHealthy",
    "status": "False",
    "reason": "GPUUnhealthy",
    "message": "1 GPU unhealthy: GPU-a (XID 48)",
    "lastTransitionTime": "2026-12-03T16:59:00Z",
}


def by_type(conditions: list[dict[str, str]]) -> dict[str, dict[str, str]]:
    return {c["type"]: c for c in conditions}


def test_a_status_report_keeps_another_components_condition() -> None:
    previous = [*machines.reported_conditions([], NOW), GPU_HEALTHY]
    reported = by_type(machines.reported_conditions(previous, NOW))
    assert reported["GPUHealthy"] == GPU_HEALTHY
    assert reported["Ready"]["status"] == "True"
    assert len(reported) == 5


def test_a_silent_kubelets_verdict_keeps_it_too_and_marks_only_the_kubelets_unknown() -> None:
    previous = [*machines.reported_conditions([], NOW), GPU_HEALTHY]
    verdict = by_type(machines.unknown_conditions(previous, NOW))
    assert verdict["GPUHealthy"] == GPU_HEALTHY
    assert {c["status"] for t, c in verdict.items() if t != "GPUHealthy"} == {"Unknown"}


def test_without_another_condition_only_the_kubelets_are_reported() -> None:
    assert [c["type"] for c in machines.reported_conditions([], NOW)] == [
        "MemoryPressure", "DiskPressure", "PIDPressure", "Ready",
    ]  # fmt: skip
