"""Which PodDisruptionBudget refused an eviction, and whether it already counted one of
the pod.

Called by `draining` when the eviction subresource answers 429. The API server names the
budget in the Status cause (`{"reason": "DisruptionBudget", "message": "The disruption
budget <name> needs 2 healthy pods and has 2 currently"}`); when a server or proxy drops
the causes, the budgets of the pod's namespace are listed and matched against its labels,
as the server itself does (a policy/v1 budget with an empty selector selects nothing).

`counted`: the eviction subresource first counts the eviction in the budget's status
(`disruptionsAllowed` down by one, the pod's name and the time in `disruptedPods`), then
deletes the pod with the request's context. A client that dies in between (a leader
SIGKILLed mid-eviction) cancels that context: the count stays, the pod stays, and every
eviction under the budget is refused until the disruption controller drops the entry two
minutes later. Evicting the pod again would need a second disruption; it is already paid
for, so the drain deletes it instead (`draining`).
"""

from __future__ import annotations

import datetime
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


async def counted(kube: Kube, budget: str, pod: Mapping[str, Any]) -> bool:
    """Whether `budget` (`namespace/name`) counts an eviction of this incarnation of `pod`
    that has not happened: its name is in the budget's `status.disruptedPods`, recorded no
    earlier than the pod was created (an entry of an earlier pod of the same name, say a
    StatefulSet's, is someone else's), and the pod is not terminating."""
    metadata = pod.get("metadata") or {}
    if metadata.get("deletionTimestamp"):
        return False
    namespace, _, name = budget.partition("/")
    try:  # a LIST of the one name: the orchestrator's role may list budgets, not get them
        listed = await kube.call(
            kube.policy.list_namespaced_pod_disruption_budget,
            namespace,
            field_selector=f"metadata.name={name}",
        )
    except errors.KubeError:
        return False
    found = (listed.get("items") or [{}])[0]
    disrupted = ((found.get("status") or {}).get("disruptedPods") or {}).get(metadata.get("name"))
    created = metadata.get("creationTimestamp")
    if not disrupted or not created:
        return False
    return _instant(disrupted) >= _instant(created)


def _instant(value: object) -> datetime.datetime:
    """An RFC 3339 time of the API (`2026-12-02T08:00:00Z`), or one a client already parsed."""
    if isinstance(value, datetime.datetime):
        return value
    return datetime.datetime.fromisoformat(str(value))
