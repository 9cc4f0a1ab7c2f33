"""Which PodDisruptionBudget refused an eviction.

Called by `draining` when the eviction subresource answers 429. The API server names the
budget in the Status cause (`{"reason": "DisruptionBudget", "message": "The disruption
budget <name> needs 2 healthy pods and has 2 currently"}`); when a server or proxy drops
the causes, the budgets of the pod's namespace are listed and matched against its labels,
as the server itself does (a policy/v1 budget with an empty selector selects nothing).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gpuop import selectors
from gpuop.kube import errors
from gpuop.kube.client import Kube

Obj = dict[str, Any]

_NAMED = re.compile(r"[Tt]he disruption budget (?P<name>[a-z0-9]([-a-z0-9.]*[a-z0-9])?)")


def named_in(error: errors.KubeError) -> str | None:
    """The budget a 429's causes (or message) name, if any."""
    texts = [str(cause.get("message") or "") for cause in error.causes] + [error.message]
    for text in texts:
        match = _NAMED.search(text)
        if match:
            return match.group("name")
    return None


def selects(budget: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """Whether the budget's label selector selects the pod."""
    requirements = selectors.from_label_selector((budget.get("spec") or {}).get("selector") or {})
    if not requirements:
        return False  # policy/v1: an empty selector selects nothing
    return selectors.matches(requirements, (pod.get("metadata") or {}).get("labels") or {})


async def blocking(kube: Kube, pod: Mapping[str, Any], error: errors.KubeError) -> str | None:
    """The budget (`namespace/name`) that refused evicting `pod` with `error`, if known."""
    namespace = str((pod.get("metadata") or {}).get("namespace") or "")
    name = named_in(error)
    if name is not None:
        return f"{namespace}/{name}"
    try:
        listed = await kube.call(kube.policy.list_namespaced_pod_disruption_budget, namespace)
    except errors.KubeError:
        return None
    for budget in listed.get("items") or []:
        if selects(budget, pod):
            return f"{namespace}/{budget['metadata']['name']}"
    return None
