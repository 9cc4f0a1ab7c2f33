"""Host roots written by hand, for tests of what reads them."""

from __future__ import annotations

import shutil
from pathlib import Path


def write_host_root(root: Path, *, loaded: bool = True) -> None:
    (root / "proc").mkdir(parents=True, exist_ok=True)
    lines = ["nvidia_uvm 1830912 - - Live 0xffffffffc080c000 (O)"]
    if loaded:
        lines.append("nvidia 14299136 - - Live 0xffffffffc0400000 (O)")
    (root / "proc/modules").write_text("\n".join(lines) + "\n")
    version = root / "sys/module/nvidia/version"
    if loaded:
        version.parent.mkdir(parents=True, exist_ok=True)
        version.write_text("580.159.04\n")
    elif version.parent.exists():
        shutil.rmtree(version.parent)
