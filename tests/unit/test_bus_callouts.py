"""The auth callout's decisions, without a server: a request is answered only when a server
signed it for this callout's issuer; a token makes a user of exactly its role's and node's
grants that expires with the token; every other token is refused with its reason in the
answer, the log and the metric, and never with an allow."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gpuop.bus import callouts, grants, natsjwt, nkeys, reviewers
from tests.support.callouts import SERVER, authorization_request

pytestmark = pytest.mark.security

ISSUER = nkeys.KeyPair.generate(nkeys.Kind.ACCOUNT)
NAMESPACE = "gpuop-system"
ACCOUNTS = callouts.Accounts.parse(
    [
        f"{NAMESPACE}/gpuop-driver-manager=driver-manager",
        f"{NAMESPACE}/gpuop-discovery=discovery",
        f"{NAMESPACE}/gpuop-upgrade-orchestrator=upgrade-orchestrator",
    ]
)


def sa(name: str) -> str:
    return f"system:serviceaccount:{NAMESPACE}:{name}"


def request(token: str | None, **options: Any) -> tuple[bytes, str]:
    options.setdefault("issuer", ISSUER.public_key)
    return authorization_request(token, **options)


class SlowReviewer:
    async def review(self, token: str) -> reviewers.ReviewedToken:
        await asyncio.sleep(30)
        raise AssertionError("not reached")


@pytest.fixture
def reviewer() -> reviewers.MemoryReviewer:
    return reviewers.MemoryReviewer()


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def authorizer(
    reviewer: reviewers.TokenReviewer, registry: CollectorRegistry, **options: Any
) -> callouts.Authorizer:
    metrics = callouts.CalloutMetrics(registry)
    return callouts.Authorizer(ISSUER, reviewer, ACCOUNTS, metrics=metrics, **options)


def counted(registry: CollectorRegistry, reason: str) -> float:
    value = registry.get_sample_value("gpuop_nats_auth_decisions_total", {"reason": reason})
    return value or 0.0


def response_of(decision: callouts.Decision) -> natsjwt.Claims:
    assert decision.response is not None
    return natsjwt.decode(
        decision.response, type=natsjwt.AUTHORIZATION_RESPONSE, issuer_kind=nkeys.Kind.ACCOUNT
    )


async def test_a_node_agents_token_makes_a_user_of_its_nodes_grants_only(
    reviewer: reviewers.MemoryReviewer, registry: CollectorRegistry
) -> None:
    token = reviewer.issue(sa("gpuop-driver-manager"), node="gpu-1", ttl=600)
    data, user = request(token)
    decision = await authorizer(reviewer, registry).authorize(data)

    assert decision.reason == "allowed"
    assert decision.identity == grants.Identity("driver-manager", "gpu-1")
    response = response_of(decision)
    assert response["iss"] == ISSUER.public_key
    assert response["sub"] == user
    assert response["aud"] == SERVER.public_key
    assert "error" not in response["nats"]
    jwt = natsjwt.decode(response["nats"]["jwt"], type=natsjwt.USER, issuer_kind=nkeys.Kind.ACCOUNT)
    assert jwt["iss"] == ISSUER.public_key
    assert (jwt["sub"], jwt["aud"], jwt["name"]) == (user, "GPUOP", "driver-manager@gpu-1")
    granted = grants.for_identity(grants.Identity("driver-manager", "gpu-1"))
    assert jwt["nats"]["pub"] == {"allow": list(granted.publish)}
    assert jwt["nats"]["sub"] == {"allow": list(granted.subscribe)}
    assert not any("gpu-2" in subject for subject in granted.publish + granted.subscribe)
    assert time.time() + 590 < jwt["exp"] <= time.time() + 600
    assert counted(registry, "allowed") == 1


async def test_a_user_never_outlives_max_lifetime_nor_its_token(
    reviewer: reviewers.MemoryReviewer, registry: CollectorRegistry
) -> None:
    long_lived = reviewer.issue(sa("gpuop-upgrade-orchestrator"), node="cp-1", ttl=86400)
    decision = await authorizer(reviewer, registry, max_lifetime=60).authorize(
        request(long_lived)[0]
    )
    jwt = natsjwt.decode(
        response_of(decision)["nats"]["jwt"], type=natsjwt.USER, issuer_kind=nkeys.Kind.ACCOUNT
    )
    assert jwt["exp"] <= time.time() + 60
    # a cluster role is one user whatever node its pod runs on
    assert decision.identity == grants.Identity("upgrade-orchestrator", None)
    assert jwt["name"] == "upgrade-orchestrator"


REFUSALS = [
    # reason, how the token is made, what the answer says
    ("no-token", lambda r: None, "without a token"),
    ("not-a-jwt", lambda r: "forged", "not a JWT"),
    ("not-authenticated", lambda r: "eyJhbGciOiJSUzI1NiJ9.e30.forged", "not one this authority"),
    ("not-authenticated", lambda r: r.issue(sa("gpuop-discovery"), node="n", ttl=-1), "expired"),
    (
        "wrong-audience",
        lambda r: r.issue(sa("gpuop-discovery"), node="n", audiences=("https://kubernetes",)),
        "not gpuop-nats",
    ),
    ("unknown-account", lambda r: r.issue(sa("default"), node="n"), "not a gpuop service account"),
    (
        "unknown-account",
        lambda r: r.issue("system:serviceaccount:other:gpuop-discovery", node="n"),
        "not a gpuop service account",
    ),
    ("no-node", lambda r: r.issue(sa("gpuop-driver-manager")), "bound to no node"),
    ("bad-node", lambda r: r.issue(sa("gpuop-driver-manager"), node="GPU 1"), "invalid node name"),
    ("no-expiry", lambda r: r.issue(sa("gpuop-discovery"), node="n", ttl=None), "never expires"),
    # a token made by hand for a cluster role (`kubectl create token`): no pod, a year long
    (
        "not-pod-bound",
        lambda r: r.issue(sa("gpuop-upgrade-orchestrator"), pod_bound=False),
        "bound to no pod",
    ),
    (
        "too-long-lived",
        lambda r: r.issue(sa("gpuop-upgrade-orchestrator"), ttl=365 * 86400),
        "over 86400 s",
    ),
]


@pytest.mark.parametrize(("reason", "make", "said"), REFUSALS, ids=[r[0] for r in REFUSALS])
async def test_every_refusal_answers_an_error_with_its_reason(
    reviewer: reviewers.MemoryReviewer,
    registry: CollectorRegistry,
    caplog: pytest.LogCaptureFixture,
    reason: str,
    make: Any,
    said: str,
) -> None:
    data, user = request(make(reviewer))
    with caplog.at_level(logging.WARNING, logger="gpuop.bus.callouts"):
        decision = await authorizer(reviewer, registry).authorize(data)

    assert decision.reason == reason
    assert decision.identity is None
    response = response_of(decision)
    assert "jwt" not in response["nats"]
    assert said in response["nats"]["error"]
    assert (response["sub"], response["aud"]) == (user, SERVER.public_key)
    assert counted(registry, reason) == 1
    assert counted(registry, "allowed") == 0
    assert f"refused a connection ({reason})" in caplog.text


async def test_a_failing_or_slow_authority_refuses(
    reviewer: reviewers.MemoryReviewer, registry: CollectorRegistry
) -> None:
    token = reviewer.issue(sa("gpuop-discovery"), node="n")
    reviewer.failing = ConnectionRefusedError("apiserver down")
    failed = await authorizer(reviewer, registry).authorize(request(token)[0])
    assert failed.reason == "reviewer-error"
    assert "apiserver down" in response_of(failed)["nats"]["error"]

    slow = await authorizer(SlowReviewer(), CollectorRegistry(), review_timeout=0.05).authorize(
        request(token)[0]
    )
    assert slow.reason == "reviewer-timeout"
    assert "took over 0.05 s" in response_of(slow)["nats"]["error"]


BAD_REQUESTS = [
    ("signed by an account", {"signer": nkeys.KeyPair.generate(nkeys.Kind.ACCOUNT)}, "server key"),
    (
        "for another issuer",
        {"issuer": nkeys.KeyPair.generate(nkeys.Kind.ACCOUNT).public_key},
        "issuer",
    ),
    ("another audience", {"audience": "nats-authorization-response"}, "audience"),
    ("expired", {"expires_in": -30}, "expired"),
    ("no user key", {"user_nkey": SERVER.public_key}, "user_nkey"),
]


@pytest.mark.parametrize(
    ("what", "options", "said"), BAD_REQUESTS, ids=[r[0] for r in BAD_REQUESTS]
)
async def test_a_request_no_server_made_for_this_callout_gets_no_answer(
    reviewer: reviewers.MemoryReviewer,
    registry: CollectorRegistry,
    what: str,
    options: dict[str, Any],
    said: str,
) -> None:
    token = reviewer.issue(sa("gpuop-discovery"), node="n")
    decision = await authorizer(reviewer, registry).authorize(request(token, **options)[0])
    assert decision.reason == "bad-request"
    assert said in decision.detail
    assert decision.response is None
    assert reviewer.reviews == 0
    assert counted(registry, "bad-request") == 1


async def test_garbage_is_a_bad_request() -> None:
    decision = await authorizer(reviewers.MemoryReviewer(), CollectorRegistry()).authorize(b"\xff")
    assert (decision.reason, decision.response) == ("bad-request", None)


def test_the_account_table_names_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="NAMESPACE/SERVICEACCOUNT=ROLE"):
        callouts.Accounts.parse(["gpuop-discovery=discovery"])
    with pytest.raises(ValueError, match="'gpu-admin', which is not a gpuop role"):
        callouts.Accounts.parse(["ns/sa=gpu-admin"])
    assert ACCOUNTS.role(sa("gpuop-discovery")) == "discovery"


def test_only_an_account_key_issues() -> None:
    with pytest.raises(ValueError, match="must be an account key"):
        callouts.Authorizer(
            nkeys.KeyPair.generate(nkeys.Kind.USER), reviewers.MemoryReviewer(), ACCOUNTS
        )


def test_no_grant_means_deny_everything_not_allow_everything() -> None:
    # NATS reads an empty allow list as no restriction
    assert callouts._permission(()) == {"deny": [">"]}
    assert callouts._permission(("a.b",)) == {"allow": ["a.b"]}


class FakeSubscription:
    async def unsubscribe(self) -> None:
        pass


class FakeConnection:
    """A NATS connection that hands `serve` its requests and fails every answer."""

    def __init__(self) -> None:
        self.callback: Any = None
        self.queue: str | None = None

    async def subscribe(self, subject: str, *, queue: str, cb: Any) -> FakeSubscription:
        assert subject == callouts.CALLOUT_SUBJECT
        self.queue, self.callback = queue, cb
        return FakeSubscription()

    async def publish(self, subject: str, data: bytes) -> None:
        raise ConnectionResetError("the connection is gone")


async def test_an_answer_that_cannot_be_sent_is_logged_and_the_callout_goes_on(
    reviewer: reviewers.MemoryReviewer,
    registry: CollectorRegistry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    nc = FakeConnection()
    stopping = asyncio.Event()
    serving = asyncio.create_task(
        callouts.serve(nc, authorizer(reviewer, registry), stopping)  # type: ignore[arg-type]
    )
    while nc.callback is None:
        await asyncio.sleep(0)
    token = reviewer.issue(sa("gpuop-discovery"), node="n")
    for _ in range(2):
        message = type("Msg", (), {"data": request(token)[0], "reply": "_INBOX.x"})()
        await nc.callback(message)
    stopping.set()
    await serving
    assert nc.queue == callouts.QUEUE  # replicas share the requests
    assert counted(registry, "allowed") == 2
    assert caplog.text.count("an authorization request went unanswered") == 2


async def test_while_the_issuer_changes_a_request_for_either_key_is_answered_by_that_key(
    reviewer: reviewers.MemoryReviewer, registry: CollectorRegistry
) -> None:
    new = nkeys.KeyPair.generate(nkeys.Kind.ACCOUNT)
    both = callouts.Authorizer([new, ISSUER], reviewer, ACCOUNTS)
    token = reviewer.issue(sa("gpuop-discovery"), node="n")
    for key in (ISSUER, new):
        decision = await both.authorize(request(token, issuer=key.public_key)[0])
        assert decision.reason == "allowed"
        answer = response_of(decision)
        assert answer["iss"] == key.public_key
        user = natsjwt.decode(
            answer["nats"]["jwt"], type=natsjwt.USER, issuer_kind=nkeys.Kind.ACCOUNT
        )
        assert user["iss"] == key.public_key
    third = nkeys.KeyPair.generate(nkeys.Kind.ACCOUNT).public_key
    refused = await both.authorize(request(token, issuer=third)[0])
    assert refused.reason == "bad-request"
    assert new.public_key in refused.detail
    with pytest.raises(ValueError, match="needs an issuer key"):
        callouts.Authorizer([], reviewer, ACCOUNTS)


async def test_a_cached_review_is_asked_once_per_token_and_a_refusal_once_per_its_ttl() -> None:
    authority = reviewers.MemoryReviewer()
    cached = reviewers.CachingReviewer(authority, ttl=60)
    token = authority.issue(sa("gpuop-discovery"), node="n", ttl=600)
    for _ in range(3):
        assert (await cached.review(token)).node == "n"
    assert authority.reviews == 1
    for _ in range(2):
        with pytest.raises(reviewers.TokenRefused):
            await cached.review("unknown")
    assert authority.reviews == 2
    forgetful = reviewers.CachingReviewer(authority, refused_ttl=0)
    for _ in range(2):
        with pytest.raises(reviewers.TokenRefused):
            await forgetful.review("unknown")
    assert authority.reviews == 4


async def test_a_cached_review_ends_with_its_token_or_its_ttl() -> None:
    authority = reviewers.MemoryReviewer()
    short = authority.issue(sa("gpuop-discovery"), node="n", ttl=0.05)
    cached = reviewers.CachingReviewer(authority, ttl=60)
    await cached.review(short)
    await asyncio.sleep(0.1)
    with pytest.raises(reviewers.TokenRefused, match="expired"):
        await cached.review(short)

    token = authority.issue(sa("gpuop-discovery"), node="n")
    brief = reviewers.CachingReviewer(authority, ttl=0)
    await brief.review(token)
    authority.revoke(token)
    with pytest.raises(reviewers.TokenRefused):
        await brief.review(token)
