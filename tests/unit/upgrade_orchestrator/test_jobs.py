"""Counting the pods of a node whose saga waits for jobs."""

from __future__ import annotations

from typing import Any

from gpuop.services.upgrade_orchestrator import jobs


def pod(
    name: str, phase: str = "Running", *, gpus: int = 0, daemon: bool = False
) -> dict[str, Any]:
    owner = {"kind": "DaemonSet" if daemon else "ReplicaSet", "name": "x", "controller": True}
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return {
        "metadata": {"namespace": "ml", "name": name, "uid": name, "ownerReferences": [owner]},
        "spec": {"containers": [{"name": "c", "resources": resources}]},
        "status": {"phase": phase},
    }


def test_finished_pods_count_for_nothing_and_daemonset_pods_are_not_drainable() -> None:
    trainer = pod("trainer", gpus=4)
    done = pod("done", "Succeeded", gpus=1)
    exporter = pod("exporter", daemon=True)

    seen = jobs.count([trainer, done, exporter], [trainer, done])

    assert (seen.gpu_pods, seen.job_pods, seen.drainable_pods) == (1, 1, 1)
    assert [str(p) for p in seen.sample] == ["ml/trainer"]


def test_no_selected_pod_left_lets_the_saga_go_on() -> None:
    seen = jobs.count([pod("server", gpus=1)], [pod("old-job", "Failed")])

    assert seen.job_pods == 0
