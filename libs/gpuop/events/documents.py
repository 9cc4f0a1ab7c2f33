"""Reading a JSON document that must be one object, written once for every reader of one:
the envelope's `decode`, the replay's export and log, the XID catalog, driver manifests.

`json_object` raises `ValueError` saying which of the two faults it found (not JSON at all,
or JSON that is not an object); each caller turns that into its own error, naming the
document. Nesting too deep to parse counts as not JSON: hostile input, never a crash.
"""

from __future__ import annotations

import json
from typing import Any


def json_object(data: bytes | str) -> dict[str, Any]:
    """`data` parsed as a JSON object; `ValueError` ("not JSON: ...", "not a JSON object
    but list") when it is not one."""
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise ValueError(f"not a JSON object but {type(document).__name__}")
    return document
