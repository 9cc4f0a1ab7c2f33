"""`python -m tests.support.images build`: both images (`make image`); `... lock`: write
deploy/image/debian.lock again from apt's current candidates."""

from __future__ import annotations

import argparse
import time

from tests.support.images import build, debian


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.support.images")
    parser.add_argument("command", choices=["build", "lock"])
    arguments = parser.parse_args()
    if arguments.command == "lock":
        debian.write_lock(debian.resolve())
        print(f"wrote {debian.LOCK}")
        return
    for make in (build.build_gpuop, build.build_nats):
        started = time.monotonic()
        built = make()
        size = built.path.stat().st_size / 1e6
        print(f"{built.name} {built.digest} {built.path} ({size:.1f} MB, "
              f"{time.monotonic() - started:.1f} s)")  # fmt: skip


if __name__ == "__main__":
    main()
