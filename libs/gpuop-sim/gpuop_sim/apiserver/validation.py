"""Validation rules of the built-in kinds, with apimachinery's wording.

The registry runs :func:`validate_metadata` on every write, then the kind's own validator
from ``kinds.py`` (node taints, pod updates, PodDisruptionBudget budgets, DaemonSet
selectors). Each returns :class:`~gpuop_sim.apiserver.errors.FieldError` values that the registry
folds into one 422 ``Invalid`` Status, so gpuop sees the same messages a real cluster
gives (a label value with a space in it, a duplicate taint, a renamed pod container).
"""

from __future__ import annotations

import json
import re
from typing import Any

from gpuop_sim.apiserver.errors import FieldError, RawValue

Obj = dict[str, Any]

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*"
_QUALIFIED_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE = r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"

SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
    "'-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', "
    f"regex used for validation is '{_DNS1123_SUBDOMAIN}')"
)
LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', "
    f"regex used for validation is '{_DNS1123_LABEL}')"
)
QUALIFIED_NAME_MESSAGE = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and "
    "end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', "
    f"regex used for validation is '{_QUALIFIED_NAME}')"
)
LABEL_VALUE_MESSAGE = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' "
    "or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    f"'my_value',  or '12345', regex used for validation is '{_LABEL_VALUE}')"
)


def subdomain_errors(path: str, value: str) -> list[FieldError]:
    return _dns_name_errors(path, value, 253, _DNS1123_SUBDOMAIN, SUBDOMAIN_MESSAGE)


def dns_label_errors(path: str, value: str) -> list[FieldError]:
    return _dns_name_errors(path, value, 63, _DNS1123_LABEL, LABEL_MESSAGE)


def _dns_name_errors(
    path: str, value: str, longest: int, pattern: str, message: str
) -> list[FieldError]:
    """What is wrong with `value` as a DNS name of at most `longest` characters."""
    found: list[FieldError] = []
    if len(value) > longest:
        found.append(FieldError.invalid(path, value, f"must be no more than {longest} characters"))
    if not re.fullmatch(pattern, value):
        found.append(FieldError.invalid(path, value, message))
    return found


def qualified_name_errors(path: str, value: str) -> list[FieldError]:
    prefix, slash, name = value.rpartition("/")
    found: list[FieldError] = []
    if slash:
        if not prefix:
            found.append(FieldError.invalid(path, value, "prefix part must be non-empty"))
        elif not re.fullmatch(_DNS1123_SUBDOMAIN, prefix) or len(prefix) > 253:
            found.append(FieldError.invalid(path, value, "prefix part " + SUBDOMAIN_MESSAGE))
    if not name:
        found.append(FieldError.invalid(path, value, "name part must be non-empty"))
    elif len(name) > 63:
        found.append(
            FieldError.invalid(path, value, "name part must be no more than 63 characters")
        )
    elif not re.fullmatch(_QUALIFIED_NAME, name):
        found.append(FieldError.invalid(path, value, QUALIFIED_NAME_MESSAGE))
    return found


def validate_metadata(obj: Obj, *, dns_label_name: bool) -> list[FieldError]:
    """Name, labels, annotations and finalizers, as ``ValidateObjectMeta`` checks them."""
    metadata = obj.get("metadata") or {}
    found: list[FieldError] = []
    name = metadata.get("name", "")
    if not name:
        found.append(FieldError.required("metadata.name", "name or generateName is required"))
    elif dns_label_name:
        found += dns_label_errors("metadata.name", name)
    else:
        found += subdomain_errors("metadata.name", name)
    for key, value in (metadata.get("labels") or {}).items():
        found += qualified_name_errors("metadata.labels", key)
        if not isinstance(value, str):
            found.append(FieldError.invalid("metadata.labels", value, "must be a string"))
            continue
        if len(value) > 63:
            found.append(
                FieldError.invalid("metadata.labels", value, "must be no more than 63 characters")
            )
        if not re.fullmatch(_LABEL_VALUE, value):
            found.append(FieldError.invalid("metadata.labels", value, LABEL_VALUE_MESSAGE))
    for key in metadata.get("annotations") or {}:
        found += qualified_name_errors("metadata.annotations", key.lower())
    for index, finalizer in enumerate(metadata.get("finalizers") or []):
        found += qualified_name_errors(f"metadata.finalizers[{index}]", finalizer)
    return found


TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def _go_taint(taint: Obj) -> RawValue:
    """A taint printed as Go's ``%#v`` of ``core.Taint``, as the duplicate error shows it."""
    time_added = taint.get("timeAdded")
    return RawValue(
        f"core.Taint{{Key:{json.dumps(taint.get('key', ''))}, "
        f"Value:{json.dumps(taint.get('value', ''))}, "
        f"Effect:{json.dumps(taint.get('effect', ''))}, "
        f"TimeAdded:{'<nil>' if time_added is None else json.dumps(time_added)}}}"
    )


def validate_taints(taints: list[Obj], path: str) -> list[FieldError]:
    found: list[FieldError] = []
    seen: set[tuple[str, str]] = set()
    for index, taint in enumerate(taints):
        item = f"{path}[{index}]"
        key = taint.get("key", "")
        if not key:
            found.append(FieldError.required(f"{item}.key", ""))
        else:
            found += qualified_name_errors(f"{item}.key", key)
        value = taint.get("value", "")
        if value and not re.fullmatch(_LABEL_VALUE, value):
            found.append(FieldError.invalid(f"{item}.value", value, LABEL_VALUE_MESSAGE))
        effect = taint.get("effect", "")
        if not effect:
            found.append(FieldError.required(f"{item}.effect", ""))
        elif effect not in TAINT_EFFECTS:
            found.append(FieldError.not_supported(f"{item}.effect", effect, TAINT_EFFECTS))
        if (key, effect) in seen:
            found.append(
                FieldError.duplicate(
                    item, _go_taint(taint), "taints must be unique by key and effect pair"
                )
            )
        seen.add((key, effect))
    return found


def int_or_percent_errors(path: str, value: Any) -> list[FieldError]:
    """``IntOrString`` budgets: a non-negative integer or a percentage up to 100%."""
    if isinstance(value, bool):
        return [FieldError.invalid(path, value, "must be an integer or percentage")]
    if isinstance(value, int):
        if value < 0:
            return [FieldError.invalid(path, value, "must be greater than or equal to 0")]
        return []
    if isinstance(value, str):
        match = re.fullmatch(r"(\d+)%", value)
        if match is None:
            return [
                FieldError.invalid(
                    path,
                    value,
                    "a valid percent string must be a numeric string followed by an ending '%' "
                    "(e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')",
                )
            ]
        if int(match.group(1)) > 100:
            return [FieldError.invalid(path, value, "must not be greater than 100%")]
        return []
    return [FieldError.invalid(path, value, "must be an integer or percentage")]
