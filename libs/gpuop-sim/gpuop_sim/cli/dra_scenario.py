"""`gpuop demo --scenario dra`: two nodes switched to DRA by the device-API saga, a pod with a
ResourceClaim on each, then a GPU fault on one device; and the summary of what came of it.

Three stages, each reported per node in the summary whatever the others did (`Stage`):

- `switch`: the policy gives a driver pool (`DRA_POOL`, selecting the label `DRA_LABEL`)
  `deviceAPI: dra`, and the scenario labels its two targets: the orchestrator's
  device-API starter sees the label change and switches each (cordon, drain, `SetDeviceApi`,
  a claim-based validation pod, uncordon). The live view shows each node's saga and the API
  its device plugin last said it serves (the `GPU API` column). The follow ends when both
  targets' switches ended.
- `claim`: a ResourceClaimTemplate for one `gpu.nvidia.com` device and, per target, a pod
  pinned to it that holds a claim from it; the summary gives the pod's phase and the
  claim's allocation after at most `CLAIM_WAIT` seconds.
- `fault`: XID 48 (the catalog's `reset-gpu`) on the first GPU of the first target, through
  the node's simulated NVML; the summary gives what quarantined it within `FAULT_WAIT`
  seconds: the node's taint and `GPUHealthy` condition (the remediation as it quarantines a
  device-plugin node), and the DeviceTaintRules naming that node's pool (the remediation's
  device quarantine on a DRA node).

The scenario succeeds when both switches are done and each node's device plugin last said it
serves `dra`; the two later stages are reported, not judged: they show what the cluster does
with claims and faults on DRA nodes as far as it is built.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

from gpuop.events import dra
from gpuop.kube import errors as kubeerrors
from gpuop.kube import nodes as kubenodes
from gpuop_sim.cli.rollout_view import DEVICE_API, DONE_STATES, Tracker
from gpuop_sim.cli.scenarios import PLUGIN_WAIT, TARGETS, XID, Signals, Stage, run_summary
from gpuop_sim.cluster.machines import GPU_RESOURCE
from gpuop_sim.nvml import sim_xids

NAME = "dra"
DRA_POOL = "dra"
DRA_LABEL = "gpuop.io/demo-device-api"
NAMESPACE = "gpuop-demo-dra"
TEMPLATE = "one-gpu"
CLAIM_WAIT = 30.0
FAULT_WAIT = 60.0
POLL = 0.5


@dataclass
class DraSwitch:
    """Two nodes switched to DRA, a claim on each, a fault on one device."""

    stage: Stage
    kind: str = DEVICE_API
    targets: list[str] = field(default_factory=list)
    gpus: dict[str, str] = field(default_factory=dict)
    """Per target, its first GPU as the device plugin advertised it before the switch."""

    def policy(self, spec: dict[str, Any]) -> None:
        pool = {"name": DRA_POOL, "nodeSelector": f"{DRA_LABEL}=true", "deviceAPI": "dra"}
        spec["driver"]["pools"] = [*spec["driver"].get("pools", []), pool]

    def configs(self) -> dict[str, str]:
        return {}

    async def begin(self, tracker: Tracker) -> None:
        self.targets = sorted(self.stage.cluster.node_names)[:TARGETS]
        tracker.kind, tracker.targets = DEVICE_API, list(self.targets)
        for node in self.targets:
            kubelet = self.stage.kubelets[node]
            devices = await kubelet.wait_for_devices(GPU_RESOURCE, timeout=PLUGIN_WAIT)
            self.gpus[node] = devices[0].ID.split("::", 1)[0]
        for node in self.targets:
            await kubenodes.set_labels(self.stage.kube, node, {DRA_LABEL: "true"})
            tracker.note(node, "node.label", f"{DRA_LABEL}=true: pool {DRA_POOL}, deviceAPI dra")

    async def conclude(self, tracker: Tracker) -> tuple[bool, dict[str, Any]]:
        switched = {node: self._switch(tracker, node) for node in self.targets}
        claims = await self._claims()
        fault = await self._fault(self.targets[0]) if self.targets else {}
        ok = bool(self.targets) and all(
            s["state"] in {str(d) for d in DONE_STATES} and s["api"] == "dra"
            for s in switched.values()
        )
        summary = {
            "scenario": NAME,
            "targets": len(self.targets),
            "switched": switched,
            "claims": claims,
            "fault": fault,
            "seconds": round(tracker.elapsed, 1),
        }
        return ok, summary

    def _switch(self, tracker: Tracker, node: str) -> dict[str, Any]:
        run = tracker.runs.get(node)
        found = run_summary(run) if run is not None else {"state": "not started"}
        return {**found, "api": tracker.rows[node].api or "-"}

    async def _claims(self) -> dict[str, Any]:
        """Per target, the phase of a pod holding a claim of one GPU, and its allocation."""
        kube = self.stage.kube
        try:
            await _ensure_namespace(kube)
            template = _template()
            with contextlib.suppress(kubeerrors.AlreadyExists):
                await kube.call(
                    kube.resource.create_namespaced_resource_claim_template, NAMESPACE, template
                )
        except kubeerrors.KubeError as error:
            return {"error": f"the API server refused the claim template: {error}"}
        found: dict[str, Any] = {}
        for node in self.targets:
            found[node] = await self._claim_pod(node)
        return found

    async def _claim_pod(self, node: str) -> dict[str, Any]:
        kube = self.stage.kube
        name = f"dra-smoke-{node}"[:63]
        try:
            await kube.call(kube.core.create_namespaced_pod, NAMESPACE, _pod(name, node))
        except kubeerrors.KubeError as error:
            return {"pod": name, "error": str(error)}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CLAIM_WAIT
        phase, pod = "Pending", {}
        while loop.time() < deadline and phase not in ("Running", "Succeeded", "Failed"):
            await asyncio.sleep(POLL)
            pod = await kube.call(kube.core.read_namespaced_pod, name, NAMESPACE)
            phase = (pod.get("status") or {}).get("phase") or "Pending"
        statuses = (pod.get("status") or {}).get("resourceClaimStatuses") or []
        claim = statuses[0].get("resourceClaimName") if statuses else None
        allocation: Any = None
        if claim:
            with contextlib.suppress(kubeerrors.KubeError):
                read = kube.resource.read_namespaced_resource_claim
                got = await kube.call(read, claim, NAMESPACE)
                allocation = (got.get("status") or {}).get("allocation")
        with contextlib.suppress(kubeerrors.KubeError):
            await kube.call(kube.core.delete_namespaced_pod, name, NAMESPACE)
        return {"pod": name, "phase": phase, "claim": claim, "allocation": allocation}

    async def _fault(self, node: str) -> dict[str, Any]:
        """XID on the node's first GPU; what quarantined it, node or device, in time."""
        gpu = self.gpus.get(node)
        if gpu is None:
            return {}
        sim_xids.inject(self.stage.roots[node], gpu, XID)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + FAULT_WAIT
        tainted, condition, rules = False, dict[str, Any](), list[str]()
        while loop.time() < deadline and not (tainted or rules):
            await asyncio.sleep(POLL)
            tainted, condition = await Signals.read(self.stage.kube, node)
            rules = await _taint_rules(self.stage, node)
        return {
            "node": node,
            "gpu": gpu,
            "xid": XID,
            "node_tainted": tainted,
            "condition": condition,
            "device_taint_rules": rules,
        }


def _template() -> dict[str, Any]:
    request = {"deviceClassName": dra.DRIVER, "allocationMode": "ExactCount", "count": 1}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": TEMPLATE, "namespace": NAMESPACE},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}}},
    }


def _pod(name: str, node: str) -> dict[str, Any]:
    pin = {"key": "metadata.name", "operator": "In", "values": [node]}
    affinity = {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [pin]}]}}  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "restartPolicy": "Never",
            "affinity": {"nodeAffinity": affinity},
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": TEMPLATE}],
            "containers": [{"name": "main", "image": "ubuntu:24.04",
                            "command": ["nvidia-smi", "-L"],
                            "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }  # fmt: skip


async def _ensure_namespace(kube: Any) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    with contextlib.suppress(kubeerrors.AlreadyExists):
        await kube.call(kube.core.create_namespace, body)


async def _taint_rules(stage: Stage, node: str) -> list[str]:
    """The DeviceTaintRules whose selector names `node`'s pool; empty when the API server
    serves none."""
    kube = stage.kube
    try:
        listed = await kube.call(
            kube.custom_objects.list_cluster_custom_object, "resource.k8s.io", "v1",
            "devicetaintrules",
        )  # fmt: skip
    except kubeerrors.KubeError:
        return []
    found = []
    for rule in listed.get("items") or []:
        selector = ((rule.get("spec") or {}).get("deviceSelector")) or {}
        if selector.get("pool") == node:
            found.append(f"{rule['metadata']['name']}: {selector.get('device')}")
    return found
