"""A tiny default scheduler for the simulated cluster, and the GPU accounting it keeps.

Binds every unbound, non-terminating pod of ``default-scheduler`` to a node that takes
it, oldest pod first, with the filters of kube-scheduler that matter here, in its order:
``spec.unschedulable`` (unless the pod tolerates ``node.kubernetes.io/unschedulable``),
untolerated ``NoSchedule``/``NoExecute`` taints, ``nodeSelector`` and required node
affinity (``matchExpressions`` on labels, ``matchFields`` on ``metadata.name``, as
DaemonSet pods use), and room: ``nvidia.com/gpu`` requests against allocatable, and the
pod count; for a pod naming ResourceClaims, a node whose ResourceSlices can give them all
(``claims.py``, which allocates them on the node chosen). A pod that fits nowhere stays
Pending with ``PodScheduled=False``, reason ``Unschedulable`` and kube-scheduler's
message (``0/3 nodes are available: 1 node(s) were unschedulable, 2 Insufficient
nvidia.com/gpu.``). Among fitting nodes it picks the
one with the fewest pods of the same owner (replicas spread, as the default topology
spread does), then the most free GPUs, then the fewest pods, then the first name.

GPU accounting: every pod bound to a node holds its GPUs until it is gone or has
finished, terminating pods included, so the sum on a node never exceeds what it has.
The kubelet (``kubelet.py``) applies the same sums when it admits pods bound directly.
``cluster.py`` creates the scheduler; it runs on :class:`~gpuop_sim.cluster.wakeups.Wakeup`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from gpuop_sim.apiserver import kinds
from gpuop_sim.apiserver.nodes import UNSCHEDULABLE_TAINT
from gpuop_sim.apiserver.registry import Registry
from gpuop_sim.apiserver.selectors import Requirement
from gpuop_sim.apiserver.store import Change
from gpuop_sim.cluster import controllers, podstatus
from gpuop_sim.cluster.claims import Claims, wants_claims
from gpuop_sim.cluster.machines import GPU_RESOURCE
from gpuop_sim.cluster.wakeups import Wakeup, unless_gone

Obj = dict[str, Any]

DEFAULT_SCHEDULER = "default-scheduler"
_BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


def gpus_requested(pod: Obj) -> int:
    """``nvidia.com/gpu`` the pod needs: its containers' sum, or its largest init
    container's if larger. Extended resources default their request to the limit."""

    def amount(container: Obj) -> int:
        resources = container.get("resources") or {}
        limits = resources.get("limits") or {}
        return int((resources.get("requests") or {}).get(GPU_RESOURCE, limits.get(GPU_RESOURCE, 0)))

    spec = pod.get("spec") or {}
    containers = sum(amount(c) for c in spec.get("containers") or [])
    return max(containers, max((amount(c) for c in spec.get("initContainers") or []), default=0))


def holds_resources(pod: Obj) -> bool:
    """Bound and not finished: terminating pods still hold their devices."""
    status = pod.get("status") or {}
    return bool((pod.get("spec") or {}).get("nodeName")) and status.get("phase") not in (
        "Succeeded",
        "Failed",
    )


def allocatable(node: Obj, resource: str) -> int:
    return int(((node.get("status") or {}).get("allocatable") or {}).get(resource, 0))


def usage(pods: list[Obj]) -> dict[str, tuple[int, int]]:
    """Per node name: (GPUs held, pods held)."""
    gpus: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for pod in pods:
        if holds_resources(pod):
            node = pod["spec"]["nodeName"]
            gpus[node] += gpus_requested(pod)
            count[node] += 1
    return {node: (gpus[node], count[node]) for node in count}


def tolerates(tolerations: list[Obj], taint: Obj) -> bool:
    for toleration in tolerations:
        if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
            continue
        if toleration.get("operator", "Equal") == "Exists":
            if not toleration.get("key") or toleration["key"] == taint.get("key"):
                return True
        elif toleration.get("key") == taint.get("key") and (toleration.get("value") or "") == (
            taint.get("value") or ""
        ):
            return True
    return False


def selects_node(spec: Obj, node: Obj) -> bool:
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(key) != value for key, value in (spec.get("nodeSelector") or {}).items()):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not required:
        return True
    fields = {"metadata.name": node["metadata"]["name"]}

    def term_matches(term: Obj) -> bool:
        checks = [(e, labels) for e in term.get("matchExpressions") or []]
        checks += [(e, fields) for e in term.get("matchFields") or []]
        return bool(checks) and all(
            Requirement(e["key"], e["operator"], frozenset(e.get("values") or ())).matches(values)
            for e, values in checks
        )

    return any(term_matches(term) for term in required.get("nodeSelectorTerms") or [])


def refusal(pod: Obj, node: Obj, held: tuple[int, int]) -> str | None:
    """Why ``node`` cannot take ``pod``, in kube-scheduler's words; None if it can."""
    spec = pod.get("spec") or {}
    tolerations = spec.get("tolerations") or []
    node_spec = node.get("spec") or {}
    if node_spec.get("unschedulable") and not tolerates(
        tolerations, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}
    ):
        return "node(s) were unschedulable"
    for taint in node_spec.get("taints") or []:
        if taint.get("effect") in _BLOCKING_EFFECTS and not tolerates(tolerations, taint):
            return f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"
    if not selects_node(spec, node):
        return "node(s) didn't match Pod's node affinity/selector"
    gpus, count = held
    if gpus + gpus_requested(pod) > allocatable(node, GPU_RESOURCE):
        return f"Insufficient {GPU_RESOURCE}"
    if count + 1 > allocatable(node, "pods"):
        return "Too many pods"
    return None


def unschedulable_message(reasons: Counter[str], nodes: int) -> str:
    if not nodes:
        return "no nodes available to schedule pods"
    listed = ", ".join(sorted(f"{count} {reason}" for reason, count in reasons.items()))
    return f"0/{nodes} nodes are available: {listed}."


class Scheduler:
    """Binds pending pods to nodes with room, or says why none has any."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.wakeup = Wakeup("scheduler", self.schedule)
        self.claims = Claims(registry)
        """The DRA path: pods naming ResourceClaims go where the claims can be allocated."""
        registry.store.observe(self._on_change)

    def close(self) -> None:
        self.wakeup.close()

    def _on_change(self, change: Change) -> None:
        if change.resource in (kinds.PODS.group_resource, kinds.NODES.group_resource):
            self.wakeup.soon()

    def schedule(self) -> None:
        store = self.registry.store
        nodes = store.view(kinds.NODES.group_resource)
        pods = store.view(kinds.PODS.group_resource)
        held = usage(pods)
        siblings: Counter[tuple[str, str | None]] = Counter(
            (pod["spec"]["nodeName"], controllers.controller_uid(pod))
            for pod in pods
            if holds_resources(pod)
        )
        waiting = sorted(
            (
                pod
                for pod in pods
                if not pod["spec"].get("nodeName")
                and not pod["metadata"].get("deletionTimestamp")
                and pod["spec"].get("schedulerName", DEFAULT_SCHEDULER) == DEFAULT_SCHEDULER
                and (pod.get("status") or {}).get("phase", "Pending") == "Pending"
            ),
            key=lambda p: (p["metadata"].get("creationTimestamp", ""), *_key(p)),
        )
        for pod in waiting:
            reasons: Counter[str] = Counter()
            fitting: list[Obj] = []
            for node in nodes:
                why = refusal(pod, node, held.get(node["metadata"]["name"], (0, 0)))
                claimed = why is None and wants_claims(pod)
                if claimed and not self.claims.fits(pod, node["metadata"]["name"]):
                    why = "cannot allocate all claims"
                if why is None:
                    fitting.append(node)
                else:
                    reasons[why] += 1
            if not fitting:
                self._refuse(pod, unschedulable_message(reasons, len(nodes)))
                continue
            owner = controllers.controller_uid(pod)
            chosen = min(
                fitting,
                key=lambda n: (siblings[(n["metadata"]["name"], owner)], *_preference(n, held)),
            )
            name = chosen["metadata"]["name"]
            siblings[(name, owner)] += 1
            gpus, count = held.get(name, (0, 0))
            held[name] = (gpus + gpus_requested(pod), count + 1)
            if wants_claims(pod):
                self.claims.allocate(pod, name)
            self._bind(pod, name)

    def _bind(self, pod: Obj, node: str) -> None:
        namespace, name = _key(pod)

        def bind(obj: Obj) -> None:
            obj["spec"]["nodeName"] = node

        def scheduled(obj: Obj) -> None:
            podstatus.set_condition(obj.setdefault("status", {}), "PodScheduled", "True", now)

        now = self.registry.clock.now()
        with unless_gone():
            self.registry.mutate(kinds.PODS, namespace, name, bind, validate=False)
            self.registry.mutate(
                kinds.PODS, namespace, name, scheduled, subresource="status", validate=False
            )

    def _refuse(self, pod: Obj, message: str) -> None:
        namespace, name = _key(pod)
        now = self.registry.clock.now()

        def unschedulable(obj: Obj) -> None:
            podstatus.set_condition(
                obj.setdefault("status", {}),
                "PodScheduled",
                "False",
                now,
                reason="Unschedulable",
                message=message,
            )

        with unless_gone():
            self.registry.mutate(
                kinds.PODS, namespace, name, unschedulable, subresource="status", validate=False
            )


def _preference(node: Obj, held: dict[str, tuple[int, int]]) -> tuple[int, int, str]:
    name = node["metadata"]["name"]
    gpus, count = held.get(name, (0, 0))
    return (gpus - allocatable(node, GPU_RESOURCE), count, name)


def _key(obj: Obj) -> tuple[str, str]:
    return obj["metadata"].get("namespace", ""), obj["metadata"]["name"]
