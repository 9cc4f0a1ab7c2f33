"""The NATS auth callout: one NATS user per node agent, bound to its Kubernetes token.

In callout mode (deploy/nats/callout.conf) a client connects with a bearer token and no
user; the server asks this callout on `$SYS.REQ.USER.AUTH` (in the AUTH account) with an
authorization request, a JWT the server signs. `Authorizer.authorize` checks the request
(signed by a server key, for this callout's issuer key, not expired), has the client's
token reviewed (`reviewers`: the Kubernetes TokenReview API in a cluster), maps the token's
service account to a gpuop role (`Accounts`) and, for a node role, takes the node from the
token's pod binding. It answers with an authorization response signed by the issuer key:
either a user JWT for the GPUOP account whose permissions are exactly
`grants.for_identity(Identity(role, node))` and which expires with the token (at most
`max_lifetime` away; the server disconnects the client then and the client reconnects with
its refreshed token), or an error that says why. It never answers an allow without a user
JWT. A request it cannot trust gets no answer: the server refuses the client when its own
wait ends.

`serve` runs the authorizer on a connection of the callout's own user, in a queue group so
that replicas share the requests. The link from the server to the callout is the callout's
TLS connection; the requests are not also sealed with an xkey.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from prometheus_client import CollectorRegistry, Counter

from gpuop.bus import grants, natsjwt, nkeys, reviewers
from gpuop.events import subjects

log = logging.getLogger(__name__)

CALLOUT_SUBJECT = "$SYS.REQ.USER.AUTH"
REQUEST_AUDIENCE = "nats-authorization-request"
QUEUE = "gpuop-nats-auth"
ACCOUNT = "GPUOP"
"""The account every user the callout admits is placed in (deploy/nats/callout.conf)."""
SERVICE_ACCOUNT = "system:serviceaccount:"

MAX_TOKEN_LIFETIME = 86400.0
"""The longest-lived token the callout takes (issued to expiry): the chart's projected tokens
live `nats.auth.callout.tokenExpirationSeconds` (1 hour by default, at most a day)."""

REASONS = (
    "allowed",
    "bad-request",
    "no-token",
    "not-a-jwt",
    "not-authenticated",
    "wrong-audience",
    "unknown-account",
    "no-node",
    "bad-node",
    "no-expiry",
    "not-pod-bound",
    "too-long-lived",
    "reviewer-error",
    "reviewer-timeout",
    "overloaded",
)
"""Every outcome the metric counts: `allowed`, or why a client was refused."""


class Refusal(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class Accounts:
    """Which gpuop role each Kubernetes service account connects as: `namespace/name=role`
    entries, as the chart passes them (`--account`)."""

    def __init__(self, roles: Mapping[str, str]) -> None:
        for username, role in roles.items():
            if role not in grants.ROLES:
                raise ValueError(f"{username} maps to {role!r}, which is not a gpuop role")
        self._roles = dict(roles)

    @classmethod
    def parse(cls, entries: Iterable[str]) -> Accounts:
        roles: dict[str, str] = {}
        for entry in entries:
            account, sep, role = entry.partition("=")
            namespace, slash, name = account.partition("/")
            if not sep or not slash or not namespace or not name or not role:
                raise ValueError(f"expected NAMESPACE/SERVICEACCOUNT=ROLE, not {entry!r}")
            roles[f"{SERVICE_ACCOUNT}{namespace}:{name}"] = role
        return cls(roles)

    def role(self, username: str) -> str:
        role = self._roles.get(username)
        if role is None:
            raise Refusal("unknown-account", f"{username} is not a gpuop service account")
        return role


class CalloutMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.decisions = Counter(
            "gpuop_nats_auth_decisions",
            "Connection requests the NATS auth callout answered, by outcome",
            ["reason"],
            registry=registry,
        )
        for reason in REASONS:
            self.decisions.labels(reason=reason)


@dataclass(frozen=True, slots=True)
class Decision:
    reason: str
    """`allowed` or why not (one of `REASONS`)."""
    detail: str
    identity: grants.Identity | None = None
    response: str | None = None
    """The authorization response JWT; None for a request not to be answered."""


@dataclass(frozen=True, slots=True)
class _Request:
    user_nkey: str
    server_id: str
    token: str
    issuer: nkeys.KeyPair
    """The key the request is for, which signs the answer."""


class Authorizer:
    def __init__(
        self,
        issuer: nkeys.KeyPair | Sequence[nkeys.KeyPair],
        reviewer: reviewers.TokenReviewer,
        accounts: Accounts,
        *,
        prefix: str = subjects.DEFAULT_PREFIX,
        account: str = ACCOUNT,
        max_lifetime: float = 3600.0,
        review_timeout: float = 1.5,
        metrics: CalloutMetrics | None = None,
    ) -> None:
        keys = [issuer] if isinstance(issuer, nkeys.KeyPair) else list(issuer)
        if not keys:
            raise ValueError("the callout needs an issuer key")
        for key in keys:
            if key.kind is not nkeys.Kind.ACCOUNT:
                raise ValueError(
                    f"the callout's issuer must be an account key, not a {key.kind.name}"
                )
        self.issuer = keys[0]
        """The first key; a request for any of them is answered with that one (while the
        server's issuer changes, the callout holds both)."""
        self._issuers = {key.public_key: key for key in keys}
        self._reviewer = reviewer
        self._accounts = accounts
        self._prefix = prefix
        self._account = account
        self._max_lifetime = max_lifetime
        self._review_timeout = review_timeout
        self._metrics = metrics

    @property
    def issuers(self) -> str:
        return ", ".join(self._issuers)

    async def authorize(self, request: bytes) -> Decision:
        now = time.time()
        try:
            checked = self._check_request(request, now)
        except Refusal as refusal:
            return self._decided(Decision(refusal.reason, refusal.detail))
        try:
            identity, expires = await self._identify(checked.token, now)
        except Refusal as refusal:
            response = self._response(checked, error=f"gpuop: {refusal.detail}", now=now)
            return self._decided(Decision(refusal.reason, refusal.detail, response=response))
        user = self._user_jwt(checked, identity, expires, now)
        response = self._response(checked, jwt=user, now=now)
        return self._decided(Decision("allowed", _named(identity), identity, response))

    def overloaded(self) -> None:
        """Count a request dropped unanswered because too many are being worked on."""
        if self._metrics is not None:
            self._metrics.decisions.labels(reason="overloaded").inc()
        log.debug("dropped an authorization request: too many pending")

    def _decided(self, decision: Decision) -> Decision:
        if self._metrics is not None:
            self._metrics.decisions.labels(reason=decision.reason).inc()
        if decision.reason == "allowed":
            log.info("admitted %s", decision.detail)
        else:
            log.warning("refused a connection (%s): %s", decision.reason, decision.detail)
        return decision

    def _check_request(self, request: bytes, now: float) -> _Request:
        try:
            claims = natsjwt.decode(
                request.decode("utf-8", "replace"),
                type=natsjwt.AUTHORIZATION_REQUEST,
                issuer_kind=nkeys.Kind.SERVER,
                now=now,
                leeway=5.0,
            )
        except natsjwt.JwtError as exc:
            raise Refusal("bad-request", f"not an authorization request: {exc}") from None
        if claims.get("aud") != REQUEST_AUDIENCE:
            raise Refusal("bad-request", f"audience {claims.get('aud')!r}, not {REQUEST_AUDIENCE}")
        issuer = self._issuers.get(str(claims.get("sub")))
        if issuer is None:
            raise Refusal(
                "bad-request",
                f"the request is for issuer {claims.get('sub')!r}, this callout signs as"
                f" {', '.join(self._issuers)}",
            )
        nats: dict[str, Any] = claims["nats"]
        user_nkey = nats.get("user_nkey")
        server_id = (nats.get("server_id") or {}).get("id")
        if not isinstance(user_nkey, str) or not nkeys.is_public(user_nkey, nkeys.Kind.USER):
            raise Refusal("bad-request", f"user_nkey {user_nkey!r:.70} is not a public user key")
        if not isinstance(server_id, str) or not nkeys.is_public(server_id, nkeys.Kind.SERVER):
            raise Refusal("bad-request", f"server_id {server_id!r:.70} is not a server key")
        token = (nats.get("connect_opts") or {}).get("auth_token") or ""
        return _Request(user_nkey, server_id, token if isinstance(token, str) else "", issuer)

    async def _identify(self, token: str, now: float) -> tuple[grants.Identity, float]:
        if not token:
            raise Refusal("no-token", "the client connected without a token")
        if not reviewers.jwt_shaped(token):
            # any pod may reach NATS: what cannot be a ServiceAccount token costs no review
            raise Refusal("not-a-jwt", "the client's token is not a JWT")
        try:
            reviewed = await asyncio.wait_for(self._reviewer.review(token), self._review_timeout)
        except reviewers.TokenRefused as refused:
            raise Refusal(refused.reason, refused.detail) from None
        except TimeoutError:
            raise Refusal(
                "reviewer-timeout", f"the token review took over {self._review_timeout:g} s"
            ) from None
        except Exception as exc:
            raise Refusal("reviewer-error", f"the token review failed: {exc!r}") from None
        role = self._accounts.role(reviewed.username)
        if reviewed.expires is None:
            raise Refusal("no-expiry", f"{reviewed.username}'s token never expires")
        if reviewed.expires <= now:
            raise Refusal("not-authenticated", f"{reviewed.username}'s token has expired")
        if not reviewed.pod_bound:
            # a token made by hand outlives any pod: only the projected ones the chart mounts
            raise Refusal("not-pod-bound", f"{reviewed.username}'s token is bound to no pod")
        lifetime = reviewed.expires - (reviewed.issued if reviewed.issued is not None else now)
        if lifetime > MAX_TOKEN_LIFETIME:
            raise Refusal(
                "too-long-lived",
                f"{reviewed.username}'s token lives {lifetime:.0f} s, over "
                f"{MAX_TOKEN_LIFETIME:.0f} s",
            )
        node: str | None = None
        if role in grants.NODE_ROLES:
            node = reviewed.node
            if node is None:
                raise Refusal(
                    "no-node", f"{reviewed.username} ({role}) has a token bound to no node"
                )
            try:
                subjects.validate_node_name(node)
            except ValueError as exc:
                raise Refusal("bad-node", str(exc)) from None
        return grants.Identity(role, node), min(reviewed.expires, now + self._max_lifetime)

    def _user_jwt(
        self, request: _Request, identity: grants.Identity, expires: float, now: float
    ) -> str:
        granted = grants.for_identity(identity, prefix=self._prefix)
        claims = {
            "sub": request.user_nkey,
            "aud": self._account,
            "name": _named(identity),
            "exp": int(expires),
            "nats": {
                "type": natsjwt.USER,
                "pub": _permission(granted.publish),
                "sub": _permission(granted.subscribe),
                **_limits(identity),
            },
        }
        return natsjwt.encode(claims, request.issuer, now=now)

    def _response(
        self, request: _Request, *, now: float, jwt: str | None = None, error: str | None = None
    ) -> str:
        answer = {"jwt": jwt} if jwt is not None else {"error": error}
        claims = {
            "sub": request.user_nkey,
            "aud": request.server_id,
            "nats": {"type": natsjwt.AUTHORIZATION_RESPONSE, **answer},
        }
        return natsjwt.encode(claims, request.issuer, now=now)


NODE_SUBSCRIPTIONS = 128
"""Subscriptions one node agent's connection may hold: its consumers' pulls, its reads and
watches and its inbox take a few dozen at most; a flood of interest (each one the server
matches every message against) ends at this."""
NODE_DATA = 64 << 20
"""The data limit of a node agent's user claims (bytes; nats-server 2.15 enforces none for
a client connection, like `payload` below: set, so a server that does bounds it)."""


def _limits(identity: grants.Identity) -> dict[str, int]:
    """A user's limits: a node agent's bounded (`NODE_SUBSCRIPTIONS`, `NODE_DATA`); a
    cluster role's, placed where only admins decide, left to the account's. `payload` stays
    the account's (1 MB, callout.conf): nats-server 2.15 takes no per-user payload limit from
    a callout's user JWT, so a smaller one for node agents is not possible there; the
    buckets' `max_msg_size` and the stream's per-subject limits bound what a node stores."""
    if identity.node is None:
        return {"subs": -1, "data": -1, "payload": -1}
    return {"subs": NODE_SUBSCRIPTIONS, "data": NODE_DATA, "payload": -1}


def _permission(subjects_: tuple[str, ...]) -> dict[str, list[str]]:
    # an empty allow list would allow everything: nothing allowed is a deny of everything
    return {"allow": list(subjects_)} if subjects_ else {"deny": [">"]}


def _named(identity: grants.Identity) -> str:
    return identity.role if identity.node is None else f"{identity.role}@{identity.node}"


MAX_PENDING = 1024
"""Authorization requests one callout works on at once; beyond them a request is dropped
unanswered (the server refuses that client when its wait ends, and the client retries)."""


async def serve(
    nc: Client, authorizer: Authorizer, stopping: asyncio.Event, *, max_pending: int = MAX_PENDING
) -> None:
    """Answer the server's authorization requests on `nc` until `stopping` is set, at most
    `max_pending` at once (a flood of connects queues no more tasks than that)."""
    pending: set[asyncio.Task[None]] = set()

    async def answer(msg: Msg) -> None:
        # whatever goes wrong, the client is refused: unanswered, the server gives up on it
        try:
            decision = await authorizer.authorize(msg.data)
            if decision.response is not None and msg.reply:
                await nc.publish(msg.reply, decision.response.encode("ascii"))
        except Exception:
            log.exception("an authorization request went unanswered")

    async def received(msg: Msg) -> None:
        if len(pending) >= max_pending:
            authorizer.overloaded()
            return
        # reviews wait on the API server: each request in a task of its own
        task = asyncio.create_task(answer(msg))
        pending.add(task)
        task.add_done_callback(pending.discard)

    subscription = await nc.subscribe(CALLOUT_SUBJECT, queue=QUEUE, cb=received)
    log.info("answering NATS authorization requests as issuer %s", authorizer.issuers)
    try:
        await stopping.wait()
    finally:
        await subscription.unsubscribe()
        if pending:
            await asyncio.wait(pending, timeout=2.0)
