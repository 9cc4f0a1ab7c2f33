"""The disruption controller: keeps PodDisruptionBudget status up to date.

Mirrors kubernetes ``pkg/controller/disruption/disruption.go`` closely enough for eviction
to behave as on a real cluster. It observes the store and recomputes the budgets of a
namespace after every pod or budget write: ``expectedPods`` (pods the selector matches; a
nil or empty selector matches none; with ``maxUnavailable`` or a percentage
``minAvailable``, the sum of the replicas their controllers ask for instead, pods with no
controller left out, so a budget over bare pods expects none and allows nothing, as
upstream's does), ``currentHealthy`` (Running and Ready, not terminating,
not recently evicted), ``desiredHealthy`` (``minAvailable``, or ``expectedPods -
maxUnavailable``, percentages of ``expectedPods`` rounded up), ``disruptionsAllowed`` and
``observedGeneration``. Evicted pods stay in ``disruptedPods`` until they terminate or two
minutes pass. Tests pause it to produce the "still being processed" 429.
"""

from __future__ import annotations

import asyncio
import math
from datetime import timedelta
from typing import Any

from gpuop_sim.apiserver import kinds
from gpuop_sim.apiserver.registry import Registry
from gpuop_sim.apiserver.resources import GroupResource
from gpuop_sim.apiserver.selectors import LabelSelector
from gpuop_sim.apiserver.store import Change
from gpuop_sim.apiserver.timestamps import format_time, parse_time

Obj = dict[str, Any]

DELETION_TIMEOUT = timedelta(minutes=2)
"""How long an evicted pod may take to start terminating before it counts again."""


def is_ready(pod: Obj) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def is_healthy(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running" and is_ready(pod)


_SCALED = {"Deployment": "deployments", "ReplicaSet": "replicasets", "StatefulSet": "statefulsets"}
"""Controllers whose scale a budget counts from, by kind: their apps/v1 resource."""


def controller_of(obj: Obj) -> Obj | None:
    for reference in obj["metadata"].get("ownerReferences") or []:
        if reference.get("controller"):
            return dict(reference)
    return None


def scaled(value: int | str, total: int) -> int:
    """An IntOrString budget against ``total``; percentages round up."""
    if isinstance(value, str):
        return math.ceil(int(value.rstrip("%")) * total / 100)
    return value


def selects(budget: Obj, pod: Obj) -> bool:
    """Whether a budget covers a pod; a nil or empty selector covers nothing."""
    selector = LabelSelector.from_spec((budget.get("spec") or {}).get("selector"))
    return selector is not None and selector.matches(pod)


def pods_selected(registry: Registry, budget: Obj) -> list[Obj]:
    namespace = budget["metadata"]["namespace"]
    return [
        pod
        for pod in registry.store.view(kinds.PODS.group_resource, namespace)
        if selects(budget, pod)
    ]


class DisruptionController:
    """Recomputes PodDisruptionBudget status after every relevant write."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.paused = False
        self._recheck: asyncio.TimerHandle | None = None
        registry.store.observe(self._on_change)

    def pause(self) -> None:
        """Stop recomputing, so budgets keep ``observedGeneration`` behind ``generation``."""
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        for budget in self.registry.store.view(kinds.PODDISRUPTIONBUDGETS.group_resource):
            self.reconcile(budget["metadata"]["namespace"], budget["metadata"]["name"])

    def close(self) -> None:
        if self._recheck is not None:
            self._recheck.cancel()

    def _on_change(self, change: Change) -> None:
        if self.paused:
            return
        namespace = change.object["metadata"].get("namespace", "")
        if change.resource == kinds.PODS.group_resource:
            for budget in self.registry.store.view(
                kinds.PODDISRUPTIONBUDGETS.group_resource, namespace
            ):
                self.reconcile(namespace, budget["metadata"]["name"])
        elif (
            change.resource == kinds.PODDISRUPTIONBUDGETS.group_resource
            and change.type != "DELETED"
        ):
            self.reconcile(namespace, change.object["metadata"]["name"])

    def reconcile(self, namespace: str, name: str) -> None:
        budget = self.registry.store.get(kinds.PODDISRUPTIONBUDGETS.group_resource, namespace, name)
        if budget is None:
            return
        status = self.compute(budget)
        if _comparable(status) == _comparable(budget.get("status") or {}):
            return

        def write(obj: Obj) -> None:
            obj["status"] = status

        self.registry.mutate(
            kinds.PODDISRUPTIONBUDGETS, namespace, name, write, subresource="status", validate=False
        )

    def compute(self, budget: Obj) -> Obj:
        spec, old = budget.get("spec") or {}, budget.get("status") or {}
        now = self.registry.clock.now()
        pods = pods_selected(self.registry, budget)
        disrupted: dict[str, str] = {}
        for pod in pods:
            when = (old.get("disruptedPods") or {}).get(pod["metadata"]["name"])
            if when is None or pod["metadata"].get("deletionTimestamp"):
                continue
            expires = parse_time(when) + DELETION_TIMEOUT
            if expires > now:
                disrupted[pod["metadata"]["name"]] = when
                self._recheck_at((expires - now).total_seconds())
        expected = self._expected(spec, pods)
        healthy = sum(
            1
            for pod in pods
            if not pod["metadata"].get("deletionTimestamp")
            and pod["metadata"]["name"] not in disrupted
            and is_healthy(pod)
        )
        if "minAvailable" in spec:
            desired = scaled(spec["minAvailable"], expected)
        elif "maxUnavailable" in spec:
            desired = max(expected - scaled(spec["maxUnavailable"], expected), 0)
        else:
            desired = 0
        allowed = max(healthy - desired, 0) if expected > 0 else 0
        generation = budget["metadata"].get("generation", 1)
        condition = {
            "type": "DisruptionAllowed",
            "status": "True" if allowed > 0 else "False",
            "reason": "SufficientPods" if allowed > 0 else "InsufficientPods",
            "message": "",
            "observedGeneration": generation,
            "lastTransitionTime": format_time(now),
        }
        for previous in old.get("conditions") or []:
            if (
                previous.get("type") == "DisruptionAllowed"
                and previous.get("status") == condition["status"]
            ):
                condition["lastTransitionTime"] = previous.get(
                    "lastTransitionTime", condition["lastTransitionTime"]
                )
        status: Obj = {
            "observedGeneration": generation,
            "disruptionsAllowed": allowed,
            "currentHealthy": healthy,
            "desiredHealthy": desired,
            "expectedPods": expected,
            "conditions": [condition],
        }
        if disrupted:
            status["disruptedPods"] = disrupted
        return status

    def _expected(self, spec: Obj, pods: list[Obj]) -> int:
        """The pods a budget counts from: those selected for an integer ``minAvailable``,
        else the scale of their controllers (upstream's ``getExpectedPodCount``)."""
        if "maxUnavailable" not in spec and not isinstance(spec.get("minAvailable"), str):
            return len(pods)
        scales: dict[tuple[str, str], int] = {}
        for pod in pods:
            owner = controller_of(pod)
            if owner is None:
                continue  # unmanaged: upstream warns (UnmanagedPods) and leaves it out
            found = self._scale_of(pod["metadata"]["namespace"], owner)
            if found is not None:
                scales[found[0]] = found[1]
        return sum(scales.values())

    def _scale_of(self, namespace: str, owner: Obj) -> tuple[tuple[str, str], int] | None:
        """(controller kind and name, its spec.replicas); a ReplicaSet that a Deployment
        owns answers with the Deployment's."""
        plural = _SCALED.get(owner.get("kind", ""))
        if plural is None:
            return None
        obj = self.registry.store.get(GroupResource("apps", plural), namespace, owner["name"])
        if obj is None:
            return None
        parent = controller_of(obj)
        if owner["kind"] == "ReplicaSet" and parent is not None and parent["kind"] == "Deployment":
            return self._scale_of(namespace, parent)
        replicas = (obj.get("spec") or {}).get("replicas", 1)
        return (owner["kind"], owner["name"]), int(replicas)

    def _recheck_at(self, delay: float) -> None:
        """Recompute when an evicted pod's grace to start terminating runs out."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._recheck is not None and self._recheck.when() <= loop.time() + delay:
            return
        if self._recheck is not None:
            self._recheck.cancel()
        self._recheck = loop.call_later(delay + 0.01, self._recheck_all)

    def _recheck_all(self) -> None:
        self._recheck = None
        if not self.paused:
            self.resume()


def _comparable(status: Obj) -> Obj:
    conditions = [
        {k: v for k, v in c.items() if k != "lastTransitionTime"}
        for c in status.get("conditions") or []
    ]
    return {**status, "conditions": conditions}
