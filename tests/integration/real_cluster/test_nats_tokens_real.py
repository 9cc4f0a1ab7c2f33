"""The NATS auth callout's token review against the real kube-apiserver: a token requested
for audience gpuop-nats and bound to a pod on a KWOK node is accepted by the TokenReview API
with that node in its extra attributes, so the callout admits the node agent for that node
only; a token for another audience, a token whose pod is gone, and no token at all are
refused with their reasons."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuop.bus import callouts, grants, natsjwt, nkeys, reviewers
from gpuop.kube import client as kubeclient
from gpuop.kube.tokenreviews import KubeTokenReviewer, unverified_claims
from tests.support.callouts import authorization_request
from tests.support.control_plane import ControlPlane
from tests.support.service_account_tokens import SERVICE_ACCOUNT, agent_pod, token_for

pytestmark = [pytest.mark.real_cluster, pytest.mark.security]


@pytest.fixture
def namespace(plane: ControlPlane) -> Iterator[str]:
    name = f"nats-tokens-{uuid.uuid4().hex[:6]}"
    plane.call("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    plane.call(
        "POST",
        f"/api/v1/namespaces/{name}/serviceaccounts",
        {"metadata": {"name": SERVICE_ACCOUNT}, "automountServiceAccountToken": False},
    )
    try:
        yield name
    finally:
        plane.request(f"/api/v1/namespaces/{name}", method="DELETE")


@pytest.fixture
async def reviewer(plane: ControlPlane, tmp_path: Path) -> AsyncIterator[KubeTokenReviewer]:
    kubeconfig = plane.write_kubeconfig(tmp_path / "admin.kubeconfig")
    async with await kubeclient.connect(kubeconfig) as kube:
        yield KubeTokenReviewer(kube, timeout=5.0)


def node_of(plane: ControlPlane) -> str:
    nodes = plane.call("GET", "/api/v1/nodes")["items"]
    name: str = sorted(node["metadata"]["name"] for node in nodes)[0]
    return name


async def test_a_pod_bound_token_is_reviewed_with_its_node(
    plane: ControlPlane, namespace: str, reviewer: KubeTokenReviewer
) -> None:
    node = node_of(plane)
    token = token_for(plane, namespace, pod=agent_pod(plane, namespace, node))

    reviewed = await reviewer.review(token)

    assert reviewed.username == f"system:serviceaccount:{namespace}:{SERVICE_ACCOUNT}"
    assert reviewed.extra[reviewers.NODE_NAME] == (node,)
    assert reviewed.node == node
    assert reviewed.expires is not None
    assert time.time() + 500 < reviewed.expires <= time.time() + 601

    # and the callout makes of it a driver-manager of that node, and of no other
    accounts = callouts.Accounts.parse([f"{namespace}/{SERVICE_ACCOUNT}=driver-manager"])
    issuer = nkeys.KeyPair.generate(nkeys.Kind.ACCOUNT)
    authorizer = callouts.Authorizer(issuer, reviewer, accounts, review_timeout=5.0)
    decision = await authorizer.authorize(authorization_request(token, issuer=issuer.public_key)[0])
    assert decision.identity == grants.Identity("driver-manager", node)
    assert decision.response is not None
    answer = natsjwt.decode(
        decision.response, type=natsjwt.AUTHORIZATION_RESPONSE, issuer_kind=nkeys.Kind.ACCOUNT
    )
    user = natsjwt.decode(answer["nats"]["jwt"], type=natsjwt.USER, issuer_kind=nkeys.Kind.ACCOUNT)
    assert user["name"] == f"driver-manager@{node}"
    assert user["exp"] <= reviewed.expires


async def test_a_token_for_another_audience_is_refused(
    plane: ControlPlane, namespace: str, reviewer: KubeTokenReviewer
) -> None:
    pod = agent_pod(plane, namespace, node_of(plane))
    api_token = token_for(
        plane, namespace, pod=pod, audience="https://kubernetes.default.svc.cluster.local"
    )
    with pytest.raises(reviewers.TokenRefused) as refused:
        await reviewer.review(api_token)
    assert refused.value.reason == "wrong-audience"
    assert "not gpuop-nats" in refused.value.detail


async def test_a_token_whose_pod_is_gone_or_no_token_at_all_is_refused(
    plane: ControlPlane, namespace: str, reviewer: KubeTokenReviewer
) -> None:
    pod = agent_pod(plane, namespace, node_of(plane))
    token = token_for(plane, namespace, pod=pod)
    name = pod["metadata"]["name"]
    plane.call("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}?gracePeriodSeconds=0")

    # the API server stops accepting a bound token once its pod is gone
    async def refusal() -> str:
        while True:
            try:
                await reviewer.review(token)
            except reviewers.TokenRefused as exc:
                return exc.reason
            await asyncio.sleep(0.2)

    reasons = [await asyncio.wait_for(refusal(), 60)]
    assert reasons == ["not-authenticated"]
    with pytest.raises(reviewers.TokenRefused, match="not-authenticated"):
        await reviewer.review("not-a-token")


async def test_an_unbound_token_reviews_without_a_node(
    plane: ControlPlane, namespace: str, reviewer: KubeTokenReviewer
) -> None:
    reviewed = await reviewer.review(token_for(plane, namespace, pod=None))
    assert reviewed.node is None


class ReviewerBefore130(KubeTokenReviewer):
    """The reviewer on an API server that puts no node in its reviews (before 1.30)."""

    @staticmethod
    def _extra(user: dict[str, Any]) -> dict[str, tuple[str, ...]]:
        extra = KubeTokenReviewer._extra(user)
        extra.pop(reviewers.NODE_NAME, None)
        return extra


async def test_without_a_node_in_the_review_the_node_comes_from_the_bound_pod(
    plane: ControlPlane, namespace: str, reviewer: KubeTokenReviewer
) -> None:
    node = node_of(plane)
    pod = agent_pod(plane, namespace, node)
    token = token_for(plane, namespace, pod=pod)
    older = ReviewerBefore130(reviewer._kube, timeout=5.0)
    assert (await older.review(token)).node == node

    # a pod of the same name but another uid is not the token's pod
    claims = unverified_claims(token)
    claims["kubernetes.io"]["pod"]["uid"] = "00000000-0000-0000-0000-000000000000"
    assert await older.bound_pod_node(claims) is None
    assert await older.bound_pod_node({}) is None
