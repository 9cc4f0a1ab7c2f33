"""Hypothesis strategies for hostile bus input: bytes, documents and envelopes no gpuop
producer writes, for the tests that publish them on subjects gpuop consumers read (the bus's
hostile-input test, and the rollout under hostile input end to end).

Most start from a valid envelope (a JSON document) and break one thing about it. Each comes
as a function of hypothesis's `draw`, for composite strategies that build thousands of
messages (a strategy object per message would cost more than the message), and as a
strategy.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from gpuop.events import Command, Envelope, Event, Payload, new_command, new_event

HUGE = 512 * 1024
"""Bytes in a huge field: far beyond every field's limit, well below NATS's 1 MiB payload."""
ENVELOPE_STRINGS = ("id", "source", "type", "subject", "correlationid", "causationid")
SOURCE = "/gpuop/hostile"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=8,
)
"""Any JSON value, small."""

garbage = st.one_of(
    st.binary(max_size=300),
    json_values.map(lambda value: json.dumps(value).encode()),
    st.just(b"\xff" * 10),
    st.just(b"[" * 5000),
    st.just(b'{"a":' * 5000),
)
"""Bytes that are not an envelope at all: binary, any JSON value, nesting too deep to parse."""

_fields = st.integers(min_value=0, max_value=1 << 16)
_fillers = st.sampled_from("x0é")


def envelope_of(
    payload: Payload, node: str, id: str, *, correlationid: str | None = None
) -> Envelope:
    """A valid envelope around `payload` about `node`, as a hostile publisher would write it."""
    if isinstance(payload, Command):
        return new_command(payload, node=node, source=SOURCE, id=id, correlationid=correlationid)
    assert isinstance(payload, Event)
    return new_event(payload, node=node, source=SOURCE, id=id, correlationid=correlationid)


def document_of(envelope: Envelope) -> dict[str, Any]:
    """`envelope` as the JSON document on the wire."""
    document: dict[str, Any] = json.loads(envelope.to_bytes())
    return document


def encoded(document: dict[str, Any]) -> bytes:
    """`document` as UTF-8 JSON (one byte per ASCII character, two for `é`)."""
    return json.dumps(document, ensure_ascii=False).encode()


def mutate(draw: st.DrawFn, document: dict[str, Any]) -> bytes:
    """`document` with one to three envelope fields and up to two data fields removed or
    given a value of any JSON type; it may stay valid (an optional field removed)."""
    document = {**document, "data": dict(document["data"])}
    for field in _some(draw, sorted(document), 1 + draw(_fields) % 3):
        if draw(st.booleans()):
            del document[field]
        else:
            document[field] = draw(json_values)
    data = document.get("data")
    if isinstance(data, dict) and data:
        for field in _some(draw, sorted(data), draw(_fields) % 3):
            if draw(st.booleans()):
                del data[field]
            else:
                data[field] = draw(json_values)
    return encoded(document)


def enlarge(draw: st.DrawFn, document: dict[str, Any], size: int = HUGE) -> bytes:
    """`document` with one string of `size` bytes: in an envelope field, in a data field, or
    in a data field no model has (which tolerant readers ignore)."""
    filler = draw(_fillers)
    text = filler * (size // len(filler.encode()))
    document = {**document, "data": dict(document["data"])}
    where = draw(_fields) % 3
    if where == 0:
        document[_one(draw, ENVELOPE_STRINGS)] = text
    elif where == 1 and document["data"]:
        document["data"][_one(draw, sorted(document["data"]))] = text
    else:
        document["data"]["padding"] = text
    return encoded(document)


def newer(draw: st.DrawFn, document: dict[str, Any]) -> bytes:
    """`document` claiming a later version of its type (`...v7`), its data anything: what a
    newer producer would send."""
    stem = str(document["type"]).rsplit(".v", 1)[0]
    version = 2 + draw(_fields) % 98
    data = (
        document["data"]
        if draw(st.booleans())
        else draw(st.dictionaries(st.text(max_size=8), json_values, max_size=4))
    )
    return encoded({**document, "type": f"{stem}.v{version}", "data": data})


def mutated(document: dict[str, Any]) -> st.SearchStrategy[bytes]:
    return st.composite(lambda draw: mutate(draw, document))()


def huge(document: dict[str, Any], size: int = HUGE) -> st.SearchStrategy[bytes]:
    return st.composite(lambda draw: enlarge(draw, document, size))()


def newer_version(document: dict[str, Any]) -> st.SearchStrategy[bytes]:
    return st.composite(lambda draw: newer(draw, document))()


def _one(draw: st.DrawFn, items: Any) -> Any:
    return items[draw(_fields) % len(items)]


def _some(draw: st.DrawFn, items: list[str], count: int) -> list[str]:
    chosen: list[str] = []
    for _ in range(min(count, len(items))):
        left = [item for item in items if item not in chosen]
        chosen.append(_one(draw, left))
    return chosen
