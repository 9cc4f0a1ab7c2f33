"""From a pydantic model to a structural OpenAPI v3 schema, as a CRD's `openAPIV3Schema`.

pydantic writes JSON Schema 2020-12; the Kubernetes API server wants a *structural* schema:
every node with a `type`, no `$ref`, no `additionalProperties: false` (the server prunes
unknown fields instead), `nullable` instead of a `null` branch, and `anyOf` only in the
int-or-string form. `structural` rewrites one into the other and keeps what matters for
users and for validation: descriptions (the models' attribute docstrings), types, formats,
enums, bounds, patterns, required fields and, for the spec, defaults, so the API server
stores every policy with its defaults filled in. Called by `gpuop.policy.crd`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

Schema = dict[str, Any]

_KEY_ORDER = (
    "description",
    "type",
    "format",
    "x-kubernetes-int-or-string",
    "anyOf",
    "enum",
    "default",
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "items",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "required",
    "properties",
    "additionalProperties",
)
_DROPPED = frozenset({"title", "$defs"})


def structural(model: type[BaseModel], *, defaults: bool = True) -> Schema:
    """The structural schema of `model` on the wire (camelCase names); `defaults=False`
    leaves the `default` values out (for status, which gpuop writes whole)."""
    generated = model.model_json_schema(by_alias=True, mode="validation")
    return _convert(generated, generated.get("$defs", {}), defaults=defaults)


def _convert(schema: Schema, defs: dict[str, Schema], *, defaults: bool) -> Schema:
    ref = schema.get("$ref")
    if ref is not None:
        # The field's own keys (its description, its default) win over the model's.
        target = defs[ref.rsplit("/", 1)[-1]]
        rest = {key: value for key, value in schema.items() if key != "$ref"}
        return _convert({**target, **rest}, defs, defaults=defaults)
    if "anyOf" in schema and not schema.get("x-kubernetes-int-or-string"):
        options = [option for option in schema["anyOf"] if option.get("type") != "null"]
        if len(options) != 1:
            raise TypeError(f"no structural schema for a union of {options}")
        # An optional field: the API server drops a null it does not allow, so the field
        # is simply absent, which the model reads as None.
        rest = {key: value for key, value in schema.items() if key != "anyOf"}
        if rest.get("default", ...) is None:
            del rest["default"]
        return _convert({**options[0], **rest}, defs, defaults=defaults)
    converted: Schema = {}
    for key, value in schema.items():
        if key in _DROPPED or (key == "additionalProperties" and value is False):
            continue
        if key == "default" and (not defaults or value is None):
            continue
        if key == "description":
            converted[key] = _paragraphs(value)
        elif key == "properties":
            converted[key] = {
                name: _convert(child, defs, defaults=defaults) for name, child in value.items()
            }
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            converted[key] = _convert(value, defs, defaults=defaults)
        elif key == "anyOf":
            converted[key] = [{"type": "integer"}, {"type": "string"}]
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            # JSON Schema's numeric form; OpenAPI v3.0 pairs the bound with a flag.
            converted["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            converted[key] = True
        elif key == "const":
            converted["enum"] = [value]
        else:
            converted[key] = value
    if converted.get("type") == "object" and isinstance(converted.get("default"), dict):
        # The API server defaults the fields inside a defaulted object from their own
        # schemas, so `{}` is enough and cannot disagree with them.
        converted["default"] = {}
    return _ordered(converted)


def _paragraphs(text: str) -> str:
    """A docstring's paragraphs, each on one line, as `kubectl explain` rewraps them."""
    return "\n\n".join(" ".join(block.split()) for block in text.split("\n\n"))


def _ordered(schema: Schema) -> Schema:
    known = [key for key in _KEY_ORDER if key in schema]
    rest = sorted(key for key in schema if key not in _KEY_ORDER)
    return {key: schema[key] for key in [*known, *rest]}
