"""`python -m tests.support.images build`: both images (`make image`); `... lock`: write
deploy/image/debian.lock again from apt's current candidates; `... sbom PATH`: add the
image's Debian packages to the SBOM at PATH (`make sbom`)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from tests.support.images import build, debian, sboms


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.support.images")
    parser.add_argument("command", choices=["build", "lock", "sbom"])
    parser.add_argument("sbom", nargs="?", type=Path, help="the SBOM to complete (sbom)")
    arguments = parser.parse_args()
    if arguments.command == "sbom":
        if arguments.sbom is None:
            parser.error("sbom needs the SBOM's path")
        sboms.add_debian(arguments.sbom)
        return
    if arguments.command == "lock":
        debian.write_lock(debian.resolve())
        print(f"wrote {debian.LOCK}")
        return
    made = []
    for make in (build.build_gpuop, build.build_nats):
        started = time.monotonic()
        built = make()
        made.append(built)
        size = built.path.stat().st_size / 1e6
        print(f"{built.name} {built.digest} {built.path} ({size:.1f} MB, "
              f"{time.monotonic() - started:.1f} s)")  # fmt: skip
    build.prune(build.CACHE, made)


if __name__ == "__main__":
    main()
