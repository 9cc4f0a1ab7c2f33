"""Minimal Deployment and ReplicaSet controllers for the simulated cluster.

Level-triggered, like kube-controller-manager's, and just enough for drains to behave as
on a real cluster:

- a Deployment keeps one ReplicaSet per pod template (``<name>-<pod-template-hash>``)
  scaled to its ``replicas`` and the older ones scaled to zero (a template change
  replaces every pod at once, as ``Recreate`` does), and rolls their status up;
- a ReplicaSet keeps ``replicas`` active pods: a pod that is evicted or deleted stops
  counting as soon as it is terminating, so its replacement is created (and scheduled
  elsewhere if its node is cordoned) while it still drains, which is what lets
  PodDisruptionBudgets recover. Surplus pods go least useful first: unbound, not
  running, not ready, newest.

Shared controller plumbing is in ``controllers.py``. ``cluster.py`` creates the
controller; it runs on a :class:`~gpuop_sim.cluster.wakeups.Wakeup`.
"""

from __future__ import annotations

import random
from typing import Any

from gpuop_sim.apiserver import kinds, pdb
from gpuop_sim.apiserver.registry import Registry
from gpuop_sim.apiserver.timestamps import format_time
from gpuop_sim.cluster import controllers
from gpuop_sim.cluster.wakeups import unless_gone
from gpuop_sim.cluster.workload_kinds import DEPLOYMENTS, REPLICASETS

Obj = dict[str, Any]

HASH_LABEL = "pod-template-hash"
_WATCHED = {r.group_resource for r in (kinds.PODS, DEPLOYMENTS, REPLICASETS)}


class DeploymentController(controllers.WorkloadController):
    """Keeps Deployments' ReplicaSets, and every ReplicaSet's pods."""

    def __init__(self, registry: Registry, rng: random.Random) -> None:
        super().__init__(registry, rng, "deployment controller", _WATCHED)

    def sync(self) -> None:
        store = self.registry.store
        for deployment in controllers.live(store, DEPLOYMENTS):
            self._sync_deployment(deployment)
        owned = controllers.owned_pods(store)
        for replicaset in store.view(REPLICASETS.group_resource):
            self._sync_replicaset(replicaset, owned.get(replicaset["metadata"]["uid"], []))
        for deployment in controllers.live(store, DEPLOYMENTS):
            status = self._deployment_status(deployment)
            controllers.write_status(self.registry, DEPLOYMENTS, deployment, status)

    def _replicasets_of(self, deployment: Obj) -> list[Obj]:
        uid = deployment["metadata"]["uid"]
        namespace = deployment["metadata"]["namespace"]
        return [
            rs
            for rs in self.registry.store.view(REPLICASETS.group_resource, namespace)
            if controllers.controller_uid(rs) == uid
        ]

    # Deployments.

    def _sync_deployment(self, deployment: Obj) -> None:
        metadata, spec = deployment["metadata"], deployment["spec"]
        digest = controllers.template_hash(spec["template"])
        replicasets = self._replicasets_of(deployment)
        current = [rs for rs in replicasets if rs["metadata"]["labels"].get(HASH_LABEL) == digest]
        for old in replicasets:
            if old not in current and old["spec"].get("replicas") != 0:
                self._scale(old, 0)
        if current:
            if current[0]["spec"].get("replicas") != spec["replicas"]:
                self._scale(current[0], spec["replicas"])
            return
        template = controllers.from_template(deployment, "", labels={HASH_LABEL: digest})
        selector = spec["selector"]
        replicaset = {
            "metadata": {
                **template["metadata"],
                "name": f"{metadata['name']}-{digest}",
                "annotations": {
                    "deployment.kubernetes.io/desired-replicas": str(spec["replicas"]),
                    "deployment.kubernetes.io/revision": str(len(replicasets) + 1),
                },
            },
            "spec": {
                "replicas": spec["replicas"],
                "selector": {
                    **selector,
                    "matchLabels": {**(selector.get("matchLabels") or {}), HASH_LABEL: digest},
                },
                "template": {
                    "metadata": {
                        "labels": template["metadata"]["labels"],
                        "annotations": template["metadata"]["annotations"],
                    },
                    "spec": template["spec"],
                },
            },
        }
        controllers.create(self.registry, REPLICASETS, metadata["namespace"], replicaset)

    def _scale(self, replicaset: Obj, replicas: int) -> None:
        def scale(obj: Obj) -> None:
            obj["spec"]["replicas"] = replicas

        with unless_gone():
            metadata = replicaset["metadata"]
            self.registry.mutate(REPLICASETS, metadata["namespace"], metadata["name"], scale)

    def _deployment_status(self, deployment: Obj) -> Obj:
        spec, old = deployment["spec"], deployment.get("status") or {}
        digest = controllers.template_hash(spec["template"])
        total = {"replicas": 0, "readyReplicas": 0, "availableReplicas": 0, "updatedReplicas": 0}
        newest = ""
        for replicaset in self._replicasets_of(deployment):
            counted = replicaset.get("status") or {}
            for key in ("replicas", "readyReplicas", "availableReplicas"):
                total[key] += counted.get(key, 0)
            if replicaset["metadata"]["labels"].get(HASH_LABEL) == digest:
                total["updatedReplicas"] = counted.get("replicas", 0)
                newest = replicaset["metadata"]["name"]
        desired = spec["replicas"]
        rolling = (spec.get("strategy") or {}).get("rollingUpdate") or {}
        max_unavailable = rolling.get("maxUnavailable", 0)
        if isinstance(max_unavailable, str):  # a percentage, rounded down
            tolerated = int(max_unavailable.rstrip("%")) * desired // 100
        else:
            tolerated = int(max_unavailable)
        available = total["availableReplicas"] >= desired - tolerated
        stamp = format_time(self.registry.clock.now())
        status: Obj = {"observedGeneration": deployment["metadata"].get("generation", 1)}
        status.update({key: value for key, value in total.items() if value})
        if desired > total["availableReplicas"]:
            status["unavailableReplicas"] = desired - total["availableReplicas"]
        if available:
            availability = (
                "True",
                "MinimumReplicasAvailable",
                "Deployment has minimum availability.",
            )
        else:
            availability = (
                "False",
                "MinimumReplicasUnavailable",
                "Deployment does not have minimum availability.",
            )
        progressing = (
            "True",
            "NewReplicaSetAvailable",
            f'ReplicaSet "{newest}" has successfully progressed.',
        )
        status["conditions"] = [
            controllers.condition(old, "Available", *availability, stamp),
            controllers.condition(old, "Progressing", *progressing, stamp),
        ]
        return status

    # ReplicaSets.

    def _sync_replicaset(self, replicaset: Obj, pods: list[Obj]) -> None:
        active = [pod for pod in pods if controllers.is_active(pod)]
        wanted = (
            0 if replicaset["metadata"].get("deletionTimestamp") else replicaset["spec"]["replicas"]
        )
        for _ in range(wanted - len(active)):
            created = controllers.create_pod(self.registry, self.rng, replicaset)
            if created is not None:
                active.append(created)
        if len(active) > wanted:
            # Delete the pods that matter least first: unbound, not running, not ready, newest.
            newest_first = sorted(
                active, key=lambda p: p["metadata"].get("creationTimestamp", ""), reverse=True
            )
            ranked = sorted(
                newest_first,
                key=lambda p: (
                    bool(p["spec"].get("nodeName")),
                    (p.get("status") or {}).get("phase") == "Running",
                    pdb.is_ready(p),
                ),
            )
            for pod in ranked[: len(active) - wanted]:
                controllers.delete_pod(self.registry, pod)
                active.remove(pod)
        ready = sum(1 for pod in active if pdb.is_healthy(pod))
        status: Obj = {
            "replicas": len(active),
            "fullyLabeledReplicas": len(active),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "observedGeneration": replicaset["metadata"].get("generation", 1),
        }
        shown = {k: v for k, v in status.items() if v}
        controllers.write_status(self.registry, REPLICASETS, replicaset, shown)
