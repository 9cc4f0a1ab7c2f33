"""`gpuop demo --scenario remediation`: two GPU faults that NVML's XID events alone would not
tell, on the GPU of one pod on each of the two nodes with the most GPU pods, and what the
remediation makes of each (the cluster set-up is `scenarios`'):

- `fallen-off-the-bus` (the first node): NVIDIA's driver prints XID 79 in the kernel log
  (`gpuop_sim.host.simkmsg`: the simulated host root's `dev/kmsg`, which telemetry reads
  with `kernel_log: true`, off by default in the chart since a container cannot open the
  host's `/dev/kmsg` without its capabilities). The catalog asks for a reboot: the
  orchestrator quarantines the node, evicts the GPU's pods, reboots, validates, releases.
  Then the GPU falls again in the new boot: telemetry remembers the first fall on the host
  (`gpuop.health.falls`), so this one asks for `drain-and-replace`, and the second
  remediation hands the node over for new hardware (hardware-replacement-required:
  cordoned, labelled `gpuop.io/hardware-replacement=required`), where the demo leaves it.
- `nvlink-storm` (the second node): the GPU's NVLink CRC, replay and recovery error totals
  jump (`sim_xids.inject_nvlink_errors`), read by telemetry's slow field query; past the
  catalog's rate it asks for a reset: quarantine, eviction, GPU reset, validation, release.

Each fault is put again every `XID_REPEAT` seconds until telemetry reported it. The summary
gives per node the fault, the GPU, the states each remediation went through, the pods
evicted and kept, the condition, the taint and the replacement label; it succeeds when the
fall ended handed over (after a first remediation done through a reboot), the storm done
through a reset and released, and exactly the pods on the faulty GPUs were evicted.
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass, field
from typing import Any

from gpuop.events.remediation import RemediationState as R
from gpuop.host.roots import HostRoot
from gpuop.kube import nodes as kubenodes
from gpuop.nvml.metrics import FieldId
from gpuop.saga.remediation.actions import REPLACEMENT_LABEL, REPLACEMENT_REQUIRED
from gpuop_sim.cli.rollout_view import DONE_STATES, FAILED_STATES, REMEDIATION, SagaRun, Tracker
from gpuop_sim.cli.scenarios import (
    TARGETS,
    XID_REPEAT,
    XID_TRIES,
    Allocation,
    DeviceStatus,
    ScenarioFailed,
    Signals,
    Stage,
    allocate,
    busiest_nodes,
    pod_exists,
    run_summary,
    summary_of,
    uuid_of,
)
from gpuop_sim.host import simkmsg
from gpuop_sim.nvml import sim_gpus, sim_xids

FALL, STORM = "fallen-off-the-bus", "nvlink-storm"
FAULTS = (FALL, STORM)
"""The faults, in the order the targets (sorted by name) get them."""
FALLEN_OFF_BUS = 79
XID_TEXT = "pid=4711, name=python3, GPU has fallen off the bus."
NVLINK_STORM: dict[int, int] = {
    FieldId.NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: 120,
    FieldId.NVLINK_REPLAY_ERROR_COUNT_TOTAL: 400,
    FieldId.NVLINK_RECOVERY_ERROR_COUNT_TOTAL: 6,
}
"""One burst of the storm: past the catalog's 100 errors a minute at once."""
TELEMETRY = (
    "kernel_log: true\nkernel_log_interval_seconds: 0.5\n"
    "interval_seconds: 2\nslow_interval_seconds: 1\n"
)
"""The kernel log on (the simulated host root has one); the field query every second and the
collection the signals are judged on every two (the defaults, 30 s each, would have the
storm wait a minute: a counter's first reading is its baseline)."""
HAND_OVER_WAIT = 15.0
"""Seconds the handed-over node has to show its cordon and label: the hand-over step runs
after the state change that ends the demo's follow."""


@dataclass
class Remediation:
    """A GPU fallen off the bus (twice) and an NVLink storm, and their remediations."""

    stage: Stage
    kind: str = REMEDIATION
    allocations: dict[str, list[Allocation]] = field(default_factory=dict)
    faulty: dict[str, str] = field(default_factory=dict)
    """Per target, the GPU given the fault."""
    faults: dict[str, str] = field(default_factory=dict)
    """Per target, its fault (`FALL` or `STORM`)."""
    first: dict[str, SagaRun] = field(default_factory=dict)
    """The fall's first remediation (the reboot), kept when the second one starts."""
    signals: dict[str, Signals] = field(default_factory=dict)
    background: list[asyncio.Task[None]] = field(default_factory=list)

    def policy(self, spec: dict[str, Any]) -> None:
        # the fall's node is remediated twice
        spec["remediation"] = {"enabled": True, "quarantine": True, "maxPerHour": TARGETS + 1}

    def configs(self) -> dict[str, str]:
        for root in self.stage.roots.values():  # the kernel log telemetry is told to read
            simkmsg.provide(HostRoot(root))
        return {"telemetry": TELEMETRY}

    async def begin(self, tracker: Tracker) -> None:
        count = min(TARGETS, len(self.stage.cluster.node_names))
        targets = await busiest_nodes(self.stage, count)
        tracker.kind, tracker.targets = REMEDIATION, targets
        for node, fault in zip(targets, FAULTS, strict=False):
            self.faults[node] = fault
            self.allocations[node] = await allocate(self.stage, node)
            self.faulty[node] = uuid_of(self.allocations[node][0].gpus[0])
            if fault == FALL:
                tracker.pending.add(node)  # the follow waits for the second fall
        device_status = DeviceStatus(self.stage, targets)
        self.background.append(asyncio.create_task(device_status.run()))
        for node in targets:
            signals = self.signals[node] = Signals()
            self.background.append(
                asyncio.create_task(signals.follow(self.stage.kube, node, tracker))
            )
        await self._put_until_reported(tracker, list(self.faults))
        for node, fault in self.faults.items():
            if fault == FALL:
                self.background.append(asyncio.create_task(self._fall_again(tracker, node)))

    def put(self, node: str) -> None:
        """Put the node's fault on its GPU once."""
        root, gpu = self.stage.roots[node], self.faulty[node]
        if self.faults[node] == FALL:
            simkmsg.xid(HostRoot(root), self._bus_id(node), FALLEN_OFF_BUS, XID_TEXT)
        else:
            sim_xids.inject_nvlink_errors(root, gpu, NVLINK_STORM)

    def _bus_id(self, node: str) -> str:
        gpus = self.stage.gpus
        index = next(i for i in range(gpus) if sim_gpus.gpu_uuid(node, i) == self.faulty[node])
        return sim_gpus.bus_id(index, gpus)

    async def _put_until_reported(self, tracker: Tracker, nodes: list[str]) -> None:
        for _ in range(XID_TRIES):
            missing = [
                node
                for node in nodes
                if self.faulty[node] not in tracker.unhealthy.get(node, set())
                and node not in tracker.runs
            ]
            if not missing:
                return
            for node in missing:
                self.put(node)
            await asyncio.sleep(XID_REPEAT)
        raise ScenarioFailed(f"telemetry never reported the faults on {', '.join(sorted(nodes))}")

    async def _fall_again(self, tracker: Tracker, node: str) -> None:
        """Once the first remediation of the fall ended, the GPU falls again (in the boot
        after the reboot), until a second remediation starts."""
        try:
            while True:
                run = tracker.runs.get(node)
                if run is not None and run.ended is not None:
                    break
                await asyncio.sleep(XID_REPEAT / 10)
            self.first[node] = copy.deepcopy(run)
            if run.state in FAILED_STATES:
                return
            tracker.note(node, "fault", f"XID {FALLEN_OFF_BUS} again, after the reboot")
            for _ in range(XID_TRIES):
                if tracker.runs[node].saga_id != run.saga_id:
                    return
                self.put(node)
                await asyncio.sleep(XID_REPEAT)
        finally:
            tracker.pending.discard(node)

    async def conclude(self, tracker: Tracker) -> tuple[bool, dict[str, Any]]:
        for task in self.background:
            task.cancel()
        nodes: dict[str, Any] = {}
        ok = True
        for node in sorted(self.allocations):
            seen, fine = await self._node(node, tracker)
            nodes[node] = seen
            ok = ok and fine
        return ok, summary_of(REMEDIATION, tracker, len(self.allocations), remediated=nodes)

    async def _node(self, node: str, tracker: Tracker) -> tuple[dict[str, Any], bool]:
        kube = self.stage.kube
        run, first = tracker.runs.get(node), self.first.get(node)
        gpu, fault = self.faulty[node], self.faults[node]
        allocations = self.allocations[node]
        on_gpu = sorted(a.pod for a in allocations if gpu in map(uuid_of, a.gpus))
        gone = [a.pod for a in allocations if not await pod_exists(kube, a.pod)]
        kept = sorted(a.pod for a in allocations if a.pod not in gone)
        for pod in gone:
            namespace, name = pod.split("/", 1)
            self.stage.kubelets[node].release_pod(namespace, name)
        signals = self.signals.get(node, Signals())
        handed_over = fault == FALL and run is not None and run.state is R.REPLACEMENT_REQUIRED
        label, cordoned = await self._hand_over(node, wait=handed_over)
        tainted, condition = await Signals.read(kube, node)
        seen = {
            "fault": fault,
            "gpu": gpu,
            **({"first": run_summary(first)} if fault == FALL else {}),
            **run_summary(run),
            "holders": list(tracker.holders.get(node, ())),
            "on_faulty_gpu": on_gpu,
            "evicted": sorted(gone),
            "kept": kept,
            "quarantined": signals.quarantined,
            "quarantine_condition": signals.quarantine,
            "condition": condition,
            "tainted": tainted,
            "cordoned": cordoned,
            REPLACEMENT_LABEL: label,
        }
        fine = run is not None and sorted(gone) == on_gpu and signals.quarantined
        if fault == FALL:
            fine = fine and handed_over and label == REPLACEMENT_REQUIRED and cordoned
            fine = fine and first is not None and first.state in DONE_STATES
            fine = fine and first is not None and str(R.REBOOT_REQUIRED) in first.states
        else:
            fine = fine and run is not None and run.state in DONE_STATES
            fine = fine and run is not None and str(R.RESET_REQUIRED) in run.states
            fine = fine and condition.get("status") == "True" and not tainted
        return seen, fine

    async def _hand_over(self, node: str, *, wait: bool) -> tuple[str | None, bool]:
        """The node's replacement label and cordon; with `wait`, once they show (the
        hand-over step follows the state change), at most `HAND_OVER_WAIT` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (HAND_OVER_WAIT if wait else 0.0)
        while True:
            current = await kubenodes.get(self.stage.kube, node)
            label = kubenodes.labels_of(current).get(REPLACEMENT_LABEL)
            cordoned = bool((current.get("spec") or {}).get("unschedulable"))
            if (label == REPLACEMENT_REQUIRED and cordoned) or loop.time() >= deadline:
                return label, cordoned
            await asyncio.sleep(0.2)
