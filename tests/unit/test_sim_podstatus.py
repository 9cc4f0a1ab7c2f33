"""A pod the simulated kubelet starts keeps the claims the scheduler recorded in its status."""

from __future__ import annotations

from datetime import UTC, datetime

from gpuop_sim.cluster import podstatus


def test_a_started_pod_keeps_its_resource_claim_statuses() -> None:
    claims = [{"name": "gpu", "resourceClaimName": "p-gpu"}]
    pod = {
        "metadata": {"name": "p", "namespace": "n", "uid": "u"},
        "spec": {"containers": [{"name": "main", "image": "ubuntu:24.04"}]},
        "status": {"phase": "Pending", "resourceClaimStatuses": claims, "message": "old"},
    }
    status = podstatus.running(pod, "10.0.0.1", "10.1.0.1", datetime(2026, 1, 1, tzinfo=UTC),
                               restarted=False)  # fmt: skip
    assert status["phase"] == "Running"
    assert status["resourceClaimStatuses"] == claims
    assert "message" not in status
