"""The bus benchmark (`tests/bench/bus.py`) on a three-server JetStream cluster, every stream
with three replicas: gpuop.bus against raw nats-py on the same cluster, the ratio the figure.

Run by `tests.bench.run_all` (`make bench`), or alone:
`.venv/bin/python -m tests.bench.bus_cluster [--quick]`. The last line printed is one JSON
object.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from tests.bench import bus


def main(argv: Sequence[str] | None = None) -> int:
    return bus.main(["--cluster", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
