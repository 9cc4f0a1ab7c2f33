"""The demo scenarios' choices and verdicts, on fakes of the cluster: the two nodes running
the most GPU pods are the targets (a scenario with too few GPU pods fails saying how many ran
where), each GPU pod gets its GPUs in device order (a plugin that never advertises its GPUs
fails naming the node), the MIG layout's expected resources, an unknown scenario; a
remediation succeeds only done, quarantined then released, with exactly the faulty GPU's
pods evicted, and a MIG change only with state success and the new devices counted."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest

from gpuop.events.mig import MigState
from gpuop.events.remediation import RemediationState
from gpuop.kube.errors import NotFound
from gpuop_sim.cli import scenarios
from gpuop_sim.cli.rollout_view import MIG, REMEDIATION, SagaRun, Tracker
from gpuop_sim.cli.scenarios import Allocation, ScenarioFailed, Signals, Stage


def pod(name: str, node: str, gpus: int, phase: str = "Running") -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {
        "metadata": {"namespace": "ml", "name": name},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "resources": {"limits": limits}}],
        },
        "status": {"phase": phase},
    }


class FakeKube:
    """Lists the pods of a node by its field selector, reads pods and nodes."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.nodes: dict[str, dict[str, Any]] = {}
        self.core = self

    def list_pod_for_all_namespaces(self) -> None: ...

    def read_namespaced_pod(self) -> None: ...

    def read_node(self) -> None: ...

    async def call(self, method: Any, *args: str, field_selector: str = "") -> dict[str, Any]:
        if method == self.read_node:
            return self.nodes[args[0]]
        if method == self.read_namespaced_pod:
            name, namespace = args
            for found in self.pods:
                if (found["metadata"]["namespace"], found["metadata"]["name"]) == (namespace, name):
                    return found
            raise NotFound(f"pods {name!r} not found")
        node = field_selector.removeprefix("spec.nodeName=")
        return {"items": [p for p in self.pods if p["spec"]["nodeName"] == node]}


@dataclass
class Device:
    ID: str
    health: str = "Healthy"


@dataclass
class FakeKubelet:
    devices: list[Device] | None
    """None: the plugin never advertises."""
    allocated: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)

    async def wait_for_devices(
        self, resource: str, check: Callable[[tuple[Device, ...]], bool], *, timeout: float
    ) -> tuple[Device, ...]:
        if self.devices is None or not check(tuple(self.devices)):
            raise TimeoutError
        return tuple(self.devices)

    async def allocate(self, resource: str, ids: list[str], *, pod: str, namespace: str) -> None:
        self.allocated.append((f"{namespace}/{pod}", tuple(ids)))


@dataclass
class FakeCluster:
    node_names: list[str]


def stage(pods: list[dict[str, Any]], kubelets: dict[str, FakeKubelet] | None = None) -> Stage:
    nodes = sorted(
        {p["spec"]["nodeName"] for p in pods} | {"gpu-node-1", "gpu-node-2", "gpu-node-3"}
    )
    return Stage(
        kube=cast(Any, FakeKube(pods)),
        cluster=cast(Any, FakeCluster(nodes)),
        roots={n: Path("/nonexistent") for n in nodes},
        kubelets=cast(Any, kubelets or {}),
        gpus=4,
    )


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
    assert scenarios._uuid_of("GPU-a::3") == scenarios._uuid_of("GPU-a") == "GPU-a"


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


def remediated(state: RemediationState) -> tuple[scenarios.Remediation, Tracker, FakeKube]:
    """gpu-node-1 remediated to `state`; pods a (GPU-0, faulty) and b (GPU-1) allocated,
    a gone, b running, the node released."""
    kubelets = {"gpu-node-1": cast(Any, FakeKubelet([]))}
    kubelets["gpu-node-1"].release_pod = lambda namespace, name: None
    played = scenarios.Remediation(stage([pod("b", "gpu-node-1", 1)], kubelets))
    played.allocations["gpu-node-1"] = [
        Allocation("ml/a", ("GPU-0",)),
        Allocation("ml/b", ("GPU-1",)),
    ]
    played.faulty["gpu-node-1"] = "GPU-0"
    played.signals["gpu-node-1"] = Signals(quarantined=True)
    kube = cast(FakeKube, played.stage.kube)
    kube.nodes["gpu-node-1"] = node(tainted=False, healthy="True")
    tracker = Tracker(["gpu-node-1"], kind=REMEDIATION, targets=["gpu-node-1"])
    tracker.runs["gpu-node-1"] = SagaRun("r1", T0, state, ended=T0 + timedelta(seconds=3))
    return played, tracker, kube


async def test_a_remediation_done_released_with_only_the_faulty_gpus_pod_evicted_succeeds() -> None:
    played, tracker, _ = remediated(RemediationState.DONE)
    ok, summary = await played.conclude(tracker)
    seen = summary["remediated"]["gpu-node-1"]
    assert ok, summary
    assert (seen["evicted"], seen["kept"], seen["on_faulty_gpu"]) == (["ml/a"], ["ml/b"], ["ml/a"])
    assert (seen["seconds"], seen["condition"]["status"], seen["tainted"]) == (3.0, "True", False)
    head = {k: summary[k] for k in ("scenario", "nodes", "targets", "done", "failed")}
    assert head == {"scenario": REMEDIATION, "nodes": 1, "targets": 1, "done": 1, "failed": 0}
    assert list(summary)[-1] == "remediated"


@pytest.mark.parametrize("fault", ["failed", "tainted", "other-pod-evicted", "no-quarantine"])
async def test_a_remediation_that_did_not_go_as_it_should_fails(fault: str) -> None:
    """`tainted`: done, yet the node still tainted when the summary reads it (no wait:
    remediation-done is published only after the release was written) fails."""
    failed = fault == "failed"
    played, tracker, kube = remediated(RemediationState.FAILED if failed else RemediationState.DONE)
    if fault == "tainted":
        kube.nodes["gpu-node-1"] = node(tainted=True, healthy="True")
    if fault == "other-pod-evicted":
        kube.pods.clear()
    if fault == "no-quarantine":
        played.signals["gpu-node-1"] = Signals()
    ok, summary = await played.conclude(tracker)
    assert not ok, summary


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
