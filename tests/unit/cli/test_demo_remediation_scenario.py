"""The remediation scenario's faults and verdicts, on fakes of the cluster: the fall is a
kernel-log XID 79 line on the GPU's address and the storm a burst of NVLink errors for its
UUID; the fall succeeds only after a first remediation done through a reboot and a second
handed over (cordoned, labelled for replacement), the storm only done through a reset and
released, each with exactly the faulty GPU's pods evicted."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest

from gpuop.events.remediation import RemediationState as R
from gpuop.health import kmsg
from gpuop.nvml.metrics import FieldId
from gpuop_sim.cli import remediation_scenario
from gpuop_sim.cli.remediation_scenario import FALL, STORM, Remediation
from gpuop_sim.cli.rollout_view import REMEDIATION, SagaRun, Tracker
from gpuop_sim.cli.scenarios import Allocation, Signals
from gpuop_sim.host import simkmsg
from gpuop_sim.nvml import sim_gpus, sim_xids
from tests.support.demo_scenarios import FakeKube, FakeKubelet, pod, stage

NODE = "gpu-node-1"
T0 = datetime(2026, 12, 7, 18, 0, tzinfo=UTC)
REBOOTED = [str(s) for s in (R.ADMISSION_REQUIRED, R.REBOOT_REQUIRED, R.DONE)]
RESET = [str(s) for s in (R.ADMISSION_REQUIRED, R.RESET_REQUIRED, R.DONE)]


def node(*, tainted: bool, healthy: str, label: str | None, cordoned: bool) -> dict[str, Any]:
    taints = [{"key": "gpuop.io/gpu-unhealthy", "effect": "NoSchedule"}] if tainted else []
    labels = {"gpuop.io/hardware-replacement": label} if label else {}
    return {
        "metadata": {"name": NODE, "labels": labels},
        "spec": {"taints": taints, "unschedulable": cordoned},
        "status": {"conditions": [{"type": "GPUHealthy", "status": healthy}]},
    }


def run(state: R, states: list[str], saga: str = "r2") -> SagaRun:
    return SagaRun(saga, T0, state, ended=T0 + timedelta(seconds=3), states=states)


def played(fault: str) -> tuple[Remediation, Tracker, FakeKube]:
    """NODE given `fault` on GPU-0; pods a (GPU-0) and b (GPU-1) allocated, a gone, b running;
    its remediations as they should end, the node as it should be left."""
    kubelets = {NODE: cast(Any, FakeKubelet([]))}
    kubelets[NODE].release_pod = lambda namespace, name: None
    scenario = Remediation(stage([pod("b", NODE, 1)], kubelets))
    scenario.allocations[NODE] = [Allocation("ml/a", ("GPU-0",)), Allocation("ml/b", ("GPU-1",))]
    scenario.faulty[NODE], scenario.faults[NODE] = "GPU-0", fault
    scenario.signals[NODE] = Signals(quarantined=True)
    kube = cast(FakeKube, scenario.stage.kube)
    tracker = Tracker([NODE], kind=REMEDIATION, targets=[NODE])
    if fault == FALL:
        scenario.first[NODE] = run(R.DONE, REBOOTED, "r1")
        tracker.runs[NODE] = run(R.REPLACEMENT_REQUIRED, [str(R.REPLACEMENT_REQUIRED)])
        kube.nodes[NODE] = node(tainted=True, healthy="False", label="required", cordoned=True)
    else:
        tracker.runs[NODE] = run(R.DONE, RESET)
        kube.nodes[NODE] = node(tainted=False, healthy="True", label=None, cordoned=False)
    return scenario, tracker, kube


@pytest.mark.parametrize("fault", [FALL, STORM])
async def test_each_fault_ending_as_it_should_succeeds(fault: str) -> None:
    scenario, tracker, _ = played(fault)
    ok, summary = await scenario.conclude(tracker)
    seen = summary["remediated"][NODE]
    assert ok, summary
    assert (seen["fault"], seen["evicted"], seen["kept"]) == (fault, ["ml/a"], ["ml/b"])
    assert ("first" in seen) is (fault == FALL)


@pytest.mark.parametrize(
    "wrong",
    ["storm-rebooted", "storm-tainted", "fall-never-rebooted", "fall-not-labelled",
     "fall-done-not-handed-over", "other-pod-evicted"],
)  # fmt: skip
async def test_a_fault_that_did_not_end_as_it_should_fails(
    wrong: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remediation_scenario, "HAND_OVER_WAIT", 0.0)
    scenario, tracker, kube = played(STORM if wrong.startswith("storm") else FALL)
    if wrong == "storm-rebooted":
        tracker.runs[NODE] = run(R.DONE, REBOOTED)
    if wrong == "storm-tainted":
        kube.nodes[NODE] = node(tainted=True, healthy="True", label=None, cordoned=False)
    if wrong == "fall-never-rebooted":
        scenario.first[NODE] = run(R.DONE, RESET, "r1")
    if wrong == "fall-not-labelled":
        kube.nodes[NODE] = node(tainted=True, healthy="False", label=None, cordoned=True)
    if wrong == "fall-done-not-handed-over":
        tracker.runs[NODE] = run(R.DONE, REBOOTED)
    if wrong == "other-pod-evicted":
        kube.pods.clear()
    ok, summary = await scenario.conclude(tracker)
    assert not ok, summary


def test_the_fall_is_an_xid_79_line_on_the_gpus_address_and_the_storm_a_burst_for_its_uuid(
    tmp_path: Path,
) -> None:
    scenario, _, _ = played(FALL)
    scenario.stage.roots = {NODE: tmp_path}
    scenario.stage.gpus = 4
    scenario.faulty[NODE] = sim_gpus.gpu_uuid(NODE, 2)
    (tmp_path / "dev").mkdir()
    scenario.put(NODE)

    [line] = (tmp_path / simkmsg.KMSG).read_bytes().splitlines()
    fault = kmsg.parse_fault(kmsg.parse_record(line))
    assert fault is not None
    assert (fault.pci, fault.xid) == (kmsg.pci_key(sim_gpus.bus_id(2, 4)), 79)

    scenario.faults[NODE] = STORM
    feed = sim_xids.NvlinkFeed(tmp_path / sim_xids.NVLINK)
    scenario.put(NODE)
    [(uuid, counts)] = feed.take()
    assert uuid == sim_gpus.gpu_uuid(NODE, 2)
    assert sum(counts.values()) >= 100  # past the catalog's rate at once
    assert FieldId.NVLINK_REPLAY_ERROR_COUNT_TOTAL in counts
