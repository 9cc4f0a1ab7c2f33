"""Kubernetes ``Status`` error bodies for the simulated API server.

Every failure the simulated server reports is an :class:`ApiError`; the HTTP layer
(``server.py``) turns it into a ``Status`` object served with exactly
``Content-Type: application/json``, as clients such as lightkube require. The
constructors mirror kubernetes/apimachinery ``pkg/api/errors/errors.go`` so that the
messages match a real cluster word for word::

    ApiError                 code, reason, message, details, optional Retry-After
    FieldError               one entry of an ``Invalid`` (422) error, rendered like
                             apimachinery's ``field.Error``

Callers: the registry (writes), selectors and patching (bad input), watching (410),
eviction (429/500), and the CRD schema validator (422 with causes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gpuop_sim.apiserver.resources import GroupResource

Obj = dict[str, Any]


class ApiError(Exception):
    """A request failed; carries the ``Status`` the server answers with."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        details: Obj | None = None,
        retry_after_seconds: int = 0,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.retry_after_seconds = retry_after_seconds

    def status(self) -> Obj:
        """The ``Status`` body, in the field order a real API server writes it."""
        body: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
        }
        if self.reason:
            body["reason"] = self.reason
        if self.details is not None:
            body["details"] = self.details
        body["code"] = self.code
        return body


@dataclass(frozen=True)
class RawValue:
    """A value already rendered the way Go prints it (``%#v`` of a struct)."""

    text: str


@dataclass(frozen=True)
class FieldError:
    """One invalid field, as apimachinery's ``field.Error``."""

    type: str
    """``Required``, ``Invalid``, ``Unsupported``, ``Duplicate``, ``Forbidden`` or ``TooMany``."""
    field: str
    value: Any = None
    detail: str = ""
    supported: tuple[str, ...] = ()

    @staticmethod
    def required(path: str, detail: str = "") -> FieldError:
        return FieldError("Required", path, detail=detail)

    @staticmethod
    def invalid(path: str, value: Any, detail: str) -> FieldError:
        return FieldError("Invalid", path, value, detail)

    @staticmethod
    def not_supported(path: str, value: Any, supported: tuple[str, ...]) -> FieldError:
        return FieldError("Unsupported", path, value, supported=supported)

    @staticmethod
    def duplicate(path: str, value: Any, detail: str = "") -> FieldError:
        return FieldError("Duplicate", path, value, detail)

    @staticmethod
    def forbidden(path: str, detail: str) -> FieldError:
        return FieldError("Forbidden", path, detail=detail)

    @staticmethod
    def too_many(path: str, count: int, most: int) -> FieldError:
        return FieldError("TooMany", path, count, f"must have at most {most} items")

    def body(self) -> str:
        """The message without the field path (``field.Error.ErrorBody``)."""
        if self.type in ("Required", "Forbidden"):
            text = "Required value" if self.type == "Required" else "Forbidden"
        else:
            label = {
                "Invalid": "Invalid value",
                "Unsupported": "Unsupported value",
                "TooMany": "Too many",
            }.get(self.type, f"{self.type} value")
            text = f"{label}: {render_value(self.value)}"
        if self.supported:
            text += ": supported values: " + ", ".join(json.dumps(s) for s in self.supported)
        if self.detail:
            text += f": {self.detail}"
        return text

    def cause(self) -> Obj:
        reason = {
            "Required": "FieldValueRequired",
            "Invalid": "FieldValueInvalid",
            "Unsupported": "FieldValueNotSupported",
            "Duplicate": "FieldValueDuplicate",
            "Forbidden": "FieldValueForbidden",
            "TooMany": "FieldValueTooMany",
        }[self.type]
        return {"reason": reason, "message": self.body(), "field": self.field}

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}"


def render_value(value: Any) -> str:
    """Render a field value as apimachinery does: strings quoted, scalars bare."""
    if isinstance(value, RawValue):
        return value.text
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def qualified(resource: GroupResource) -> str:
    """``pods`` for the core group, ``leases.coordination.k8s.io`` otherwise."""
    return f"{resource.resource}.{resource.group}" if resource.group else resource.resource


def _details(resource: GroupResource, name: str) -> Obj:
    details: Obj = {"name": name}
    if resource.group:
        details["group"] = resource.group
    details["kind"] = resource.resource
    return details


def not_found(resource: GroupResource, name: str) -> ApiError:
    return ApiError(
        404,
        "NotFound",
        f'{qualified(resource)} "{name}" not found',
        details=_details(resource, name),
    )


def already_exists(resource: GroupResource, name: str) -> ApiError:
    return ApiError(
        409,
        "AlreadyExists",
        f'{qualified(resource)} "{name}" already exists',
        details=_details(resource, name),
    )


def conflict(resource: GroupResource, name: str, why: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified(resource)} "{name}": {why}',
        details=_details(resource, name),
    )


def precondition_failed(resource: GroupResource, kind: str, name: str, why: str) -> ApiError:
    """The 409 a delete whose preconditions do not match gets: kube-apiserver names the
    kind there (``ConfigMap``, ``Lease.coordination.k8s.io``), not the resource."""
    qualified_kind = f"{kind}.{resource.group}" if resource.group else kind
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified_kind} "{name}": {why}',
        details=_details(resource, name),
    )


STALE_OBJECT = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


def stale(resource: GroupResource, name: str) -> ApiError:
    """The 409 a write with an outdated ``metadata.resourceVersion`` gets."""
    return conflict(resource, name, STALE_OBJECT)


def invalid(kind: str, group: str, name: str, errors: list[FieldError]) -> ApiError:
    """422 ``Invalid``: ``<Kind[.group]> "<name>" is invalid: <errors>``."""
    qualified_kind = f"{kind}.{group}" if group else kind
    rendered = [str(error) for error in errors]
    aggregate = rendered[0] if len(rendered) == 1 else "[" + ", ".join(rendered) + "]"
    details: Obj = {"name": name}
    if group:
        details["group"] = group
    details["kind"] = kind
    details["causes"] = [error.cause() for error in errors]
    return ApiError(
        422, "Invalid", f'{qualified_kind} "{name}" is invalid: {aggregate}', details=details
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def unauthorized() -> ApiError:
    return ApiError(401, "Unauthorized", "Unauthorized")


def forbidden(resource: GroupResource, name: str, why: str) -> ApiError:
    """403 ``Forbidden``: ``<resource> "<name>" is forbidden: <why>``, without the name
    when there is none (a list, a create)."""
    subject = f'{qualified(resource)} "{name}"' if name else qualified(resource)
    details = _details(resource, name)
    if not name:
        del details["name"]
    return ApiError(403, "Forbidden", f"{subject} is forbidden: {why}", details=details)


def path_not_found() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", details={})


def method_not_allowed() -> ApiError:
    return ApiError(
        405,
        "MethodNotAllowed",
        "the server does not allow this method on the requested resource",
        details={},
    )


def expired(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def too_old_resource_version(requested: int, oldest: int) -> ApiError:
    return expired(f"too old resource version: {requested} ({oldest})")


def unsupported_media_type(accepted: tuple[str, ...]) -> ApiError:
    return ApiError(
        415,
        "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types include: "
        + ", ".join(accepted),
    )


def unprocessable(message: str) -> ApiError:
    """422 without field causes, as a failed JSON patch operation reports."""
    return ApiError(422, "Invalid", message)


def too_many_requests(message: str, retry_after_seconds: int, causes: list[Obj]) -> ApiError:
    details: Obj = {"causes": causes}
    if retry_after_seconds:
        details["retryAfterSeconds"] = retry_after_seconds
    return ApiError(
        429,
        "TooManyRequests",
        message,
        details=details,
        retry_after_seconds=retry_after_seconds,
    )


def internal(message: str) -> ApiError:
    return ApiError(
        500,
        "InternalError",
        f"Internal error occurred: {message}",
        details={"causes": [{"message": message}]},
    )
