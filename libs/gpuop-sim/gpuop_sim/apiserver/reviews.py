"""The reviews: ``authorization.k8s.io/v1`` access reviews, answered by the server's
authorizer, and ``authentication.k8s.io/v1`` SelfSubjectReview (``kubectl auth whoami``).

``POST`` of a ``SelfSubjectAccessReview`` (what ``kubectl auth can-i`` sends), a
``SubjectAccessReview``, a namespaced ``LocalSubjectAccessReview`` or a
``SelfSubjectRulesReview`` (``kubectl auth can-i --list``) is validated as upstream's
registry does (exactly one of ``resourceAttributes`` and ``nonResourceAttributes``; a user
or a group for the subject reviews; a namespace for the rules review), evaluated by
``authorizing.Authorizer`` (the rules the request itself would be checked against) and
answered ``201`` with the review and its ``status``. A ``SelfSubjectReview`` is answered
with who the request's user is. Nothing is stored. Called by the HTTP handlers for the
virtual resource types ``kinds.py`` declares.
"""

from __future__ import annotations

from typing import Any

from gpuop_sim.apiserver import errors
from gpuop_sim.apiserver.authorizing import Attributes, Authorizer, Rule, User
from gpuop_sim.apiserver.errors import FieldError
from gpuop_sim.apiserver.resources import ResourceType

Obj = dict[str, Any]

GROUP = "authorization.k8s.io"
_UNION = "exactly one of nonResourceAttributes or resourceAttributes must be specified"


def _object(kind: str, value: Any, field: str) -> Obj | None:
    """A field that must decode as an object, as Go's JSON decoding insists."""
    if value is None or isinstance(value, dict):
        return value
    json_type = {str: "string", list: "array", bool: "bool"}.get(type(value), "number")
    raise errors.bad_request(
        f'{kind} in version "v1" cannot be handled as a {kind}: json: cannot unmarshal '
        f"{json_type} into Go struct field {field} of type object"
    )


def _string(obj: Obj, key: str) -> str:
    value = obj.get(key)
    return value if isinstance(value, str) else ""


def _attributes(kind: str, spec: Obj, *, subject: bool) -> Attributes:
    resource = _object(kind, spec.get("resourceAttributes"), "spec.resourceAttributes")
    non_resource = _object(kind, spec.get("nonResourceAttributes"), "spec.nonResourceAttributes")
    found: list[FieldError] = []
    if (resource is None) == (non_resource is None):
        found.append(FieldError.invalid("spec", non_resource, _UNION))
    if subject and not spec.get("user") and not spec.get("groups"):
        found.append(
            FieldError.invalid(
                "spec.user",
                _string(spec, "user"),
                "at least one of user or group must be specified",
            )
        )
    if kind == "LocalSubjectAccessReview" and non_resource is not None:
        found.append(
            FieldError.invalid(
                "spec.nonResourceAttributes", non_resource, "disallowed on this kind of request"
            )
        )
    if found:
        raise errors.invalid(kind, GROUP, "", found)
    if resource is not None:
        return Attributes(
            _string(resource, "verb"),
            resource_request=True,
            group=_string(resource, "group"),
            version=_string(resource, "version"),
            resource=_string(resource, "resource"),
            subresource=_string(resource, "subresource"),
            namespace=_string(resource, "namespace"),
            name=_string(resource, "name"),
        )
    assert non_resource is not None
    return Attributes(
        _string(non_resource, "verb"), resource_request=False, path=_string(non_resource, "path")
    )


def _resource_rule(rule: Rule) -> Obj:
    shown: Obj = {"verbs": list(rule.verbs)}
    for key, values in (
        ("apiGroups", rule.api_groups),
        ("resources", rule.resources),
        ("resourceNames", rule.resource_names),
    ):
        if values:
            shown[key] = list(values)
    return shown


def _rules_review(authorizer: Authorizer, user: User, spec: Obj) -> Obj:
    if not _string(spec, "namespace"):
        raise errors.bad_request("no namespace on request")
    rules = authorizer.rules_for(user.name, user.groups)
    return {
        "resourceRules": [_resource_rule(r) for r in rules if not r.non_resource_urls],
        "nonResourceRules": [
            {"verbs": list(r.verbs), "nonResourceURLs": list(r.non_resource_urls)}
            for r in rules
            if r.non_resource_urls
        ],
        "incomplete": False,
    }


def review(
    authorizer: Authorizer, user: User, resource: ResourceType, namespace: str | None, body: Obj
) -> Obj:
    """Answer one review ``user`` created, at ``namespace`` for a local review."""
    kind = resource.kind
    spec = _object(kind, body.get("spec"), "spec") or {}
    metadata: Obj = {"namespace": namespace} if namespace else {}
    answer: Obj = {"kind": kind, "apiVersion": resource.api_version, "metadata": metadata}
    if kind == "SelfSubjectReview":
        user_info: Obj = {"username": user.name, "groups": list(user.groups)}
        if user.uid:
            user_info["uid"] = user.uid
        return {**answer, "status": {"userInfo": user_info}}
    if kind == "SelfSubjectRulesReview":
        return {**answer, "spec": {}, "status": _rules_review(authorizer, user, spec)}
    subject = kind != "SelfSubjectAccessReview"
    attributes = _attributes(kind, spec, subject=subject)
    if kind == "LocalSubjectAccessReview" and attributes.namespace != namespace:
        found = FieldError.invalid(
            "spec.resourceAttributes.namespace",
            attributes.namespace,
            "must match metadata.namespace",
        )
        raise errors.invalid(kind, GROUP, "", [found])
    if subject:
        name = _string(spec, "user")
        groups = tuple(g for g in spec.get("groups") or () if isinstance(g, str))
    else:
        name, groups = user.name, user.groups
    allowed = authorizer.allows(name, groups, attributes)
    return {**answer, "spec": spec, "status": {"allowed": allowed}}
