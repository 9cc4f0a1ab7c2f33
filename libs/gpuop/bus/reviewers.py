"""Who a bearer token belongs to: the seam between the NATS auth callout and the authority
that issued the token.

The callout (`callouts`) hands the token a client connected with to a `TokenReviewer` and
gets back a `ReviewedToken`: the authenticated user name (for Kubernetes,
`system:serviceaccount:<namespace>:<name>`), its extra attributes (a pod-bound token carries
the node of its pod under `authentication.kubernetes.io/node-name`) and when the token
expires. A token the authority does not accept raises `TokenRefused` with a short reason
for the metric; any other exception is the authority failing, which refuses too.

`KubeTokenReviewer` (`gpuop.kube.tokenreviews`) asks the Kubernetes API server;
`MemoryReviewer` here issues and checks tokens of its own, for tests.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

NODE_NAME = "authentication.kubernetes.io/node-name"
"""The extra attribute of a Kubernetes token bound to a pod that names the pod's node."""


@dataclass(frozen=True, slots=True)
class ReviewedToken:
    """What the authority says about a token it accepted."""

    username: str
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    expires: float | None = None
    """Unix time the token stops being valid; None for a token without an expiry."""

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
    ) -> str:
        token = "mem." + secrets.token_urlsafe(24)
        extra = {NODE_NAME: (node,)} if node is not None else {}
        expires = time.time() + ttl if ttl is not None else None
        reviewed = ReviewedToken(username, extra, expires)
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
    """A reviewer that remembers what another accepted for `ttl` seconds (never past the
    token's expiry), keyed by the token's SHA-256: when a NATS server restarts, every client
    reconnects at once with the token it had, and the API server is asked once per token,
    not once per connection. A refusal is not remembered. A token revoked (its pod deleted)
    still passes for up to `ttl` seconds."""

    def __init__(
        self, reviewer: TokenReviewer, *, ttl: float = 60.0, max_entries: int = 100_000
    ) -> None:
        self._reviewer = reviewer
        self._ttl = ttl
        self._max_entries = max_entries
        self._cache: dict[bytes, tuple[float, ReviewedToken]] = {}

    async def review(self, token: str) -> ReviewedToken:
        key = hashlib.sha256(token.encode()).digest()
        now = time.time()
        cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        reviewed = await self._reviewer.review(token)
        until = now + self._ttl
        if reviewed.expires is not None:
            until = min(until, reviewed.expires)
        if len(self._cache) >= self._max_entries:
            self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
            if len(self._cache) >= self._max_entries:
                self._cache.clear()
        self._cache[key] = (until, reviewed)
        return reviewed
