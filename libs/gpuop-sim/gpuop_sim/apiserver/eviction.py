"""The ``pods/eviction`` subresource, as ``pkg/registry/core/pod/storage/eviction.go``.

Called by the HTTP handlers for ``POST .../pods/{name}/eviction``. In order: a body name
that differs from the URL is 400; a missing pod is 404; a pod that is Pending, Succeeded,
Failed or already terminating is deleted without looking at budgets; more than one
matching PodDisruptionBudget is a 500; a not-Ready pod is deleted without using up a
disruption when the budget is healthy (or its policy is ``AlwaysAllow``); a budget the
controller has not caught up with, or one with no disruptions left, answers 429
``TooManyRequests`` with a ``DisruptionBudget`` cause; otherwise the budget is decremented,
the pod recorded in ``disruptedPods``, marked with the ``DisruptionTarget`` condition and
deleted (gracefully, like any delete), and the answer is 201 with a success Status.

The not-Ready exemption is checked before the budget's own state, as upstream does; the
reference table lists it after, which would make a Ready-less pod of a budget at exactly
``desiredHealthy`` unevictable, unlike a real cluster.
"""

from __future__ import annotations

from typing import Any

from gpuop_sim.apiserver import deletion, errors, kinds, pdb
from gpuop_sim.apiserver.deletion import DeleteOptions
from gpuop_sim.apiserver.registry import Registry
from gpuop_sim.apiserver.timestamps import format_time

Obj = dict[str, Any]

BLOCKED = "Cannot evict pod as it would violate the pod's disruption budget."
MULTIPLE_BUDGETS = (
    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not "
    "support."
)
SUCCESS: Obj = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Success",
    "code": 201,
}


def _budget_cause(message: str) -> list[Obj]:
    return [{"reason": "DisruptionBudget", "message": message}]


def evict(registry: Registry, namespace: str, name: str, eviction: Obj) -> Obj:
    """Evict a pod; returns the success Status or raises the ApiError to answer with."""
    if (eviction.get("metadata") or {}).get("name") != name:
        raise errors.bad_request("name in URL does not match name in Eviction object")
    pod = registry.get(kinds.PODS, namespace, name)
    options = DeleteOptions.from_body(eviction.get("deleteOptions"))
    phase = (pod.get("status") or {}).get("phase")
    if phase in ("Succeeded", "Failed", "Pending") or pod["metadata"].get("deletionTimestamp"):
        return _delete(registry, pod, options)
    budgets = [
        budget
        for budget in registry.store.view(kinds.PODDISRUPTIONBUDGETS.group_resource, namespace)
        if pdb.selects(budget, pod)
    ]
    if len(budgets) > 1:
        raise errors.ApiError(500, "", MULTIPLE_BUDGETS)
    if not budgets:
        return _delete(registry, pod, options)
    budget = budgets[0]
    status = budget.get("status") or {}
    if not pdb.is_ready(pod):
        policy = (budget.get("spec") or {}).get("unhealthyPodEvictionPolicy")
        current, desired = status.get("currentHealthy", 0), status.get("desiredHealthy", 0)
        if policy == "AlwaysAllow" or current >= desired > 0:
            # Deleting a not-Ready pod of a healthy application disrupts nothing.
            return _delete(registry, pod, options)
    _check_and_decrement(registry, budget, name, dry_run=options.dry_run)
    return _delete(registry, pod, options)


def _check_and_decrement(registry: Registry, budget: Obj, pod_name: str, *, dry_run: bool) -> None:
    name = budget["metadata"]["name"]
    status = budget.get("status") or {}
    if status.get("observedGeneration", 0) < budget["metadata"].get("generation", 1):
        raise errors.too_many_requests(
            BLOCKED,
            10,
            _budget_cause(f"The disruption budget {name} is still being processed by the server."),
        )
    allowed = status.get("disruptionsAllowed", 0)
    if allowed < 0:
        raise errors.forbidden(
            kinds.PODDISRUPTIONBUDGETS.group_resource, name, "pdb disruptions allowed is negative"
        )
    if allowed == 0:
        raise errors.too_many_requests(
            BLOCKED,
            0,
            _budget_cause(
                f"The disruption budget {name} needs {status.get('desiredHealthy', 0)} healthy "
                f"pods and has {status.get('currentHealthy', 0)} currently"
            ),
        )
    if dry_run:
        return
    now = format_time(registry.clock.now())

    def decrement(obj: Obj) -> None:
        obj_status = obj.setdefault("status", {})
        obj_status["disruptionsAllowed"] = allowed - 1
        obj_status.setdefault("disruptedPods", {})[pod_name] = now
        if allowed - 1 == 0:
            for condition in obj_status.get("conditions") or []:
                if (
                    condition.get("type") == "DisruptionAllowed"
                    and condition.get("status") == "True"
                ):
                    condition.update(
                        status="False", reason="InsufficientPods", lastTransitionTime=now
                    )

    registry.mutate(
        kinds.PODDISRUPTIONBUDGETS,
        budget["metadata"]["namespace"],
        name,
        decrement,
        subresource="status",
        validate=False,
    )


def _delete(registry: Registry, pod: Obj, options: DeleteOptions) -> Obj:
    """Mark the pod as a disruption target, then delete it with the eviction's options."""
    metadata = pod["metadata"]
    namespace, name = metadata["namespace"], metadata["name"]
    deletion.check_preconditions(kinds.PODS, pod, options)
    wanted = options.precondition_resource_version
    if options.dry_run:
        return dict(SUCCESS)
    now = format_time(registry.clock.now())

    def mark(obj: Obj) -> None:
        conditions = obj.setdefault("status", {}).setdefault("conditions", [])
        for condition in conditions:
            if condition.get("type") == "DisruptionTarget":
                if condition.get("status") != "True":
                    condition["lastTransitionTime"] = now
                condition.update(
                    status="True", reason="EvictionByEvictionAPI", message="Eviction API: evicting"
                )
                return
        conditions.append(
            {
                "type": "DisruptionTarget",
                "status": "True",
                "lastTransitionTime": now,
                "reason": "EvictionByEvictionAPI",
                "message": "Eviction API: evicting",
            }
        )

    marked = registry.mutate(
        kinds.PODS, namespace, name, mark, subresource="status", validate=False
    )
    if wanted:
        # The condition write moved the version on; the caller's precondition held before it.
        options = DeleteOptions(
            grace_period_seconds=options.grace_period_seconds,
            propagation_policy=options.propagation_policy,
            precondition_uid=options.precondition_uid,
            precondition_resource_version=marked["metadata"]["resourceVersion"],
        )
    registry.delete(kinds.PODS, namespace, name, options)
    return dict(SUCCESS)
