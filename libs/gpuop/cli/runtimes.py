"""`gpuop runtime configure`: the container runtime's `nvidia` handler with CDI, by hand.

The same plan the driver-manager's runtime-configure step applies while the saga holds the
node cordoned (`gpuop.host.runtimes`), for an admin at a node: `--dry-run` prints the drop-in and
what would change, and writes nothing; without it the files are written atomically, and
`--restart` also restarts the runtime through the host's systemd and waits for it to answer,
putting the earlier files back if it does not. Like `nvidia-ctk runtime configure`, it does
not restart by default: a restart under running pods is the admin's call.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import sys
from collections.abc import Mapping
from typing import Any

from gpuop.cli import nodes
from gpuop.cli.errors import CommandFailed
from gpuop.cli.verbs import add_command
from gpuop.clocks import SystemClock
from gpuop.host import restarting, runtimes
from gpuop.host.errors import HostError
from gpuop.host.roots import HostRoot


def add_parser(verbs: Any) -> None:
    actions = add_command(
        verbs,
        "runtime",
        help="configure the container runtime's nvidia handler with CDI",
        description="Configure containerd or CRI-O on a node for NVIDIA GPUs with CDI.",
    )
    configure: argparse.ArgumentParser = actions.add_parser(
        "configure",
        help="write (or print) the drop-in adding the nvidia runtime handler",
        description="Write the drop-in adding the `nvidia` runtime handler with CDI enabled: "
        "containerd's conf.d/99-nvidia.toml (imported from the main config) or CRI-O's "
        "crio.conf.d/99-nvidia.conf.",
    )
    nodes.add_host_root(configure)
    configure.add_argument("--runtime", required=True, choices=[r.value for r in runtimes.Runtime])
    configure.add_argument(
        "--runtime-path",
        help="absolute path of the handler's OCI runtime binary "
        "(default: the runtime's default one, which injects CDI devices itself)",
    )
    configure.add_argument("--dry-run", action="store_true", help="print, write nothing")
    configure.add_argument(
        "--restart",
        action="store_true",
        help="restart the runtime after writing and undo if it does not answer again",
    )
    configure.add_argument(
        "--timeout", type=float, default=60.0, help="seconds the restarted runtime may take"
    )
    configure.set_defaults(handler=configure_runtime)


async def configure_runtime(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    # file reads and the runtime binary's --version: off the loop
    root, planned = await asyncio.to_thread(plan_for, args, environ)
    for note in planned.notes:
        print(f"note: {note}", file=sys.stderr)
    if args.dry_run:
        sys.stdout.write(render(planned))
        return 0
    if not planned.changed:
        print(f"{root.join(planned.drop_in)}: already configured, nothing to change")
        return 0
    if not args.restart:
        runtimes.apply(root, planned)
        for change in planned.changes:
            print(f"wrote {root.join(change.relative)}")
        print(f"restart {args.runtime} for the nvidia handler to take effect")
        return 0
    service = restarting.SystemdRuntimeService(root)
    try:
        applied = await restarting.configure(root, planned, service, SystemClock(), args.timeout)
    except restarting.RuntimeRestartFailed as failure:
        raise CommandFailed(failure.reason) from None
    print(
        f"{args.runtime} restarted with the nvidia handler, answering after "
        f"{applied.waited_seconds:.1f} s"
    )
    return 0


def plan_for(
    args: argparse.Namespace, environ: Mapping[str, str]
) -> tuple[HostRoot, runtimes.RuntimePlan]:
    """The host root the arguments name and the plan for its runtime."""
    root = HostRoot(nodes.host_root(args, environ))
    try:
        planned = runtimes.plan(
            root, runtimes.Runtime(args.runtime), runtime_path=args.runtime_path
        )
    except HostError as error:
        raise CommandFailed(str(error)) from None
    return root, planned


def render(planned: runtimes.RuntimePlan) -> str:
    """The drop-in, then a diff of every other file the plan changes."""
    lines = [f"# {planned.drop_in}", planned.drop_in_text.rstrip("\n")]
    if not planned.changed:
        lines.append("# already configured: nothing would change")
    for change in planned.changes:
        if change.relative == planned.drop_in:
            continue
        lines.extend(
            line.rstrip("\n")
            for line in difflib.unified_diff(
                (change.before or "").splitlines(keepends=True),
                change.after.splitlines(keepends=True),
                fromfile=f"a/{change.relative}",
                tofile=f"b/{change.relative}",
            )
        )
    return "\n".join(lines) + "\n"
