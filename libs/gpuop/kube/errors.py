"""Every error `gpuop.kube` raises, mapped from the API server's answers in one place.

    KubeError                   a request to the API server failed
    ├── Unreachable             no HTTP answer: connection refused or reset, timeout
    ├── ConfigError             the kubeconfig or in-cluster config cannot be loaded
    ├── BadRequest              400
    ├── Unauthorized            401
    ├── Forbidden               403
    ├── NotFound                404
    ├── Conflict                409 Conflict: a stale resourceVersion or failed precondition
    │   └── AlreadyExists       409 AlreadyExists: create found the name taken
    ├── Expired                 410: the resourceVersion left the server's history; relist
    ├── Invalid                 422, or a body the client's models refuse before sending
    ├── TooManyRequests         429: throttled, or an eviction a PodDisruptionBudget refuses
    ├── ServerError             5xx
    └── DrainError              a drain that cannot finish
        ├── DrainRefused        pods a drain may not remove without `force` or
        │                       `delete_emptydir`; nothing was evicted
        └── DrainTimedOut       the deadline passed; names the blocking budget, if any

`temporary` says whether the same request may succeed later (Conflict after a fresh read,
TooManyRequests, ServerError, Unreachable). Raw `kubernetes` and `aiohttp` exceptions never
leave `gpuop.kube`: `client.Kube.call` and the watch translate them here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any


class KubeError(Exception):
    """A failed request. `code` and `reason` come from the Status body when there is one."""

    temporary = False

    def __init__(
        self,
        message: str,
        *,
        code: int | None = None,
        reason: str = "",
        status: Mapping[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.reason = reason
        self.status: Mapping[str, Any] = status or {}
        """The Status body as the server sent it (empty when there was none)."""
        self.retry_after = retry_after

    @property
    def causes(self) -> list[Mapping[str, Any]]:
        details = self.status.get("details") or {}
        return [cause for cause in details.get("causes") or [] if isinstance(cause, Mapping)]


class Unreachable(KubeError):
    """The API server did not answer."""

    temporary = True
    sent = True
    """False when the connection could not even be opened: the request never ran."""


class ConfigError(KubeError):
    """No usable client configuration."""


class BadRequest(KubeError):
    pass


class Unauthorized(KubeError):
    pass


class Forbidden(KubeError):
    pass


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    """The object changed since it was read: read it again and decide again."""

    temporary = True


class AlreadyExists(Conflict):
    pass


class Expired(KubeError):
    """A watch or paged list asked for a resourceVersion the server no longer keeps."""


class Invalid(KubeError):
    pass


class TooManyRequests(KubeError):
    temporary = True


class ServerError(KubeError):
    temporary = True


class DrainError(KubeError):
    """A drain that did not complete."""

    def __init__(self, message: str, *, node: str, pods: Sequence[str]) -> None:
        super().__init__(message)
        self.node = node
        self.pods = tuple(pods)
        """The pods concerned, as `namespace/name`."""


class DrainRefused(DrainError):
    """The node holds pods that the options do not allow to remove; nothing was evicted."""

    def __init__(self, *, node: str, pods: Sequence[str], reason: str) -> None:
        super().__init__(f"cannot drain node {node}: {reason}", node=node, pods=pods)
        self.reason = reason


class DrainTimedOut(DrainError):
    """Pods were still on the node at the deadline. `pdbs` names (`namespace/name`) the
    PodDisruptionBudgets that refused their eviction, if that is what held them."""

    temporary = True

    def __init__(
        self, *, node: str, pods: Sequence[str], timeout: float, pdbs: Sequence[str] = ()
    ) -> None:
        blocked = f"; blocked by PodDisruptionBudget {', '.join(pdbs)}" if pdbs else ""
        message = (
            f"drain of node {node} timed out after {timeout:g}s with pods still present: "
            f"{', '.join(pods)}{blocked}"
        )
        super().__init__(message, node=node, pods=pods)
        self.timeout = timeout
        self.pdbs = tuple(pdbs)

    @property
    def pdb(self) -> str | None:
        """The first blocking budget, `namespace/name`, or None."""
        return self.pdbs[0] if self.pdbs else None


_BY_CODE: dict[int, type[KubeError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    410: Expired,
    422: Invalid,
    429: TooManyRequests,
}


def from_status(
    code: int, status: Mapping[str, Any], retry_after: float | None = None
) -> KubeError:
    """The error for an HTTP status code and the Status body that came with it."""
    reason = str(status.get("reason") or "")
    message = str(status.get("message") or f"HTTP {code}")
    kind: type[KubeError]
    if code == 409:
        kind = AlreadyExists if reason == "AlreadyExists" else Conflict
    elif code >= 500:
        kind = ServerError
    else:
        kind = _BY_CODE.get(code, KubeError)
    if retry_after is None:
        seconds = (status.get("details") or {}).get("retryAfterSeconds")
        retry_after = float(seconds) if isinstance(seconds, int | float) and seconds else None
    return kind(message, code=code, reason=reason, status=status, retry_after=retry_after)


def from_response(code: int, body: bytes, headers: Mapping[str, str]) -> KubeError:
    """The error for a failed HTTP response; a body that is not a Status is kept as text."""
    try:
        decoded = json.loads(body) if body else {}
    except ValueError:
        decoded = None
    if not isinstance(decoded, dict):
        decoded = {"message": body.decode(errors="replace").strip() or f"HTTP {code}"}
    retry_after: float | None = None
    header = headers.get("Retry-After")
    if header is not None:
        try:
            retry_after = float(header)
        except ValueError:
            retry_after = None
    return from_status(code, decoded, retry_after)


def refused_by_client(error: Exception) -> Invalid:
    """A request body or argument that the official client's models refuse to send."""
    return Invalid(f"the Kubernetes client refused the request: {error}", reason="Invalid")


def unreachable(error: BaseException, *, sent: bool = True) -> Unreachable:
    """No answer; `sent=False` when the request never left (the connection was refused)."""
    unanswered = Unreachable(f"the API server did not answer: {error!r}")
    unanswered.sent = sent
    return unanswered
