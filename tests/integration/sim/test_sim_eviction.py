"""PodDisruptionBudget status and the eviction subresource, in upstream's order."""

from __future__ import annotations

import json

import pytest
from kubernetes.aio import client

from gpuop_sim import ApiServer
from gpuop_sim.cluster import workload_kinds
from tests.integration.sim.support import RawApi, pdb, pod, running

BLOCKED = "Cannot evict pod as it would violate the pod's disruption budget."
APP = {"app": "gpu"}


def eviction(name: str) -> dict[str, object]:
    return {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}}


def seed_pods(server: ApiServer, count: int, *, ready: bool = True) -> None:
    for index in range(count):
        server.seed(running(pod(f"gpu-{index}", labels=APP), ready=ready))


async def budget_status(
    api: client.ApiClient, name: str = "budget"
) -> client.V1PodDisruptionBudgetStatus:
    budget = await client.PolicyV1Api(api).read_namespaced_pod_disruption_budget(name, "default")
    return budget.status


@pytest.mark.parametrize(
    ("budget", "desired", "allowed"),
    [
        ({"minAvailable": 2}, 2, 1),
        ({"minAvailable": "50%"}, 2, 1),
        ({"minAvailable": "51%"}, 2, 1),
        ({"maxUnavailable": 1}, 2, 1),
        ({"maxUnavailable": "34%"}, 1, 2),
        ({"minAvailable": 3}, 3, 0),
    ],
)
async def test_budget_status_follows_pods_and_budget(
    server: ApiServer,
    api: client.ApiClient,
    budget: dict[str, int | str],
    desired: int,
    allowed: int,
) -> None:
    """Over the three pods of a ReplicaSet of three: a percentage or maxUnavailable counts
    from the controller's scale, an integer minAvailable from the pods selected."""
    workload_kinds.register(server.catalog)
    server.seed(replica_set("gpu", 3))
    for index in range(3):
        server.seed(owned(running(pod(f"gpu-{index}", labels=APP)), "gpu"))
    server.seed(running(pod("other", labels={"app": "net"})))

    await client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(
        "default", pdb("budget", APP, **budget)
    )
    status = await budget_status(api)

    assert status.expected_pods == 3
    assert status.current_healthy == 3
    assert status.desired_healthy == desired
    assert status.disruptions_allowed == allowed
    assert status.observed_generation == 1


@pytest.mark.parametrize("budget", [{"maxUnavailable": 1}, {"minAvailable": "50%"}])
async def test_a_scaled_budget_over_bare_pods_expects_none_and_allows_nothing(
    server: ApiServer, api: client.ApiClient, budget: dict[str, int | str]
) -> None:
    """As kube-controller-manager's disruption controller (the contract suite checks it
    there): bare pods have no scale to count from."""
    seed_pods(server, 3)
    await client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(
        "default", pdb("budget", APP, **budget)
    )
    status = await budget_status(api)

    assert (status.expected_pods, status.desired_healthy, status.disruptions_allowed) == (0, 0, 0)
    assert status.conditions[0].reason == "InsufficientPods"


def replica_set(name: str, replicas: int) -> dict[str, object]:
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": APP}},
    }


def owned(obj: dict[str, object], owner: str) -> dict[str, object]:
    metadata = obj["metadata"]
    assert isinstance(metadata, dict)
    metadata["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": owner,
            "uid": f"uid-{owner}",
            "controller": True,
        }
    ]
    return obj


async def test_not_ready_and_terminating_pods_are_not_healthy(
    server: ApiServer, api: client.ApiClient, core: client.CoreV1Api
) -> None:
    seed_pods(server, 3)
    server.seed(running(pod("gpu-3", labels=APP), ready=False))
    await client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(
        "default", pdb("budget", APP, minAvailable=1)
    )

    await core.delete_namespaced_pod("gpu-0", "default")
    status = await budget_status(api)

    assert (status.expected_pods, status.current_healthy, status.disruptions_allowed) == (4, 2, 1)


async def test_empty_selector_matches_no_pods(server: ApiServer, raw: RawApi) -> None:
    seed_pods(server, 2)
    body = pdb("budget", {}, minAvailable=1)

    status, created, _ = await raw.request(
        "POST", "/apis/policy/v1/namespaces/default/poddisruptionbudgets", body
    )
    _, current, _ = await raw.request(
        "GET", "/apis/policy/v1/namespaces/default/poddisruptionbudgets/budget"
    )

    assert status == 201
    assert "status" not in created
    assert current["status"]["expectedPods"] == 0
    assert current["status"]["disruptionsAllowed"] == 0


async def test_allowed_eviction_marks_pod_and_spends_a_disruption(
    server: ApiServer, api: client.ApiClient, core: client.CoreV1Api, raw: RawApi
) -> None:
    seed_pods(server, 3)
    await client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(
        "default", pdb("budget", APP, minAvailable=2)
    )

    status, body, _ = await raw.request(
        "POST", "/api/v1/namespaces/default/pods/gpu-0/eviction", eviction("gpu-0")
    )
    evicted = await core.read_namespaced_pod("gpu-0", "default")
    budget = await budget_status(api)

    assert status == 201
    assert body["status"] == "Success"
    assert evicted.metadata.deletion_timestamp is not None
    target = [c for c in evicted.status.conditions if c.type == "DisruptionTarget"]
    assert (target[0].status, target[0].reason, target[0].message) == (
        "True",
        "EvictionByEvictionAPI",
        "Eviction API: evicting",
    )
    assert budget.disruptions_allowed == 0
    assert budget.current_healthy == 2


async def test_eviction_blocked_by_budget_is_429_with_exact_message(
    server: ApiServer, api: client.ApiClient, core: client.CoreV1Api
) -> None:
    seed_pods(server, 2)
    await client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(
        "default", pdb("budget", APP, minAvailable=2)
    )

    with pytest.raises(client.ApiException) as raised:
        await core.create_namespaced_pod_eviction("gpu-0", "default", eviction("gpu-0"))

    body = json.loads(raised.value.body)
    assert raised.value.status == 429
    assert raised.value.headers["Content-Type"] == "application/json"
    assert "Retry-After" not in raised.value.headers
    assert body["reason"] == "TooManyRequests"
    assert body["message"] == BLOCKED
    assert body["details"]["causes"] == [
        {
            "reason": "DisruptionBudget",
            "message": "The disruption budget budget needs 2 healthy pods and has 2 currently",
        }
    ]
    pod_after = await core.read_namespaced_pod("gpu-0", "default")
    assert pod_after.metadata.deletion_timestamp is None


async def test_budget_not_yet_processed_is_429_with_retry_after(
    server: ApiServer, api: client.ApiClient, raw: RawApi
) -> None:
    seed_pods(server, 3)
    policy = client.PolicyV1Api(api)
    await policy.create_namespaced_pod_disruption_budget(
        "default", pdb("budget", APP, minAvailable=1)
    )
    server.pause_pdb_controller()
    await policy.patch_namespaced_pod_disruption_budget(
        "budget", "default", {"spec": {"minAvailable": 2}}
    )

    status, body, headers = await raw.request(
        "POST", "/api/v1/namespaces/default/pods/gpu-0/eviction", eviction("gpu-0")
    )
    server.resume_pdb_controller()
    retried, _, _ = await raw.request(
        "POST", "/api/v1/namespaces/default/pods/gpu-0/eviction", eviction("gpu-0")
    )

    assert status == 429
    assert headers["Retry-After"] == "10"
    assert body["details"]["retryAfterSeconds"] == 10
    assert body["details"]["causes"] == [
        {
            "reason": "DisruptionBudget",
            "message": "The disruption budget budget is still being processed by the server.",
        }
    ]
    assert retried == 201


async def test_more_than_one_budget_is_500_without_reason(
    server: ApiServer, api: client.ApiClient, raw: RawApi
) -> None:
    seed_pods(server, 2)
    policy = client.PolicyV1Api(api)
    await policy.create_namespaced_pod_disruption_budget("default", pdb("one", APP, minAvailable=1))
    await policy.create_namespaced_pod_disruption_budget("default", pdb("two", APP, minAvailable=1))

    status, body, _ = await raw.request(
        "POST", "/api/v1/namespaces/default/pods/gpu-0/eviction", eviction("gpu-0")
    )

    assert status == 500
    assert "reason" not in body
    assert body["message"] == (
        "This pod has more than one PodDisruptionBudget, which the eviction subresource does "
        "not support."
    )


async def test_eviction_name_mismatch_is_400_and_missing_pod_404(
    server: ApiServer, raw: RawApi
) -> None:
    seed_pods(server, 1)

    mismatch, body, _ = await raw.request(
        "POST", "/api/v1/namespaces/default/pods/gpu-0/eviction", eviction("other")
    )
    missing, _, _ = await raw.request(
        "POST", "/api/v1/namespaces/default/pods/ghost/eviction", eviction("ghost")
    )

    assert (mismatch, body["message"]) == (
        400,
        "name in URL does not match name in Eviction object",
    )
    assert missing == 404


async def test_pending_pod_is_evicted_without_consulting_budgets(
    server: ApiServer, api: client.ApiClient, core: client.CoreV1Api, raw: RawApi
) -> None:
    await core.create_namespaced_pod("default", pod("pending", labels=APP, node=None))
    await client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(
        "default", pdb("budget", APP, minAvailable=5)
    )

    status, _, _ = await raw.request(
        "POST", "/api/v1/namespaces/default/pods/pending/eviction", eviction("pending")
    )

    assert status == 201
    with pytest.raises(client.ApiException):
        await core.read_namespaced_pod("pending", "default")


async def test_not_ready_pod_of_healthy_budget_is_evicted_without_spending(
    server: ApiServer, api: client.ApiClient, raw: RawApi
) -> None:
    seed_pods(server, 2)
    server.seed(running(pod("sick", labels=APP), ready=False))
    await client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(
        "default", pdb("budget", APP, minAvailable=2)
    )

    status, _, _ = await raw.request(
        "POST", "/api/v1/namespaces/default/pods/sick/eviction", eviction("sick")
    )

    assert status == 201
    assert (await budget_status(api)).disruptions_allowed == 0


async def test_always_allow_policy_evicts_not_ready_pods_of_unhealthy_budget(
    server: ApiServer, api: client.ApiClient, raw: RawApi
) -> None:
    seed_pods(server, 1, ready=False)
    budget = pdb("budget", APP, minAvailable=1)
    budget["spec"]["unhealthyPodEvictionPolicy"] = "AlwaysAllow"
    await client.PolicyV1Api(api).create_namespaced_pod_disruption_budget("default", budget)

    status, _, _ = await raw.request(
        "POST", "/api/v1/namespaces/default/pods/gpu-0/eviction", eviction("gpu-0")
    )

    assert status == 201


async def test_budget_with_both_min_and_max_is_422(api: client.ApiClient) -> None:
    with pytest.raises(client.ApiException) as raised:
        await client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(
            "default", pdb("budget", APP, minAvailable=1, maxUnavailable=1)
        )
    assert raised.value.status == 422
    assert "minAvailable and maxUnavailable cannot be both set" in raised.value.body
