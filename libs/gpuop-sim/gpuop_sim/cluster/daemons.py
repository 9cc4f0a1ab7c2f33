"""A minimal DaemonSet controller: one pod per eligible node, as kube-controller-manager's.

For every DaemonSet and node it decides, as upstream does, whether a daemon pod should
run there (``nodeSelector``, required node affinity, and ``NoSchedule``/``NoExecute``
taints against the pod's tolerations plus the ones every daemon pod gets: not-ready and
unreachable ``NoExecute``, the pressure taints and ``unschedulable``, so cordoned nodes
keep their daemons) and whether an existing one may keep running (only ``NoExecute``
taints count). It creates a missing pod once the node has none left, terminating ones
included; deletes the pods of nodes that stopped qualifying, which is how the GPU
Operator's ``nvidia.com/gpu.deploy.<operand>`` labels start and stop operands; deletes
failed and duplicate pods; and keeps the DaemonSet's status.

Daemon pods are bound by the scheduler (``scheduling.py``) through a node affinity on
``metadata.name``, like upstream's. ``cluster.py`` creates the controller; it runs on a
:class:`~gpuop_sim.cluster.wakeups.Wakeup`.
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

from gpuop_sim.apiserver import kinds, pdb
from gpuop_sim.apiserver.registry import Registry
from gpuop_sim.cluster import controllers
from gpuop_sim.cluster.scheduling import selects_node, tolerates

Obj = dict[str, Any]

REVISION_LABEL = "controller-revision-hash"
GENERATION_LABEL = "pod-template-generation"
DAEMON_TOLERATIONS = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)
"""Added to every daemon pod (``AddOrUpdateDaemonPodTolerations``)."""
_WATCHED = {r.group_resource for r in (kinds.PODS, kinds.NODES, kinds.DAEMONSETS)}


def daemon_pod_spec(template_spec: Obj, node: str) -> Obj:
    """The template's pod spec with the daemon tolerations and pinned to ``node``."""
    spec = dict(template_spec)
    tolerations = list(spec.get("tolerations") or [])
    tolerations += [t for t in DAEMON_TOLERATIONS if t not in tolerations]
    if spec.get("hostNetwork"):
        unavailable = {"key": "node.kubernetes.io/network-unavailable", "operator": "Exists"}
        tolerations.append({**unavailable, "effect": "NoSchedule"})
    spec["tolerations"] = tolerations
    pinned = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    affinity = dict(spec.get("affinity") or {})
    affinity["nodeAffinity"] = {
        **(affinity.get("nodeAffinity") or {}),
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [pinned]},
    }
    spec["affinity"] = affinity
    return spec


def placement(template_spec: Obj, node: Obj) -> tuple[bool, bool]:
    """(should run, may continue running) of a daemon pod on ``node``."""
    spec = daemon_pod_spec(template_spec, node["metadata"]["name"])
    if not selects_node(spec, node):
        return False, False
    taints = (node.get("spec") or {}).get("taints") or []
    tolerations = spec["tolerations"]
    untolerated = {t.get("effect") for t in taints if not tolerates(tolerations, t)}
    return not untolerated & {"NoSchedule", "NoExecute"}, "NoExecute" not in untolerated


def node_of(pod: Obj) -> str:
    """The node a daemon pod is bound or pinned to."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return str(spec["nodeName"])
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    for term in required.get("nodeSelectorTerms") or []:
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name" and field.get("values"):
                return str(field["values"][0])
    return ""


class DaemonSetController(controllers.WorkloadController):
    """Keeps one pod of every DaemonSet on every node that should run it."""

    def __init__(self, registry: Registry, rng: random.Random) -> None:
        super().__init__(registry, rng, "daemonset controller", _WATCHED)

    def sync(self) -> None:
        store = self.registry.store
        nodes = store.view(kinds.NODES.group_resource)
        owned = controllers.owned_pods(store)
        for daemonset in controllers.live(store, kinds.DAEMONSETS):
            self._sync(daemonset, nodes, owned.get(daemonset["metadata"]["uid"], []))

    def _sync(self, daemonset: Obj, nodes: list[Obj], pods: list[Obj]) -> None:
        template = daemonset["spec"].get("template") or {}
        revision = controllers.template_hash(template)
        by_node: dict[str, list[Obj]] = defaultdict(list)
        for pod in pods:
            by_node[node_of(pod)].append(pod)
        counts = dict.fromkeys(("desired", "current", "misscheduled", "ready", "updated"), 0)
        for node in nodes:
            name = node["metadata"]["name"]
            run, keep = placement(template.get("spec") or {}, node)
            here = by_node.pop(name, [])
            live = [p for p in here if not p["metadata"].get("deletionTimestamp")]
            failed = [p for p in live if (p.get("status") or {}).get("phase") == "Failed"]
            live = [p for p in live if p not in failed]
            if run and not here:
                created = self._create(daemonset, name, revision)
                if created is not None:
                    live.append(created)
            kept, surplus = (live[:1], live[1:]) if keep else ([], live)
            for pod in failed + surplus:
                controllers.delete_pod(self.registry, pod)
            counts["desired"] += run
            counts["current"] += bool(run and kept)
            counts["misscheduled"] += bool(kept and not run)
            counts["ready"] += sum(1 for p in kept if run and pdb.is_healthy(p))
            counts["updated"] += sum(
                1 for p in kept if run and p["metadata"]["labels"].get(REVISION_LABEL) == revision
            )
        for orphaned in by_node.values():  # pods of nodes that are gone
            for pod in orphaned:
                if not pod["metadata"].get("deletionTimestamp"):
                    controllers.delete_pod(self.registry, pod)
        status = {
            "currentNumberScheduled": counts["current"],
            "numberMisscheduled": counts["misscheduled"],
            "desiredNumberScheduled": counts["desired"],
            "numberReady": counts["ready"],
            "observedGeneration": daemonset["metadata"].get("generation", 1),
            "updatedNumberScheduled": counts["updated"],
            "numberAvailable": counts["ready"],
        }
        if counts["desired"] > counts["ready"]:
            status["numberUnavailable"] = counts["desired"] - counts["ready"]
        controllers.write_status(self.registry, kinds.DAEMONSETS, daemonset, status)

    def _create(self, daemonset: Obj, node: str, revision: str) -> Obj | None:
        generation = str(daemonset["metadata"].get("generation", 1))
        labels = {REVISION_LABEL: revision, GENERATION_LABEL: generation}
        pod = controllers.new_pod(self.registry, self.rng, daemonset, labels=labels)
        pod["spec"] = daemon_pod_spec(pod["spec"], node)
        namespace = daemonset["metadata"]["namespace"]
        return controllers.create(self.registry, kinds.PODS, namespace, pod)
