"""Building a wheel as the Dockerfile does, for the deploy tests: `pip wheel --no-deps` with
the build backend already in the venv (no isolation, so no network)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def build_wheel(source: Path, wheel_dir: Path, epoch: int | None = None) -> Path:
    """Builds the project at `source` into `wheel_dir` and returns the one wheel written;
    with `epoch`, every file in it is dated then (SOURCE_DATE_EPOCH), so the same sources
    give the same wheel."""
    environment = dict(os.environ)
    if epoch is not None:
        environment["SOURCE_DATE_EPOCH"] = str(epoch)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(wheel_dir), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
        env=environment,
    )  # fmt: skip
    (wheel,) = wheel_dir.glob("*.whl")
    return wheel
