"""Request bodies in Kubernetes' protobuf encoding, for the kinds kubectl sends that way.

client-go's typed clients send built-in kinds as ``application/vnd.kubernetes.protobuf``
(and accept JSON back): ``kubectl auth can-i`` posts its SelfSubjectAccessReview so,
``kubectl auth whoami`` its SelfSubjectReview, ``kubectl drain`` its Evictions.
kube-apiserver decodes every built-in kind; this server decodes only the ones written here
(the reviews and Eviction) into the JSON form the handlers take, and answers others 415 as
before. The body is apimachinery's envelope: the magic ``k8s\\0``, then a ``runtime.Unknown``
message holding the type and the object's own message, whose field numbers are those of
``k8s.io/api``'s ``generated.proto``. Unknown fields are skipped, as protobuf readers do;
label and field selectors of a review's attributes, and a subject review's ``extra``, are
among them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from gpuop_sim.apiserver import errors

Obj = dict[str, Any]

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
_MAGIC = b"k8s\x00"


class Field(NamedTuple):
    name: str
    type: str | Mapping[int, Field]
    """``string``, ``bytes``, ``bool``, ``int64``, or the fields of a nested message."""
    repeated: bool = False


Message = Mapping[int, Field]

_OBJECT_META: Message = {
    1: Field("name", "string"),
    2: Field("generateName", "string"),
    3: Field("namespace", "string"),
}
_RESOURCE_ATTRIBUTES: Message = {
    1: Field("namespace", "string"),
    2: Field("verb", "string"),
    3: Field("group", "string"),
    4: Field("version", "string"),
    5: Field("resource", "string"),
    6: Field("subresource", "string"),
    7: Field("name", "string"),
}
_NON_RESOURCE_ATTRIBUTES: Message = {1: Field("path", "string"), 2: Field("verb", "string")}
_SELF_ACCESS_SPEC: Message = {
    1: Field("resourceAttributes", _RESOURCE_ATTRIBUTES),
    2: Field("nonResourceAttributes", _NON_RESOURCE_ATTRIBUTES),
}
_ACCESS_SPEC: Message = {
    **_SELF_ACCESS_SPEC,
    3: Field("user", "string"),
    4: Field("groups", "string", repeated=True),
    6: Field("uid", "string"),
}
_DELETE_OPTIONS: Message = {
    1: Field("gracePeriodSeconds", "int64"),
    2: Field("preconditions", {1: Field("uid", "string"), 2: Field("resourceVersion", "string")}),
    3: Field("orphanDependents", "bool"),
    4: Field("propagationPolicy", "string"),
    5: Field("dryRun", "string", repeated=True),
}


def _object(spec: Field) -> Message:
    return {1: Field("metadata", _OBJECT_META), 2: spec}


KINDS: Mapping[tuple[str, str], Message] = {
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview"): _object(
        Field("spec", _SELF_ACCESS_SPEC)
    ),
    ("authorization.k8s.io/v1", "SubjectAccessReview"): _object(Field("spec", _ACCESS_SPEC)),
    ("authorization.k8s.io/v1", "LocalSubjectAccessReview"): _object(Field("spec", _ACCESS_SPEC)),
    ("authorization.k8s.io/v1", "SelfSubjectRulesReview"): _object(
        Field("spec", {1: Field("namespace", "string")})
    ),
    ("authentication.k8s.io/v1", "SelfSubjectReview"): {1: Field("metadata", _OBJECT_META)},
    ("policy/v1", "Eviction"): _object(Field("deleteOptions", _DELETE_OPTIONS)),
}
_UNKNOWN: Message = {
    1: Field("typeMeta", {1: Field("apiVersion", "string"), 2: Field("kind", "string")}),
    2: Field("raw", "bytes"),
}


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if not byte & 0x80:
            return value, at


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """Each field of a message: its number and its varint or length-delimited value."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire_type = key >> 3, key & 7
        value: int | bytes
        if wire_type == 0:
            value, at = _varint(data, at)
        elif wire_type == 2:
            length, at = _varint(data, at)
            if at + length > len(data):
                raise ValueError("truncated field")
            value, at = data[at : at + length], at + length
        elif wire_type in (1, 5):
            size = 8 if wire_type == 1 else 4
            value, at = data[at : at + size], at + size
        else:
            raise ValueError(f"unsupported wire type {wire_type}")
        yield number, value


def _value(field: Field, raw: int | bytes) -> Any:
    if isinstance(field.type, Mapping):
        return _message(_bytes(raw), field.type)
    if field.type == "string":
        return _bytes(raw).decode()
    if field.type == "bytes":
        return _bytes(raw)
    number = _number(raw)
    if field.type == "bool":
        return bool(number)
    return number - (1 << 64) if number >= 1 << 63 else number


def _bytes(raw: int | bytes) -> bytes:
    if not isinstance(raw, bytes):
        raise ValueError("expected a length-delimited field")
    return raw


def _number(raw: int | bytes) -> int:
    if not isinstance(raw, int):
        raise ValueError("expected a varint field")
    return raw


def _message(data: bytes, message: Message) -> Obj:
    decoded: Obj = {}
    for number, raw in _fields(data):
        field = message.get(number)
        if field is None:
            continue
        value = _value(field, raw)
        if field.repeated:
            decoded.setdefault(field.name, []).append(value)
        else:
            decoded[field.name] = value
    return decoded


def decode(body: bytes) -> Obj:
    """The JSON form of a protobuf-encoded object: 400 when it is not one, 415 when it is of
    a kind this server cannot read in protobuf."""
    if not body.startswith(_MAGIC):
        raise errors.bad_request("provided data does not appear to be a protobuf message")
    try:
        envelope = _message(body[len(_MAGIC) :], _UNKNOWN)
        type_meta = envelope.get("typeMeta") or {}
        api_version, kind = type_meta.get("apiVersion", ""), type_meta.get("kind", "")
        message = KINDS.get((api_version, kind))
        if message is None:
            raise errors.unsupported_media_type(("application/json", "application/yaml"))
        obj = _message(envelope.get("raw", b""), message)
    except (ValueError, UnicodeDecodeError) as error:
        raise errors.bad_request(f"the body of the request could not be decoded: {error}") from None
    return {"apiVersion": api_version, "kind": kind, **obj}
