"""Building a wheel as the Dockerfile does, for the deploy tests: `pip wheel --no-deps` with
the build backend already in the venv (no isolation, so no network)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def build_wheel(source: Path, wheel_dir: Path) -> Path:
    """Builds the project at `source` into `wheel_dir` and returns the one wheel written."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(wheel_dir), str(source)],
        check=True,
        capture_output=True,
        timeout=110,
    )  # fmt: skip
    (wheel,) = wheel_dir.glob("*.whl")
    return wheel
