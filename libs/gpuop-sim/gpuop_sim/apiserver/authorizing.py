"""Whether a user may do what a request asks: the simulated API server's authorizer.

``server.py`` authenticates each request to a :class:`User` (the admin token, a token from
``ApiServer.add_user``, or ``system:anonymous`` when anonymous requests are served), reads
what it asks with :func:`attributes_of` (kube-apiserver's RequestInfo), and answers 403
``Forbidden`` unless :meth:`Authorizer.allows` says yes. The access reviews (``reviews.py``)
ask the same authorizer, so ``kubectl auth can-i`` and the requests themselves agree.

The decision is RBAC's, over rules bound to user names and to groups:

- ``system:masters`` may do everything (kube-apiserver's privileged-group authorizer); the
  admin token's user is in it.
- Every authenticated user gets what RBAC's bootstrap roles give ``system:authenticated``:
  discovery and ``/version`` (``system:discovery``, ``system:public-info-viewer``) and the
  self reviews (``system:basic-user``); unauthenticated requests get the public paths only.
- Beyond that, a user may do what the rules bound to its name allow. ``system:anonymous``
  is bound to every permission while ``anonymous_auth`` is on, as when RBAC grants it
  cluster-admin. Rules apply in every namespace, as a ClusterRoleBinding's do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuop_sim.apiserver import errors
from gpuop_sim.apiserver.resources import GroupResource

MASTERS = "system:masters"
AUTHENTICATED = "system:authenticated"
UNAUTHENTICATED = "system:unauthenticated"
ANONYMOUS = "system:anonymous"


@dataclass(frozen=True)
class Rule:
    """One RBAC ``PolicyRule``: a resource rule, or a non-resource one when it names URLs.
    ``*`` matches anything; a URL ending in ``*`` matches by prefix."""

    verbs: tuple[str, ...]
    api_groups: tuple[str, ...] = ()
    resources: tuple[str, ...] = ()
    resource_names: tuple[str, ...] = ()
    non_resource_urls: tuple[str, ...] = ()


@dataclass(frozen=True)
class User:
    """Who a request is from, as its authenticator said."""

    name: str
    groups: tuple[str, ...] = ()
    uid: str = ""


@dataclass(frozen=True)
class Attributes:
    """What a request asks to do (kube-apiserver's ``authorizer.Attributes``)."""

    verb: str
    resource_request: bool
    path: str = ""
    group: str = ""
    version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""


EVERYTHING = (Rule(("*",), ("*",), ("*",)), Rule(("*",), non_resource_urls=("*",)))
_PUBLIC_PATHS = ("/livez", "/readyz", "/healthz", "/version", "/version/")
_DISCOVERY = Rule(
    ("get",),
    non_resource_urls=(
        *_PUBLIC_PATHS,
        "/openapi",
        "/openapi/*",
        "/api",
        "/api/*",
        "/apis",
        "/apis/*",
    ),
)
_BASIC_USER = (
    Rule(
        ("create",),
        ("authorization.k8s.io",),
        ("selfsubjectaccessreviews", "selfsubjectrulesreviews"),
    ),
    Rule(("create",), ("authentication.k8s.io",), ("selfsubjectreviews",)),
)
_PUBLIC_INFO = Rule(("get",), non_resource_urls=_PUBLIC_PATHS)
_GROUP_RULES: Mapping[str, tuple[Rule, ...]] = {
    MASTERS: EVERYTHING,
    AUTHENTICATED: (_DISCOVERY, *_BASIC_USER, _PUBLIC_INFO),
    UNAUTHENTICATED: (_PUBLIC_INFO,),
}

_RESOURCE_VERBS = {
    "GET": "get",
    "HEAD": "get",
    "POST": "create",
    "PUT": "update",
    "PATCH": "patch",
    "DELETE": "delete",
}
_NAMESPACE_SUBRESOURCES = ("status", "finalize")


def _flag(value: str | None) -> bool:
    return value is not None and value.lower() not in ("0", "false")


def _name_selected(field_selector: str) -> str:
    """The name a field selector requires exactly (``metadata.name=x``), as RBAC uses it."""
    for requirement in field_selector.split(","):
        key, separator, value = requirement.partition("==")
        if not separator:
            key, separator, value = requirement.partition("=")
        if separator and not key.endswith("!") and key.strip() == "metadata.name":
            return value.strip()
    return ""


def attributes_of(method: str, path: str, query: Mapping[str, str]) -> Attributes:
    """A request's attributes, parsed as kube-apiserver's RequestInfoFactory does."""
    parts = [part for part in path.split("/") if part]
    # /api/v1 and /apis/{group}/{version} themselves are discovery: non-resource paths.
    if len(parts) < 3 or parts[0] not in ("api", "apis") or (parts[0] == "apis" and len(parts) < 4):
        return Attributes(method.lower(), resource_request=False, path=path)
    group, rest = ("", parts[1:]) if parts[0] == "api" else (parts[1], parts[2:])
    version, rest = rest[0], rest[1:]
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    name = rest[1] if len(rest) > 1 else ""
    verb = _RESOURCE_VERBS.get(method, "")
    if not name and verb == "get":
        verb = "watch" if _flag(query.get("watch")) else "list"
        name = _name_selected(query.get("fieldSelector", ""))
    if not name and verb == "delete":
        verb = "deletecollection"
    return Attributes(
        verb,
        resource_request=True,
        path=path,
        group=group,
        version=version,
        resource=rest[0],
        subresource=rest[2] if len(rest) > 2 else "",
        namespace=namespace,
        name=name,
    )


def _listed(allowed: tuple[str, ...], value: str) -> bool:
    return "*" in allowed or value in allowed


def _resource_matches(rule: Rule, attributes: Attributes) -> bool:
    combined = attributes.resource
    if attributes.subresource:
        combined = f"{attributes.resource}/{attributes.subresource}"
    return any(
        resource in ("*", combined)
        or (attributes.subresource and resource == f"*/{attributes.subresource}")
        for resource in rule.resources
    )


def _url_matches(rule: Rule, path: str) -> bool:
    return any(
        url in ("*", path) or (url.endswith("*") and path.startswith(url.rstrip("*")))
        for url in rule.non_resource_urls
    )


def rule_allows(rule: Rule, attributes: Attributes) -> bool:
    """RBAC's ``RuleAllows``."""
    if not _listed(rule.verbs, attributes.verb):
        return False
    if not attributes.resource_request:
        return _url_matches(rule, attributes.path)
    return (
        _listed(rule.api_groups, attributes.group)
        and _resource_matches(rule, attributes)
        and (not rule.resource_names or attributes.name in rule.resource_names)
    )


class Authorizer:
    """RBAC over the rules bound to user names, and those every group gets."""

    def __init__(self) -> None:
        self._bound: dict[str, tuple[Rule, ...]] = {}

    def bind(self, user: str, rules: Iterable[Rule]) -> None:
        """Grant ``user`` these rules, in place of any bound before."""
        self._bound[user] = tuple(rules)

    def unbind(self, user: str) -> None:
        self._bound.pop(user, None)

    def rules_for(self, user: str, groups: Iterable[str]) -> tuple[Rule, ...]:
        """Every rule that applies to ``user`` in ``groups``."""
        rules = list(self._bound.get(user, ()))
        for group in dict.fromkeys(groups):
            rules.extend(_GROUP_RULES.get(group, ()))
        return tuple(rules)

    def allows(self, user: str, groups: Iterable[str], attributes: Attributes) -> bool:
        return any(rule_allows(rule, attributes) for rule in self.rules_for(user, groups))


def forbidden(user: str, attributes: Attributes) -> errors.ApiError:
    """The 403 kube-apiserver answers a request its authorizer did not allow."""
    if not attributes.resource_request:
        return errors.ApiError(
            403,
            "Forbidden",
            f'forbidden: User "{user}" cannot {attributes.verb} path "{attributes.path}"',
            details={},
        )
    resource = attributes.resource
    if attributes.subresource:
        resource = f"{resource}/{attributes.subresource}"
    where = (
        f'in the namespace "{attributes.namespace}"'
        if attributes.namespace
        else "at the cluster scope"
    )
    why = (
        f'User "{user}" cannot {attributes.verb} resource "{resource}" in API group '
        f'"{attributes.group}" {where}'
    )
    return errors.forbidden(
        GroupResource(attributes.group, attributes.resource), attributes.name, why
    )
