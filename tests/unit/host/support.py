"""Build small host roots from a mapping of path to content."""

from __future__ import annotations

from pathlib import Path

from gpuop.host.roots import HostRoot


def make_root(directory: Path, files: dict[str, str | bytes]) -> HostRoot:
    for relative, content in files.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return HostRoot(directory)
