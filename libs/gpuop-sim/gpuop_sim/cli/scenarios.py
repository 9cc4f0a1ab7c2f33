"""`gpuop demo --scenario remediation|mig`: what the demo does to two nodes once the stack
runs, and the summary of what came of it.

Both run on the simulated cluster with a policy that keeps the running driver (no upgrade),
and join what the simulation keeps apart, as a real node joins it: each target node's GPU
pods get their GPUs allocated through the node's kubelet gRPC side (`KubeletGrpc.allocate`,
in device order, as the kubelet's device manager does at admission), so PodResources, and
through it the device plugin's `ListGpuHolders`, names them; and the kubelet's node status
reports the device plugins' resources (`DeviceStatus`: advertised and healthy devices per
resource, the `Machine.device_resources` the simulated kubelet posts).

- `remediation` (`remediation_scenario.Remediation`): a GPU fallen off the bus, seen in the
  kernel log (twice: the second fall, after the reboot, hands the node over for new
  hardware), and an NVLink error storm (a reset), on the two nodes with the most GPU pods.
- `mig` (`MigReconfiguration`): the device plugin advertises MIG devices (`migStrategy:
  mixed`), the policy carries the default mig-parted configs, and two nodes are labelled
  `nvidia.com/mig.config=all-balanced` (per H200: 2x 1g.18gb, 1x 2g.35gb, 1x 3g.71gb). The
  orchestrator re-carves them; the summary gives per node the states, how long, the pods
  evicted, `nvidia.com/mig.config.state`, the node's allocatable GPU resources before and
  after, and discovery's `nvidia.com/mig-<profile>.count` labels (discovery labels `mixed`);
  it succeeds when both are done with state `success` and the new devices counted in
  allocatable and in those labels.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gpuop.kube import client as kubeclient
from gpuop.kube import conditions
from gpuop.kube import errors as kubeerrors
from gpuop.kube import nodes as kubenodes
from gpuop.policy import migconfig
from gpuop_sim.cli.rollout_view import DONE_STATES, MIG, REMEDIATION, SagaRun, Tracker
from gpuop_sim.cluster import heartbeats
from gpuop_sim.cluster.cluster import SimCluster
from gpuop_sim.cluster.kubelet_grpc import KubeletGrpc
from gpuop_sim.cluster.machines import GPU_RESOURCE
from gpuop_sim.cluster.scheduling import gpus_requested

SCENARIOS = ("upgrade", REMEDIATION, MIG, "dra")
"""`dra` is `gpuop_sim.cli.dra_scenario`'s."""
TARGETS = 2
"""Nodes a scenario acts on (fewer when the cluster has fewer)."""
XID = 48
"""ROBUST_CHANNEL_GPU_ECC_DBE: the XID catalog resets the GPU (the DRA scenario's fault)."""
MIG_CONFIG = "all-balanced"
"""A mixed layout of the default mig-parted configs (`gpuop.policy.migconfig`)."""
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
MIG_STATE_LABEL = "nvidia.com/mig.config.state"
MIG_RESOURCE = "nvidia.com/mig-"
PLUGIN_WAIT = 120.0
"""Seconds to wait for a target's device plugin to advertise every GPU."""
PODS_WAIT = 60.0
"""Seconds to wait for GPU pods to run on the nodes."""
XID_REPEAT = 3.0
"""Seconds between putting a fault again while telemetry has not reported it."""
XID_TRIES = 40
DEVICE_STATUS_SECONDS = 0.5
SIGNALS_SECONDS = 0.2
"""How often the remediation scenario reads its nodes' taint and GPUHealthy condition."""
MIG_SETTLE_WAIT = 15.0
"""Seconds a node whose reconfiguration is done has to show it: the new devices reach the
node's allocatable through the kubelet's status, and GFD's counts through its next labelling,
each after mig-config-done. A remediation needs no such wait: remediation-done is published
only once the orchestrator's writes of GPUHealthy True and the untaint returned, so one read
after it must find the node released."""
DEVICE_PLUGIN_MIXED = "flags:\n  migStrategy: mixed\n"
DISCOVERY_MIXED = "mig_strategy: mixed\n"
"""GFD's labels for the MIG devices the device plugin advertises (`mixed`)."""


class ScenarioFailed(RuntimeError):
    """The scenario cannot be played on this cluster (no GPU pods to fault, a plugin that
    never advertised its GPUs)."""


@dataclass
class Stage:
    """What a scenario acts through."""

    kube: kubeclient.Kube
    cluster: SimCluster
    roots: Mapping[str, Path]
    """Each node's host root."""
    kubelets: Mapping[str, KubeletGrpc]
    """Each node's kubelet gRPC side."""
    gpus: int
    """GPUs per node."""


class Scenario(Protocol):
    kind: str

    def policy(self, spec: dict[str, Any]) -> None:
        """Add what the scenario needs to the policy's spec."""

    def configs(self) -> dict[str, str]:
        """Service configuration files the scenario needs, by service."""

    async def begin(self, tracker: Tracker) -> None:
        """Act on the target nodes; set `tracker.targets` first thing."""

    async def conclude(self, tracker: Tracker) -> tuple[bool, dict[str, Any]]:
        """Whether it ended as it should, and the summary."""


def make(name: str, stage: Stage) -> Scenario:
    if name == REMEDIATION:
        from gpuop_sim.cli import remediation_scenario  # it builds on this module's parts

        return remediation_scenario.Remediation(stage)
    if name == MIG:
        return MigReconfiguration(stage)
    if name == "dra":
        from gpuop_sim.cli import dra_scenario  # it builds on this module's parts

        return dra_scenario.DraSwitch(stage)
    raise ValueError(f"--scenario {name}: expected one of {', '.join(SCENARIOS)}")


@dataclass
class Allocation:
    """The GPUs the kubelet gave one pod."""

    pod: str
    """`namespace/name`."""
    gpus: tuple[str, ...]


class DeviceStatus:
    """The simulated kubelet's device manager: every `DEVICE_STATUS_SECONDS`, each node's
    device plugin resources (advertised, healthy) into its machine, posted at once when
    they change."""

    def __init__(self, stage: Stage, nodes: list[str]) -> None:
        self._stage = stage
        self._nodes = nodes

    def now(self, node: str) -> dict[str, tuple[int, int]]:
        kubelet = self._stage.kubelets[node]
        counts = {}
        for resource in kubelet.resources:
            devices = kubelet.devices(resource)
            healthy = sum(1 for d in devices if d.health == "Healthy")
            counts[resource] = (len(devices), healthy)
        return counts

    async def run(self) -> None:
        cluster = self._stage.cluster
        while True:
            for node in self._nodes:
                machine = cluster.machine(node)
                counts = self.now(node)
                if counts and counts != machine.device_resources:
                    machine.device_resources = counts
                    heartbeats.post_node_status(cluster.registry, machine, reachable=True)
            await asyncio.sleep(DEVICE_STATUS_SECONDS)


async def gpu_pods(kube: kubeclient.Kube, node: str) -> list[dict[str, Any]]:
    """The node's running pods that request GPUs, by namespace and name."""
    found = await kube.call(
        kube.core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node}"
    )
    pods = [
        pod
        for pod in found.get("items") or []
        if gpus_requested(pod) > 0 and (pod.get("status") or {}).get("phase") == "Running"
        and not pod["metadata"].get("deletionTimestamp")
    ]  # fmt: skip
    return sorted(pods, key=_name)


def _name(pod: Mapping[str, Any]) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


async def pod_exists(kube: kubeclient.Kube, name: str) -> bool:
    namespace, pod = name.split("/", 1)
    try:
        found = await kube.call(kube.core.read_namespaced_pod, pod, namespace)
    except kubeerrors.NotFound:
        return False
    return not found["metadata"].get("deletionTimestamp")


async def allocate(stage: Stage, node: str) -> list[Allocation]:
    """Give the node's GPU pods their GPUs through its kubelet, in device order."""
    kubelet = stage.kubelets[node]
    try:
        devices = await kubelet.wait_for_devices(
            GPU_RESOURCE, lambda d: len(d) == stage.gpus, timeout=PLUGIN_WAIT
        )
    except TimeoutError:
        raise ScenarioFailed(
            f"{node}: the device plugin did not advertise {stage.gpus} GPUs within "
            f"{PLUGIN_WAIT:g} s"
        ) from None
    free = [device.ID for device in devices]
    allocations = []
    for pod in await gpu_pods(stage.kube, node):
        wanted = gpus_requested(pod)
        if wanted > len(free):
            break
        given, free = free[:wanted], free[wanted:]
        meta = pod["metadata"]
        await kubelet.allocate(GPU_RESOURCE, given, pod=meta["name"], namespace=meta["namespace"])
        allocations.append(Allocation(_name(pod), tuple(given)))
    return allocations


async def busiest_nodes(stage: Stage, count: int) -> list[str]:
    """The `count` nodes running the most GPU pods (then by name), once each has one."""
    nodes = sorted(stage.cluster.node_names)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PODS_WAIT
    while True:
        running = {node: len(await gpu_pods(stage.kube, node)) for node in nodes}
        chosen = sorted(nodes, key=lambda n: (-running[n], n))[:count]
        if all(running[node] for node in chosen):
            return sorted(chosen)
        if loop.time() > deadline:
            raise ScenarioFailed(
                f"no GPU pods run on {count} nodes after {PODS_WAIT:g} s "
                f"(per node: {running}); try more --nodes or --gpus"
            )
        await asyncio.sleep(0.5)


def run_summary(run: SagaRun | None) -> dict[str, Any]:
    if run is None:
        return {"state": None}
    seconds = run.seconds
    return {
        "state": str(run.state),
        "reason": run.reason,
        "seconds": None if seconds is None else round(seconds, 1),
        "states": run.states,
    }


@dataclass
class Signals:
    """What a cluster admin sees of a node's GPU health (the `gpu-unhealthy` taint, the
    `GPUHealthy` condition), and each quarantine seen while the scenario ran."""

    tainted: bool = False
    condition: dict[str, Any] = field(default_factory=dict)
    quarantined: bool = False
    """Seen tainted with the condition False at least once."""
    quarantine: dict[str, Any] = field(default_factory=dict)
    """The condition as the first quarantine showed it."""

    @staticmethod
    async def read(kube: kubeclient.Kube, node: str) -> tuple[bool, dict[str, Any]]:
        current = await kubenodes.get(kube, node)
        condition = conditions.condition_of(current, conditions.GPU_HEALTHY_CONDITION) or {}
        tainted = any(
            taint.get("key") == conditions.GPU_UNHEALTHY_TAINT
            for taint in kubenodes.taints_of(current)
        )
        shown = {k: condition.get(k) for k in ("status", "reason", "message")}
        return tainted, shown

    async def follow(self, kube: kubeclient.Kube, node: str, tracker: Tracker) -> None:
        """Read the node's signals until cancelled, noting each change on the tracker."""
        while True:
            tainted, condition = await self.read(kube, node)
            if (tainted, condition.get("status")) != (self.tainted, self.condition.get("status")):
                taint = f"{conditions.GPU_UNHEALTHY_TAINT} {'on' if tainted else 'off'}"
                health = f"{conditions.GPU_HEALTHY_CONDITION}={condition.get('status')}"
                tracker.note(node, "node.health", f"{taint}, {health} ({condition.get('message')})")
            self.tainted, self.condition = tainted, condition
            if tainted and condition.get("status") == "False" and not self.quarantined:
                self.quarantined, self.quarantine = True, condition
            await asyncio.sleep(SIGNALS_SECONDS)


def summary_of(scenario: str, tracker: Tracker, targets: int, **found: Any) -> dict[str, Any]:
    """A scenario's report: its sagas' counts and time, then what it `found`."""
    done, failed, _ = tracker.counts()
    return {
        "scenario": scenario,
        "nodes": len(tracker.nodes),
        "targets": targets,
        "done": done,
        "failed": failed,
        "seconds": round(tracker.outcome.seconds, 1),
        **found,
    }


@dataclass
class MigReconfiguration:
    """Two nodes relabelled to a mixed MIG layout, and the resources they advertise after."""

    stage: Stage
    kind: str = MIG
    allocations: dict[str, list[Allocation]] = field(default_factory=dict)
    before: dict[str, dict[str, str]] = field(default_factory=dict)
    background: list[asyncio.Task[None]] = field(default_factory=list)

    def policy(self, spec: dict[str, Any]) -> None:
        spec["mig"] = {
            "config": migconfig.DEFAULT_CONFIG,
            "eviction": {"force": True, "deleteEmptyDir": True},
        }

    def configs(self) -> dict[str, str]:
        return {"device-plugin": DEVICE_PLUGIN_MIXED, "discovery": DISCOVERY_MIXED}

    async def begin(self, tracker: Tracker) -> None:
        count = min(TARGETS, len(self.stage.cluster.node_names))
        targets = await busiest_nodes(self.stage, count)
        tracker.kind, tracker.targets = MIG, targets
        device_status = DeviceStatus(self.stage, targets)
        for node in targets:
            self.allocations[node] = await allocate(self.stage, node)
            self.stage.cluster.machine(node).device_resources = device_status.now(node)
            heartbeats.post_node_status(
                self.stage.cluster.registry, self.stage.cluster.machine(node), reachable=True
            )
            self.before[node] = await _gpu_allocatable(self.stage.kube, node)
        self.background.append(asyncio.create_task(device_status.run()))
        for node in targets:
            await kubenodes.set_labels(self.stage.kube, node, {MIG_CONFIG_LABEL: MIG_CONFIG})

    async def conclude(self, tracker: Tracker) -> tuple[bool, dict[str, Any]]:
        kube = self.stage.kube
        expected = _expected_mig(self.stage.gpus)
        nodes: dict[str, Any] = {}
        ok = True
        for node, allocations in sorted(self.allocations.items()):
            run = tracker.runs.get(node)
            after, labels = await self._settled(node, expected, run)
            gone = sorted([a.pod for a in allocations if not await pod_exists(kube, a.pod)])
            for pod in gone:
                namespace, name = pod.split("/", 1)
                self.stage.kubelets[node].release_pod(namespace, name)
            mig_after = {r: int(n) for r, n in after.items() if r.startswith(MIG_RESOURCE)}
            nodes[node] = {
                "config": MIG_CONFIG,
                **run_summary(run),
                "config_state": labels.get(MIG_STATE_LABEL),
                "holders": list(tracker.holders.get(node, ())),
                "evicted": gone,
                "kept": sorted(a.pod for a in allocations if a.pod not in gone),
                "allocatable_before": self.before.get(node, {}),
                "allocatable_after": after,
                "labels_after": _mig_count_labels(labels),
            }
            ok = ok and (
                run is not None
                and run.state in DONE_STATES
                and labels.get(MIG_STATE_LABEL) == "success"
                and mig_after == expected
                and _mig_counts(labels) == expected
            )
        for task in self.background:
            task.cancel()
        summary = summary_of(
            MIG, tracker, len(self.allocations), expected=expected, reconfigured=nodes
        )
        return ok, summary

    async def _settled(
        self, node: str, expected: dict[str, int], run: SagaRun | None
    ) -> tuple[dict[str, str], dict[str, str]]:
        """The node's allocatable `nvidia.com/*` and its labels once a done reconfiguration
        shows (`mig.config.state` success, the device plugin's new devices counted), or as
        they are after `MIG_SETTLE_WAIT`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + MIG_SETTLE_WAIT
        while True:
            after = await _gpu_allocatable(self.stage.kube, node)
            labels = kubenodes.labels_of(await kubenodes.get(self.stage.kube, node))
            mig = {r: int(n) for r, n in after.items() if r.startswith(MIG_RESOURCE)}
            shown = (
                labels.get(MIG_STATE_LABEL) == "success"
                and mig == expected
                and _mig_counts(labels) == expected
            )
            if shown or run is None or run.state not in DONE_STATES or loop.time() > deadline:
                return after, labels
            await asyncio.sleep(DEVICE_STATUS_SECONDS)


def _expected_mig(gpus: int) -> dict[str, int]:
    """The MIG resources `MIG_CONFIG` gives a node of `gpus` H200s."""
    file = migconfig.load_default()
    (entry,) = file.configs[MIG_CONFIG]
    return {f"{MIG_RESOURCE}{profile}": n * gpus for profile, n in entry.mig_devices}


def _mig_count_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """GFD's `nvidia.com/mig-<profile>.count` labels, as discovery last wrote them."""
    return {
        key: value
        for key, value in sorted(labels.items())
        if key.startswith(MIG_RESOURCE) and key.endswith(".count")
    }


def _mig_counts(labels: Mapping[str, str]) -> dict[str, int]:
    """GFD's MIG device counts by resource name (`nvidia.com/mig-<profile>`)."""
    return {
        key.removesuffix(".count"): int(value)
        for key, value in _mig_count_labels(labels).items()
        if value.isdigit()
    }


async def _gpu_allocatable(kube: kubeclient.Kube, node: str) -> dict[str, str]:
    """The node's allocatable `nvidia.com/...` resources."""
    current = await kubenodes.get(kube, node)
    allocatable = (current.get("status") or {}).get("allocatable") or {}
    return {r: str(n) for r, n in sorted(allocatable.items()) if r.startswith("nvidia.com/")}


def uuid_of(device_id: str) -> str:
    """The GPU a device id of `nvidia.com/gpu` names (a replica `<uuid>::<n>`, or the
    uuid)."""
    return device_id.split("::", 1)[0]
