"""`gpuop`: entry point of the console script; builds the argument parser and dispatches.

Exit codes are the same for every subcommand: 0 success, 1 the work failed, 2 bad usage or
settings (the message says which flag is wrong), 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from gpuop import __version__
from gpuop.bus.errors import BusError
from gpuop.cli import demo, discover, events, replay, run, sim
from gpuop.runtime.services import UnknownService
from gpuop.runtime.settings import SettingsError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="gpuop",
        description="GPU and RDMA-network node operator for Kubernetes, on NATS JetStream.",
    )
    top.add_argument("--version", action="version", version=f"gpuop {__version__}")
    verbs = top.add_subparsers(dest="verb", required=True, metavar="COMMAND")
    run.add_parser(verbs)
    events.add_parser(verbs)
    replay.add_parser(verbs)
    discover.add_parser(verbs)
    demo.add_parser(verbs)
    sim.add_parser(verbs)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(asyncio.run(args.handler(args, os.environ)))
    except (SettingsError, UnknownService, ValueError) as exc:
        print(f"gpuop {args.verb}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BusError as exc:
        print(f"gpuop {args.verb}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
