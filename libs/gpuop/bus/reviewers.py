"""Who a bearer token belongs to: the seam between the NATS auth callout and the authority
that issued the token.

The callout (`callouts`) hands the token a client connected with to a `TokenReviewer` and
gets back a `ReviewedToken`: the authenticated user name (for Kubernetes,
`system:serviceaccount:<namespace>:<name>`), its extra attributes (a pod-bound token carries
the node of its pod under `authentication.kubernetes.io/node-name`) and when the token
expires. A token the authority does not accept raises `TokenRefused` with a short reason
for the metric; any other exception is the authority failing, which refuses too.

`KubeTokenReviewer` (`gpuop.kube.tokenreviews`) asks the Kubernetes API server;
`MemoryReviewer` here issues and checks tokens of its own, for tests. `CachingReviewer` sits
in front of either, so that any pod that can reach NATS cannot make the callout ask the API
server without end: it remembers acceptances and refusals, and runs a bounded number of
reviews at once. `jwt_shaped` is the callout's pre-filter: a token that is not a JWT is
refused without asking anyone.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

T = TypeVar("T")

MAX_TOKEN_BYTES = 16 << 10
"""A Kubernetes ServiceAccount token is a JWT of one or two kilobytes."""

NODE_NAME = "authentication.kubernetes.io/node-name"
"""The extra attribute of a Kubernetes token bound to a pod that names the pod's node."""


@dataclass(frozen=True, slots=True)
class ReviewedToken:
    """What the authority says about a token it accepted."""

    username: str
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    expires: float | None = None
    """Unix time the token stops being valid; None for a token without an expiry."""
    issued: float | None = None
    """Unix time the token was issued (its `iat`); None when it does not say."""
    pod_bound: bool = False
    """Whether the token is bound to a pod (a projected token), so it dies with the pod;
    a token made by hand (`kubectl create token`) is bound to none."""

    @property
    def node(self) -> str | None:
        """The node of the pod the token is bound to, if it is bound to one."""
        values = self.extra.get(NODE_NAME, ())
        return values[0] if len(values) == 1 else None


class TokenRefused(Exception):
    """The authority does not accept the token (unknown, expired, another audience)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        """A short label: `not-authenticated`, `wrong-audience`, ..."""
        self.detail = detail


class TokenReviewer(Protocol):
    async def review(self, token: str) -> ReviewedToken:
        """The token's owner; raises `TokenRefused` when the authority does not accept it."""
        ...


@dataclass(frozen=True, slots=True)
class _Issued:
    reviewed: ReviewedToken
    audiences: tuple[str, ...]


def jwt_shaped(token: str) -> bool:
    """Whether `token` could be a JWT: three base64url parts, the first a JSON header
    naming an `alg`, and no longer than `MAX_TOKEN_BYTES`. Decides nothing about its
    validity (only a review does); refusing the rest costs the API server nothing."""
    if len(token) > MAX_TOKEN_BYTES or token.count(".") != 2:
        return False
    header = token.split(".", 1)[0]
    try:
        decoded = json.loads(base64.urlsafe_b64decode(header + "=" * (-len(header) % 4)))
    except (binascii.Error, ValueError, RecursionError):
        return False
    return isinstance(decoded, dict) and isinstance(decoded.get("alg"), str)


def _jwt_of(claims: Mapping[str, object]) -> str:
    def part(document: Mapping[str, object]) -> str:
        raw = json.dumps(document, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(claims)}.{secrets.token_urlsafe(24)}"


class MemoryReviewer:
    """An authority in memory: `issue()` makes a token for a service account (bound to a node
    or not, for some audiences, valid for some seconds); `review()` accepts it until it
    expires or is revoked, for the reviewer's audience only, as a TokenReview would."""

    def __init__(self, audience: str = "gpuop-nats") -> None:
        self.audience = audience
        self._issued: dict[str, _Issued] = {}
        self.reviews = 0
        self.failing: Exception | None = None
        """Set to make every review fail with it (an authority that is down)."""

    def issue(
        self,
        username: str,
        *,
        node: str | None = None,
        audiences: tuple[str, ...] | None = None,
        ttl: float | None = 3600.0,
        pod_bound: bool = True,
    ) -> str:
        token = _jwt_of({"sub": username})  # JWT-shaped, as a ServiceAccount token is
        extra = {NODE_NAME: (node,)} if node is not None else {}
        now = time.time()
        expires = now + ttl if ttl is not None else None
        reviewed = ReviewedToken(username, extra, expires, now, pod_bound)
        self._issued[token] = _Issued(reviewed, audiences or (self.audience,))
        return token

    def revoke(self, token: str) -> None:
        self._issued.pop(token, None)

    async def review(self, token: str) -> ReviewedToken:
        self.reviews += 1
        if self.failing is not None:
            raise self.failing
        issued = self._issued.get(token)
        if issued is None:
            raise TokenRefused("not-authenticated", "the token is not one this authority issued")
        expires = issued.reviewed.expires
        if expires is not None and expires <= time.time():
            raise TokenRefused("not-authenticated", "the token has expired")
        if self.audience not in issued.audiences:
            raise TokenRefused(
                "wrong-audience",
                f"the token is for {', '.join(issued.audiences)}, not {self.audience}",
            )
        return issued.reviewed


class CachingReviewer:
    """A reviewer that remembers what another decided, keyed by the token's SHA-256: an
    acceptance for `ttl` seconds (never past the token's expiry), so that when a NATS server
    restarts and every client reconnects at once with the token it had, the API server is
    asked once per token, not once per connection; a refusal (`TokenRefused`) for
    `refused_ttl` seconds, so that a client retrying a bad token costs one review, not one a
    try. At most `max_entries` of each are kept (the oldest dropped first), and at most
    `concurrency` reviews run at once, one per token: a flood of made-up tokens queues behind
    that bound while tokens already decided are answered from memory without waiting. An authority
    failing (not a refusal) is not remembered. A token revoked (its pod deleted) still passes
    for up to `ttl` seconds."""

    def __init__(
        self,
        reviewer: TokenReviewer,
        *,
        ttl: float = 60.0,
        refused_ttl: float = 30.0,
        max_entries: int = 100_000,
        concurrency: int = 16,
    ) -> None:
        self._reviewer = reviewer
        self._ttl = ttl
        self._refused_ttl = refused_ttl
        self._max_entries = max_entries
        self._cache: dict[bytes, tuple[float, ReviewedToken]] = {}
        self._refused: dict[bytes, tuple[float, TokenRefused]] = {}
        self._reviewing = asyncio.Semaphore(concurrency)
        self._asking: dict[bytes, asyncio.Future[ReviewedToken]] = {}

    async def review(self, token: str) -> ReviewedToken:
        key = hashlib.sha256(token.encode()).digest()
        cached = self._remembered(key, time.time())
        if cached is not None:
            return cached
        asked = self._asking.get(key)
        if asked is None:  # one review per token at a time: the others wait for its answer
            asked = self._asking[key] = asyncio.ensure_future(self._ask(key, token))
            asked.add_done_callback(lambda _: self._asking.pop(key, None))
        return await asyncio.shield(asked)

    async def _ask(self, key: bytes, token: str) -> ReviewedToken:
        async with self._reviewing:
            now = time.time()
            try:
                reviewed = await self._reviewer.review(token)
            except TokenRefused as refused:
                _bounded_put(self._refused, key, (now + self._refused_ttl, refused),
                             self._max_entries, now)  # fmt: skip
                raise
        until = now + self._ttl
        if reviewed.expires is not None:
            until = min(until, reviewed.expires)
        _bounded_put(self._cache, key, (until, reviewed), self._max_entries, now)
        return reviewed

    def _remembered(self, key: bytes, now: float) -> ReviewedToken | None:
        """The remembered acceptance of `key`; raises its remembered refusal; None."""
        refused = self._refused.get(key)
        if refused is not None and refused[0] > now:
            raise refused[1]
        cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        return None


def _bounded_put(
    cache: dict[bytes, tuple[float, T]],
    key: bytes,
    value: tuple[float, T],
    max_entries: int,
    now: float,
) -> None:
    """Put `value` into `cache`, first dropping the expired entries and then the oldest when
    it is full (a dict keeps insertion order)."""
    if len(cache) >= max_entries:
        for stale in [k for k, (until, _) in cache.items() if until <= now]:
            del cache[stale]
        while len(cache) >= max_entries:
            del cache[next(iter(cache))]
    cache[key] = value
