"""The demo scenarios' choices and verdicts, on fakes of the cluster: the two nodes running
the most GPU pods are the targets (a scenario with too few GPU pods fails saying how many ran
where), each GPU pod gets its GPUs in device order (a plugin that never advertises its GPUs
fails naming the node), the MIG layout's expected resources, an unknown scenario; a MIG
change succeeds only with state success and the new devices counted (the remediation's
verdicts: `test_demo_remediation_scenario`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

import pytest

from gpuop.events.mig import MigState
from gpuop_sim.cli import scenarios
from gpuop_sim.cli.rollout_view import MIG, SagaRun, Tracker
from gpuop_sim.cli.scenarios import ScenarioFailed
from tests.support.demo_scenarios import Device, FakeKube, FakeKubelet, pod, stage


async def test_the_targets_are_the_nodes_with_the_most_gpu_pods_then_by_name() -> None:
    pods = [
        pod("a", "gpu-node-3", 1), pod("b", "gpu-node-3", 2), pod("c", "gpu-node-2", 1),
        pod("d", "gpu-node-1", 1), pod("cpu", "gpu-node-1", 0),
        pod("done", "gpu-node-1", 1, "Succeeded"),
    ]  # fmt: skip
    assert await scenarios.busiest_nodes(stage(pods), 2) == ["gpu-node-1", "gpu-node-3"]


async def test_too_few_nodes_with_gpu_pods_fails_naming_the_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(scenarios, "PODS_WAIT", 0.0)
    with pytest.raises(ScenarioFailed, match=r"no GPU pods run on 2 nodes .*'gpu-node-2': 0"):
        await scenarios.busiest_nodes(stage([pod("a", "gpu-node-1", 1)]), 2)


async def test_gpu_pods_get_their_gpus_in_device_order_while_they_last() -> None:
    kubelet = FakeKubelet([Device(f"GPU-{i}") for i in range(4)])
    pods = [pod("a", "gpu-node-1", 2), pod("b", "gpu-node-1", 1), pod("c", "gpu-node-1", 2)]
    allocations = await scenarios.allocate(stage(pods, {"gpu-node-1": kubelet}), "gpu-node-1")
    assert [(a.pod, a.gpus) for a in allocations] == [
        ("ml/a", ("GPU-0", "GPU-1")), ("ml/b", ("GPU-2",)),
    ]  # fmt: skip
    assert kubelet.allocated == [(a.pod, a.gpus) for a in allocations]


async def test_a_plugin_that_never_advertises_its_gpus_fails_naming_the_node() -> None:
    kubelets = {"gpu-node-1": FakeKubelet([Device("GPU-0")])}  # 1 of 4
    with pytest.raises(ScenarioFailed, match="gpu-node-1: the device plugin did not advertise 4"):
        await scenarios.allocate(stage([pod("a", "gpu-node-1", 1)], kubelets), "gpu-node-1")


def test_the_mixed_layout_gives_each_gpu_two_1g_one_2g_and_one_3g() -> None:
    assert scenarios._expected_mig(8) == {
        "nvidia.com/mig-1g.18gb": 16, "nvidia.com/mig-2g.35gb": 8, "nvidia.com/mig-3g.71gb": 8,
    }  # fmt: skip


def test_an_unknown_scenario_is_refused_and_a_replica_names_its_gpu() -> None:
    with pytest.raises(ValueError, match="--scenario reboot"):
        scenarios.make("reboot", stage([]))
    assert scenarios.uuid_of("GPU-a::3") == scenarios.uuid_of("GPU-a") == "GPU-a"


T0 = datetime(2026, 12, 3, 17, 0, tzinfo=UTC)


def node(tainted: bool, healthy: str | None, labels: dict[str, str] | None = None,
         allocatable: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    taints = [{"key": "gpuop.io/gpu-unhealthy", "effect": "NoSchedule"}] if tainted else []
    conditions = [{"type": "GPUHealthy", "status": healthy}] if healthy else []
    return {
        "metadata": {"name": "gpu-node-1", "labels": labels or {}},
        "spec": {"taints": taints},
        "status": {"conditions": conditions, "allocatable": allocatable or {}},
    }


@pytest.mark.parametrize("counted", [True, False])
async def test_a_mig_change_succeeds_only_with_its_new_devices_counted(
    counted: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scenarios, "MIG_SETTLE_WAIT", 0.0)
    played = scenarios.MigReconfiguration(stage([]))
    played.stage.gpus = 1
    played.allocations["gpu-node-1"] = []
    expected = {"nvidia.com/mig-1g.18gb": "2", "nvidia.com/mig-2g.35gb": "1",
                "nvidia.com/mig-3g.71gb": "1"}  # fmt: skip
    labels = {"nvidia.com/mig.config.state": "success"}
    labels |= {f"{r}.count": n for r, n in expected.items()}
    allocatable = {"nvidia.com/gpu": "0", **(expected if counted else {})}
    cast(FakeKube, played.stage.kube).nodes["gpu-node-1"] = node(False, None, labels, allocatable)
    tracker = Tracker(["gpu-node-1"], kind=MIG, targets=["gpu-node-1"])
    tracker.runs["gpu-node-1"] = SagaRun("m1", T0, MigState.MIG_CONFIG_DONE, ended=T0)
    ok, summary = await played.conclude(tracker)
    assert ok is counted, summary
    assert summary["reconfigured"]["gpu-node-1"]["config_state"] == "success"
    assert (summary["scenario"], summary["targets"], summary["done"]) == (MIG, 1, 1)
    assert list(summary)[-2:] == ["expected", "reconfigured"]
