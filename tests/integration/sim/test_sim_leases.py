"""Leases as leader election uses them: plain objects guarded by resourceVersion."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from kubernetes.aio import client

from tests.integration.sim.support import RawApi

LEASES = "/apis/coordination.k8s.io/v1/namespaces/default/leases"


def lease(holder: str) -> dict[str, object]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "gpuop-orchestrator"},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": 15,
            # a nonzero microsecond: the official client writes a datetime back with
            # isoformat(), which drops a zero fraction, and kube-apiserver then refuses it
            "acquireTime": datetime(2026, 1, 1, 0, 0, 0, 1, tzinfo=UTC).isoformat(),
            "renewTime": "2026-01-01T00:00:01.500000+00:00",
            "leaseTransitions": 0,
        },
    }


async def test_only_one_candidate_wins_a_contested_lease(api: client.ApiClient) -> None:
    leases = client.CoordinationV1Api(api)
    await leases.create_namespaced_lease("default", lease("old-leader"))
    read = await leases.read_namespaced_lease("gpuop-orchestrator", "default")

    async def take_over(candidate: str) -> bool:
        body = api.sanitize_for_serialization(read)
        body["spec"]["holderIdentity"] = candidate
        body["spec"]["leaseTransitions"] = 1
        try:
            await leases.replace_namespaced_lease("gpuop-orchestrator", "default", body)
        except client.ApiException as error:
            assert error.status == 409
            return False
        return True

    outcomes = await asyncio.gather(take_over("a"), take_over("b"), take_over("c"))
    winner = await leases.read_namespaced_lease("gpuop-orchestrator", "default")

    assert sorted(outcomes) == [False, False, True]
    assert winner.spec.holder_identity == ["a", "b", "c"][outcomes.index(True)]


async def test_lease_times_come_back_as_micro_time(raw: RawApi) -> None:
    sloppy = lease("me")
    sloppy["spec"]["renewTime"] = "2026-01-01T00:00:01.5+00:00"  # type: ignore[index]
    refused, answer, _ = await raw.request("POST", LEASES, sloppy)
    status, created, _ = await raw.request("POST", LEASES, lease("me"))

    assert refused == 400  # kube-apiserver wants exactly six digits (the contract suite)
    assert 'cannot parse ".5+00:00" as ".000000"' in answer["message"]
    assert status == 201
    assert created["spec"]["acquireTime"] == "2026-01-01T00:00:00.000001Z"
    assert created["spec"]["renewTime"] == "2026-01-01T00:00:01.500000Z"


async def test_lease_time_without_timezone_is_400(raw: RawApi) -> None:
    body = lease("me")
    body["spec"]["renewTime"] = "2026-01-01T00:00:00"  # type: ignore[index]

    status, answer, _ = await raw.request("POST", LEASES, body)

    assert (status, answer["reason"]) == (400, "BadRequest")
