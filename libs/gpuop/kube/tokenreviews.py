"""Service-account tokens reviewed by the API server, for the NATS auth callout.

`KubeTokenReviewer.review` sends the token a NATS client connected with to the
`authentication.k8s.io/v1` TokenReview API, for the audience gpuop's pods request their
NATS tokens for (`gpuop-nats`), and returns who the API server says it belongs to
(`gpuop.bus.reviewers.ReviewedToken`): `system:serviceaccount:<namespace>:<name>`, the extra
attributes of a token bound to a pod (its node under `authentication.kubernetes.io/node-name`;
before Kubernetes 1.30, read from the bound pod, for which the callout may `get` pods) and
its expiry. The expiry is read from the token's own claims once the API server has
accepted it: TokenReview does not return it. A token the API server does not accept raises
`TokenRefused` (`wrong-audience` when the token was requested for another audience, such as
the API server's own); an API server that cannot answer raises its `KubeError`, which
refuses too. The callout's ServiceAccount needs `create` on `tokenreviews`, and `get` on
the pods of the namespace its clients run in.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from kubernetes.aio import client

from gpuop.bus import reviewers
from gpuop.kube.client import Kube

AUDIENCE = "gpuop-nats"


class KubeTokenReviewer:
    def __init__(self, kube: Kube, *, audience: str = AUDIENCE, timeout: float = 1.0) -> None:
        self._kube = kube
        self._api: Any = client.AuthenticationV1Api(kube.api_client)
        self.audience = audience
        self._timeout = timeout

    async def review(self, token: str) -> reviewers.ReviewedToken:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [self.audience]},
        }
        answer = await self._kube.call(
            self._api.create_token_review, body, _request_timeout=self._timeout
        )
        status = answer.get("status") or {}
        claims = unverified_claims(token)
        if not status.get("authenticated"):
            audiences = claims.get("aud")
            if isinstance(audiences, str):
                audiences = [audiences]
            if isinstance(audiences, list) and self.audience not in audiences:
                raise reviewers.TokenRefused(
                    "wrong-audience",
                    f"the token is for {', '.join(map(str, audiences))}, not {self.audience}",
                )
            said = status.get("error") or "the API server does not accept the token"
            raise reviewers.TokenRefused("not-authenticated", str(said))
        # an answer naming no audience says nothing about ours: refused, not assumed
        if self.audience not in (status.get("audiences") or []):
            raise reviewers.TokenRefused(
                "wrong-audience",
                f"the API server accepted the token for {status.get('audiences') or 'no'} "
                f"audiences, not {self.audience}",
            )
        user = status.get("user") or {}
        extra = self._extra(user)
        if reviewers.NODE_NAME not in extra:
            node = await self.bound_pod_node(claims)
            if node is not None:
                extra[reviewers.NODE_NAME] = (node,)
        expires, issued = claims.get("exp"), claims.get("iat")
        bound = claims.get("kubernetes.io") or {}
        return reviewers.ReviewedToken(
            str(user.get("username", "")),
            extra,
            float(expires) if isinstance(expires, int | float) else None,
            float(issued) if isinstance(issued, int | float) else None,
            isinstance(bound, dict) and isinstance(bound.get("pod"), dict),
        )

    @staticmethod
    def _extra(user: dict[str, Any]) -> dict[str, tuple[str, ...]]:
        return {
            str(key): tuple(str(value) for value in values)
            for key, values in (user.get("extra") or {}).items()
            if isinstance(values, list)
        }

    async def bound_pod_node(self, claims: dict[str, Any]) -> str | None:
        """The node of the pod an accepted token is bound to, from the pod itself: API
        servers before 1.30 put no node in a review, only the pod in the token's claims
        (`kubernetes.io.pod`). None when the token is bound to no pod, or the pod of that
        name is another (its uid differs) or not yet on a node."""
        bound = claims.get("kubernetes.io") or {}
        pod = bound.get("pod") if isinstance(bound, dict) else None
        namespace = bound.get("namespace") if isinstance(bound, dict) else None
        if not isinstance(pod, dict) or not isinstance(namespace, str):
            return None
        found = await self._kube.call(
            self._kube.core.read_namespaced_pod,
            str(pod.get("name")),
            namespace,
            _request_timeout=self._timeout,
        )
        if (found.get("metadata") or {}).get("uid") != pod.get("uid"):
            return None
        node = (found.get("spec") or {}).get("nodeName")
        return node if isinstance(node, str) and node else None


def unverified_claims(token: str) -> dict[str, Any]:
    """The claims of a JWT, not checked: only for a token the API server has judged (an
    opaque or malformed token has none)."""
    parts = token.split(".")
    if len(parts) != 3:
        return {}
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (binascii.Error, ValueError):
        return {}
    return claims if isinstance(claims, dict) else {}
