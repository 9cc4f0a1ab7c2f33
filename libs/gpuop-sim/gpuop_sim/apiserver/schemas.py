"""Structural ``openAPIV3Schema`` handling for custom resources, and CRD validation.

A real API server prunes unknown fields from custom resources, drops nulls the schema does
not allow, applies ``default`` values, then validates types, required fields, enums, bounds
and patterns, reporting each failure as a field error naming the path
(``spec.replicas: Invalid value: "string": spec.replicas in body must be of type integer:
"string"``). ``crds.py`` builds a normaliser (:func:`prune_and_default`) and a validator
(:func:`validate_object`) per served version; ``kinds.py`` uses :func:`validate_crd` for
the CustomResourceDefinition objects themselves.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from gpuop_sim.apiserver.errors import FieldError, RawValue

Obj = dict[str, Any]
Schema = dict[str, Any]

CLEANUP_FINALIZER = "customresourcecleanup.apiextensions.k8s.io"

_ROOT_KEPT = ("apiVersion", "kind", "metadata")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _preserves_unknown(schema: Schema) -> bool:
    return bool(schema.get("x-kubernetes-preserve-unknown-fields"))


def prune_and_default(obj: Obj, schema: Schema) -> None:
    """Drop fields the schema does not know, and nulls it does not allow; fill defaults."""
    _prune(obj, schema, root=True)


def _prune(value: Any, schema: Schema, *, root: bool = False) -> None:
    if isinstance(value, dict):
        properties: dict[str, Schema] = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        embedded = schema.get("x-kubernetes-embedded-resource")
        for key in list(value):
            if (root or embedded) and key in _ROOT_KEPT:
                continue
            child = properties.get(key)
            if child is None and isinstance(additional, dict):
                child = additional
            if child is None:
                if not _preserves_unknown(schema) and additional is not True:
                    del value[key]
                continue
            if value[key] is None and not child.get("nullable"):
                del value[key]
                continue
            _prune(value[key], child)
        for key, child in properties.items():
            if key not in value and "default" in child:
                value[key] = copy.deepcopy(child["default"])
                _prune(value[key], child)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            _prune(item, schema["items"])


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _type_matches(expected: str, value: Any) -> bool:
    actual = _type_name(value)
    return actual == expected or (expected == "number" and actual == "integer")


def validate_object(obj: Obj, schema: Schema) -> list[FieldError]:
    """Validate a custom resource (without its ``metadata``) against the schema."""
    body = {key: value for key, value in obj.items() if key != "metadata"}
    return _validate(body, schema, "", root=True)


def _validate(value: Any, schema: Schema, path: str, *, root: bool = False) -> list[FieldError]:
    label = path or "body"
    if schema.get("x-kubernetes-int-or-string"):
        if _type_name(value) not in ("integer", "string"):
            return [
                FieldError.invalid(
                    path, _type_name(value), f"{label} in body must be of type int-or-string"
                )
            ]
    elif "type" in schema and not _type_matches(schema["type"], value):
        if value is None and schema.get("nullable"):
            return []
        return [
            FieldError.invalid(
                path,
                _type_name(value),
                f'{label} in body must be of type {schema["type"]}: "{_type_name(value)}"',
            )
        ]
    found: list[FieldError] = []
    if "enum" in schema and value not in schema["enum"]:
        supported = tuple(str(option) for option in schema["enum"])
        found.append(FieldError.not_supported(path, value, supported))
    found += _bounds(value, schema, path, label)
    if isinstance(value, dict):
        for required in schema.get("required") or []:
            if required not in value:
                found.append(FieldError.required(_join(path, required), ""))
        properties: dict[str, Schema] = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        for key, child_value in value.items():
            if root and key in ("apiVersion", "kind"):
                continue
            child = properties.get(key) or (additional if isinstance(additional, dict) else None)
            if child is not None:
                found += _validate(child_value, child, _join(path, key))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            found += _validate(item, schema["items"], f"{path}[{index}]")
    return found


def _bounds(value: Any, schema: Schema, path: str, label: str) -> list[FieldError]:
    found: list[FieldError] = []
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "maximum" in schema:
            limit = schema["maximum"]
            if value > limit or (schema.get("exclusiveMaximum") and value == limit):
                relation = (
                    "less than" if schema.get("exclusiveMaximum") else "less than or equal to"
                )
                found.append(
                    FieldError.invalid(path, value, f"{label} in body should be {relation} {limit}")
                )
        if "minimum" in schema:
            limit = schema["minimum"]
            if value < limit or (schema.get("exclusiveMinimum") and value == limit):
                relation = (
                    "greater than" if schema.get("exclusiveMinimum") else "greater than or equal to"
                )
                found.append(
                    FieldError.invalid(path, value, f"{label} in body should be {relation} {limit}")
                )
    if isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            found.append(
                FieldError.invalid(
                    path,
                    value,
                    f"{label} in body should be at most {schema['maxLength']} chars long",
                )
            )
        if "minLength" in schema and len(value) < schema["minLength"]:
            found.append(
                FieldError.invalid(
                    path,
                    value,
                    f"{label} in body should be at least {schema['minLength']} chars long",
                )
            )
        if "pattern" in schema and re.search(schema["pattern"], value) is None:
            found.append(
                FieldError.invalid(
                    path, value, f"{label} in body should match '{schema['pattern']}'"
                )
            )
    if isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            found.append(
                FieldError.invalid(
                    path,
                    len(value),
                    f"{label} in body should have at most {schema['maxItems']} items",
                )
            )
        if "minItems" in schema and len(value) < schema["minItems"]:
            found.append(
                FieldError.invalid(
                    path,
                    len(value),
                    f"{label} in body should have at least {schema['minItems']} items",
                )
            )
    return found


def validate_crd(new: Obj, old: Obj | None) -> list[FieldError]:
    """The CustomResourceDefinition checks gpuop's CRDs could trip over."""
    spec = new.get("spec") or {}
    names = spec.get("names") or {}
    group, plural = spec.get("group", ""), names.get("plural", "")
    found: list[FieldError] = []
    if not group:
        found.append(FieldError.required("spec.group", ""))
    elif "." not in group:
        found.append(
            FieldError.invalid("spec.group", group, "should be a domain with at least one dot")
        )
    if not plural:
        found.append(FieldError.required("spec.names.plural", ""))
    if not names.get("kind"):
        found.append(FieldError.required("spec.names.kind", ""))
    name = new["metadata"].get("name", "")
    if group and plural and name != f"{plural}.{group}":
        found.append(
            FieldError.invalid("metadata.name", name, 'must be spec.names.plural+"."+spec.group')
        )
    scope = spec.get("scope")
    if scope not in ("Namespaced", "Cluster"):
        found.append(FieldError.not_supported("spec.scope", scope, ("Cluster", "Namespaced")))
    elif old is not None and scope != (old.get("spec") or {}).get("scope"):
        found.append(FieldError.invalid("spec.scope", scope, "field is immutable"))
    versions = spec.get("versions") or []
    if not versions:
        found.append(
            FieldError.required(
                "spec.versions", "must have exactly one version marked as storage version"
            )
        )
    elif sum(1 for version in versions if version.get("storage")) != 1:
        found.append(
            FieldError.invalid(
                "spec.versions",
                RawValue("[" + ", ".join(str(v.get("name")) for v in versions) + "]"),
                "must have exactly one version marked as storage version",
            )
        )
    for index, version in enumerate(versions):
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        if not schema:
            found.append(
                FieldError.required(
                    f"spec.versions[{index}].schema.openAPIV3Schema", "schemas are required"
                )
            )
    return found
