"""TOML read with the file and line named on a syntax error, and written back from the
tables `tomllib` gives: the container runtime drop-ins (`gpuop.host.runtimes`) copy tables
out of a node's containerd or CRI-O config and write them into a file of their own.

The writer covers what those configs hold (tables, arrays of tables, strings, integers,
floats, booleans, arrays); it is no general TOML library, and the standard library has no
writer. Tables are written after the plain keys of their parent, in the order `tomllib`
read them, so a drop-in made from the same input is the same bytes every time.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from gpuop.host.errors import HostReadError

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_AT_LINE = re.compile(r"\(at line (\d+), column (\d+)\)")


def parse(path: Path, text: str) -> dict[str, Any]:
    """The tables of `text`, read from `path`; a syntax error raises `HostReadError` naming
    the file and the line: `/etc/containerd/config.toml: line 3: Invalid value`."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        message = str(error)
        found = _AT_LINE.search(message)
        if found is None:
            raise HostReadError(path, f"not valid TOML: {message}") from None
        reason = message[: found.start()].strip()
        raise HostReadError(
            path, f"line {found.group(1)}: not valid TOML: {reason} (column {found.group(2)})"
        ) from None


def dumps(document: Mapping[str, Any]) -> str:
    """`document` as TOML text: its plain keys first, then each table under its full name."""
    return "\n".join(_table((), document)).lstrip("\n") + "\n"


def _table(path: tuple[str, ...], table: Mapping[str, Any]) -> Iterator[str]:
    plain = [(k, v) for k, v in table.items() if not _is_table(v) and not _is_table_array(v)]
    nested = [(k, v) for k, v in table.items() if _is_table(v) or _is_table_array(v)]
    if path and (plain or not nested):
        yield ""
        yield f"[{_dotted(path)}]"
    for key, value in plain:
        yield f"{_key(key)} = {_value(value)}"
    for key, value in nested:
        if _is_table(value):
            yield from _table((*path, key), value)
            continue
        for item in value:
            yield ""
            yield f"[[{_dotted((*path, key))}]]"
            for inner_key, inner in item.items():
                yield f"{_key(inner_key)} = {_value(inner)}"


def _is_table(value: object) -> bool:
    return isinstance(value, Mapping)


def _is_table_array(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, Mapping) for v in value)


def _dotted(path: tuple[str, ...]) -> str:
    return ".".join(_key(part) for part in path)


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else _string(key)


def _string(text: str) -> str:
    # JSON's escapes (\" \\ \b \f \n \r \t \uXXXX) are all valid in a TOML basic string
    return json.dumps(text, ensure_ascii=False)


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    # dates and times: TOML's own forms are what isoformat writes
    isoformat = getattr(value, "isoformat", None)
    if callable(isoformat):
        return str(isoformat())
    raise TypeError(f"no TOML form for {type(value).__name__}")
