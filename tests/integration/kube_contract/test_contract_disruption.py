"""PodDisruptionBudget status (the disruption controller's) and the eviction subresource."""

from __future__ import annotations

from typing import Any

from tests.integration.kube_contract.conftest import Api, pod
from tests.support.waiting import eventually

BLOCKED = "Cannot evict pod as it would violate the pod's disruption budget."
APP = {"app": "gpu"}


def running(obj: dict[str, Any]) -> dict[str, Any]:
    return {
        **obj,
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def budget(**spec: int | str) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "budget"},
        "spec": {"selector": {"matchLabels": APP}, **spec},
    }


def eviction(name: str) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}}


async def budget_status(api: Api, allowed: int) -> dict[str, Any]:
    path = f"/apis/policy/v1/namespaces/{api.namespace}/poddisruptionbudgets/budget"

    async def settled() -> dict[str, Any] | None:
        _, found = await api.request("GET", path)
        status = found.get("status") or {}
        observed = status.get("observedGeneration") == found["metadata"]["generation"]
        settled = observed and status.get("disruptionsAllowed") == allowed
        return status if settled and status.get("conditions") else None

    return await eventually(settled, 30, interval=0.2)


async def test_a_budget_counts_healthy_pods_and_allows_the_difference(api: Api) -> None:
    for index in range(3):
        await api.seed(running(pod(f"gpu-{index}", APP)))
    await api.seed(pod("pending", APP))  # not ready: expected, not healthy
    await api.seed(budget(minAvailable=2))

    status = await budget_status(api, 1)

    assert (status["expectedPods"], status["currentHealthy"], status["desiredHealthy"]) == (4, 3, 2)
    assert status["observedGeneration"] == 1
    reasons = {c["type"]: c["reason"] for c in status["conditions"]}
    assert reasons == {"DisruptionAllowed": "SufficientPods"}


async def test_an_eviction_the_budget_forbids_is_429_and_an_allowed_one_deletes(api: Api) -> None:
    for index in range(2):
        await api.seed(running(pod(f"gpu-{index}", APP)))
    await api.seed(budget(minAvailable=1))
    await budget_status(api, 1)
    base = f"/api/v1/namespaces/{api.namespace}/pods"

    first, answer = await api.request("POST", f"{base}/gpu-0/eviction", eviction("gpu-0"))
    assert first == 201, answer
    assert answer["kind"] == "Status" and answer["status"] == "Success"
    _, evicted = await api.request("GET", f"{base}/gpu-0")
    assert evicted.get("code") == 404 or evicted["metadata"].get("deletionTimestamp")

    second, refused = await api.request("POST", f"{base}/gpu-1/eviction", eviction("gpu-1"))
    assert second == 429, refused
    assert refused["reason"] == "TooManyRequests"
    assert refused["message"] == BLOCKED
    assert refused["details"]["causes"][0]["reason"] == "DisruptionBudget"


async def test_max_unavailable_over_pods_with_no_controller_allows_nothing(api: Api) -> None:
    """maxUnavailable needs the pods' controller's scale to count from; bare pods have none,
    so the disruption controller expects no pods and allows no disruption."""
    for index in range(3):
        await api.seed(running(pod(f"gpu-{index}", APP)))
    await api.seed(budget(maxUnavailable=1))

    status = await budget_status(api, 0)
    base = f"/api/v1/namespaces/{api.namespace}/pods"
    refused, answer = await api.request("POST", f"{base}/gpu-0/eviction", eviction("gpu-0"))

    assert (status["expectedPods"], status["desiredHealthy"]) == (0, 0)
    assert {c["type"]: c["reason"] for c in status["conditions"]} == {
        "DisruptionAllowed": "InsufficientPods"
    }
    assert (refused, answer["message"]) == (429, BLOCKED)


async def test_a_pod_under_two_budgets_cannot_be_evicted(api: Api) -> None:
    await api.seed(running(pod("gpu-0", APP)))
    await api.seed(budget(minAvailable=0))
    second = budget(minAvailable=0)
    second["metadata"]["name"] = "second"
    await api.seed(second)
    await budget_status(api, 1)
    path = f"/api/v1/namespaces/{api.namespace}/pods/gpu-0/eviction"

    status, answer = await api.request("POST", path, eviction("gpu-0"))

    assert status == 500
    assert answer["message"] == (
        "This pod has more than one PodDisruptionBudget, which the eviction subresource does "
        "not support."
    )


async def test_evicting_a_missing_pod_is_404_and_a_pod_with_no_budget_goes(api: Api) -> None:
    await api.seed(running(pod("free")))
    base = f"/api/v1/namespaces/{api.namespace}/pods"

    missing, answer = await api.request("POST", f"{base}/nope/eviction", eviction("nope"))
    free, _ = await api.request("POST", f"{base}/free/eviction", eviction("free"))

    assert (missing, answer["reason"]) == (404, "NotFound")
    assert answer["message"] == 'pods "nope" not found'
    assert free == 201


async def test_an_eviction_naming_another_pod_is_400(api: Api) -> None:
    await api.seed(running(pod("p")))
    path = f"/api/v1/namespaces/{api.namespace}/pods/p/eviction"
    status, answer = await api.request("POST", path, eviction("someone-else"))

    assert (status, answer["reason"]) == (400, "BadRequest")
