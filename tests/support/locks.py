"""The dependency locks under requirements/, read as pip's hash-checking format: what the
lock and SBOM tests share."""

from __future__ import annotations

import re
from pathlib import Path

from packaging.utils import canonicalize_name

from tests.support.charts import REPO

LOCKS = REPO / "requirements"
RUNTIME = LOCKS / "runtime.lock"
DEV = LOCKS / "dev.lock"
IMAGE = {"sys_platform": "linux", "platform_system": "Linux", "python_version": "3.11"}
"""Where the runtime lock is installed: the image's python:3.11-slim."""
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$")


def pins(lock: Path) -> dict[str, tuple[str, str, int]]:
    """name -> (version, environment marker, number of hashes), from pip's hash format."""
    found: dict[str, tuple[str, str, int]] = {}
    name = ""
    for line in lock.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.startswith(" "):
            assert line.strip().startswith("--hash=sha256:"), f"{lock.name}: {line.strip()}"
            version, marker, hashes = found[name]
            found[name] = (version, marker, hashes + 1)
            continue
        match = _PIN.match(line)
        assert match, f"{lock.name}: {line!r} is not a pin (name==version)"
        name = canonicalize_name(match[1])
        found[name] = (match[2], (match[3] or "").strip(), 0)
    return found
