"""`gpuop driver install|status|rollback`: the break glass, one driver-manager step on this
host without NATS, the orchestrator or Kubernetes.

    gpuop driver install  --host-root DIR --source URL --version V [--component gpu]
                          [--public-key KEY ...|--allow-unsigned] [--sha256 D] [--no-load]
                          [--validate] [--kernel REL] [--output text|json]
    gpuop driver status   --host-root DIR [--component gpu] [--kernel REL] [--output json]
    gpuop driver rollback --host-root DIR [--version V] [--source URL ...] [--validate]

The steps run through the driver-manager's own code, built as `gpuop run driver-manager`
builds it (`agent.build_executor` from `--nvml`, `--config` and the kernel mode: `auto` is
the simulated kernel under `--nvml sim:<gpus>`, else the host's kmod chrooted into the host
root), as the orchestrator's commands (`InstallDriver`, `UnloadDriver`, `LoadDriver`,
`ValidateDriver`, `RollbackDriver`), each recorded in the host's driver state by
`agent.execute_recorded` under the state lock; the answers are printed instead of published.

    install    install the package (fetch, check the signed index and the digest, unpack,
               depmod), then, unless `--no-load` or it runs already, unload the running
               version and load this one, which flips the user-space switch; `--validate`
               asks NVML after. A load that fails leaves no driver running (the saga would
               roll back; here a person decides): the error names the rollback command
    status     per kernel under lib/modules: the versions installed and the active one; the
               version loaded with its modules, the user-space switch, and what the state
               remembers (the version a rollback returns to)
    rollback   the service's rollback: back to `--version`, by default the version that ran
               before the last load, installed again from `--source` when it was removed;
               the version rolled back from is uninstalled

`--kernel` picks one kernel's row of `status`; install and rollback act for the running
kernel, as the service does, and refuse another.

Exit codes as for every command (`gpuop.cli.errors`): 2 for bad input (no host root, a
source that is no directory or http(s) URL, no version to roll back to), 1 for a step that
failed (its answer says why: a version the source lacks names the ones it has) or a
driver-manager holding the host's state lock.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuop.cli.verbs import add_command
from gpuop.events import driver as dm


def add_parser(verbs: Any) -> None:
    actions = add_command(
        verbs,
        "driver",
        help="run one driver-manager step on this host (break glass)",
        description="Install, inspect or roll back a driver on this host through the "
        "driver-manager's own code, without NATS or the orchestrator.",
    )
    install = actions.add_parser("install", help="install a version, then load it")
    _common(install)
    _source_flags(install, required=True)
    install.add_argument("--version", required=True, help="driver version to install")
    install.add_argument("--no-load", action="store_true", help="install only")
    install.add_argument("--validate", action="store_true", help="ask NVML after the load")
    install.add_argument(
        "--allow-management-interface",
        action="store_true",
        help="ofed: unload even if the NIC of the default route goes down",
    )
    install.set_defaults(handler=install_driver)
    status = actions.add_parser("status", help="what is installed, loaded and switched on")
    _common(status)
    status.set_defaults(handler=driver_status)
    rollback = actions.add_parser("rollback", help="return to the version that ran before")
    _common(rollback)
    _source_flags(rollback, required=False)
    rollback.add_argument("--version", help="version to return to (default: the previous)")
    rollback.add_argument("--validate", action="store_true", help="ask NVML after the load")
    rollback.set_defaults(handler=rollback_driver)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host-root", type=Path, required=True, help="the node's root")
    parser.add_argument(
        "--component", choices=[c.value for c in dm.Component], default=dm.Component.GPU.value
    )
    parser.add_argument("--kernel", metavar="REL", help="kernel release (default: running)")
    parser.add_argument("--node", help="node name in the records (default: GPUOP_NODE, host)")
    parser.add_argument("--nvml", default="real", help="real, sim:<gpus> or recorded:<file>")
    parser.add_argument("--config", type=Path, help="the driver-manager's --config file")
    parser.add_argument(
        "--timeout", type=int, metavar="S", help="seconds a step may take (default: its own)"
    )
    parser.add_argument("--output", choices=("text", "json"), default="text")


def _source_flags(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument("--source", required=required, help="driver source: directory or URL")
    parser.add_argument(
        "--public-key",
        action="append",
        default=[],
        metavar="KEY",
        help="minisign public key (RW...) or .pub file the index is signed with; repeatable",
    )
    parser.add_argument("--allow-unsigned", action="store_true", help="trust no signature")
    parser.add_argument("--sha256", help="the package's digest, as the policy pins it")
    parser.add_argument("--ca-bundle", help="https: the CA bundle (PEM file) to trust alone")


# The steps live in `breakglass`, imported when a `driver` command runs: building the parser
# of every other command must not load the driver-manager.


async def install_driver(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from gpuop.cli import breakglass

    return await breakglass.install(args, environ)


async def rollback_driver(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from gpuop.cli import breakglass

    return await breakglass.rollback(args, environ)


async def driver_status(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from gpuop.cli import breakglass

    return await breakglass.status(args, environ)
