"""How a command with actions of its own (`gpuop bus backup`, `gpuop sim apiserver`) joins
the `gpuop` parser; each command module's `add_parser` calls it, so every such command
takes its action the same way (a required `ACTION`, read back as `args.action`)."""

from __future__ import annotations

import argparse
from typing import Any


def add_command(verbs: Any, name: str, *, help: str, description: str | None = None) -> Any:
    """Add the command `name` to the top parser's `verbs`; returns the group its actions are
    added to (`actions.add_parser("backup", ...)`)."""
    command: argparse.ArgumentParser = verbs.add_parser(name, help=help, description=description)
    return command.add_subparsers(dest="action", required=True, metavar="ACTION")
