"""`gpuop`: entry point of the console script; builds the argument parser and dispatches.

Exit codes are the same for every subcommand (`gpuop.cli.errors` lists which failure gives
which): 0 success, 1 the work failed, 2 bad usage or settings (the message says which flag
is wrong), 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from gpuop import __version__, plugins
from gpuop.bus.errors import BusError
from gpuop.cli import run
from gpuop.cli.errors import CommandFailed
from gpuop.kube.errors import KubeError
from gpuop.runtime.services import UnknownService
from gpuop.runtime.settings import SettingsError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def parser(*, only_run: bool = False) -> argparse.ArgumentParser:
    """Every command's parser; with `only_run`, just `gpuop run`'s, so that a service's
    process never imports the other commands (the Kubernetes client, the upgrade views, the
    simulation's plugins): a node agent starts in less time and memory."""
    top = argparse.ArgumentParser(
        prog="gpuop",
        description="GPU and RDMA-network node operator for Kubernetes, on NATS JetStream.",
    )
    top.add_argument("--version", action="version", version=f"gpuop {__version__}")
    verbs = top.add_subparsers(dest="verb", required=True, metavar="COMMAND")
    run.add_parser(verbs)
    if only_run:
        return top
    from gpuop.cli import (
        bus,
        cdi,
        discover,
        driver,
        events,
        natsauth,
        package,
        remediation,
        replay,
        runtimes,
        upgrade,
    )

    events.add_parser(verbs)
    replay.add_parser(verbs)
    discover.add_parser(verbs)
    upgrade.add_parser(verbs)
    bus.add_parser(verbs)
    natsauth.add_parser(verbs)
    package.add_parser(verbs)
    driver.add_parser(verbs)
    runtimes.add_parser(verbs)
    cdi.add_parser(verbs)
    remediation.add_parser(verbs)
    for add_parser in plugins.load_all("gpuop.commands").values():  # `demo`, `sim`
        add_parser(verbs)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = parser(only_run=arguments[:1] == ["run"]).parse_args(arguments)
    try:
        return int(asyncio.run(args.handler(args, os.environ)))
    except (SettingsError, UnknownService, ValueError, plugins.PluginMissing) as exc:
        print(f"gpuop {_command(args)}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (BusError, CommandFailed, KubeError) as exc:
        print(f"gpuop {_command(args)}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `gpuop ... | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def _command(args: argparse.Namespace) -> str:
    """`upgrade start`, `events tail`, `demo`: the words the user typed."""
    action = getattr(args, "action", None)
    return f"{args.verb} {action}" if action else str(args.verb)


if __name__ == "__main__":
    sys.exit(main())
