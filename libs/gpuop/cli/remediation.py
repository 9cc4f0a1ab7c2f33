"""`gpuop remediation release NODE`: say that a node held for new hardware was repaired.

A remediation whose fault asks for `drain-and-replace` hands the node over instead of
releasing it: cordoned, its GPU pods gone, the label `gpuop.io/hardware-replacement=required`.
This verb sets that label to `done`, as an external repair flow may do itself; the upgrade
orchestrator then releases the node only when discovery's inventory shows another GPU at each
faulty GPU's PCI address, and otherwise refuses (a warning Event on the node says why, and the
label goes back to `required`). Exit codes are `gpuop.cli.errors`': 0 asked, 1 the node is not
held for replacement or cannot be read, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from gpuop.cli.errors import CommandFailed
from gpuop.cli.upgrade import connected
from gpuop.cli.verbs import add_command
from gpuop.kube import errors as kubeerrors
from gpuop.kube import nodes
from gpuop.saga.remediation.actions import (
    REPLACEMENT_DONE,
    REPLACEMENT_LABEL,
    REPLACEMENT_REQUIRED,
)

RELEASE_HELP = f"""\
Say that the hardware of a node held for replacement was changed: sets its label
{REPLACEMENT_LABEL} from {REPLACEMENT_REQUIRED} to {REPLACEMENT_DONE}. The upgrade
orchestrator releases the node (uncordon, validation, release) once discovery shows another
GPU at each faulty GPU's PCI address; otherwise it refuses, with a warning Event on the node
that says why, and sets the label back to {REPLACEMENT_REQUIRED}. Fails (exit 1) when the node
is not held for replacement."""


def add_parser(verbs: Any) -> None:
    about = "Operate GPU remediations that wait for an administrator."
    actions = add_command(verbs, "remediation", help=about, description=about)
    release = actions.add_parser(
        "release", help="the node's hardware was replaced", description=RELEASE_HELP
    )
    release.add_argument("node", help="the node's name")
    release.add_argument("--kubeconfig", help="kubeconfig file (GPUOP_KUBECONFIG, KUBECONFIG)")
    release.add_argument("--context", help="kubeconfig context (default: its current one)")
    release.add_argument("--json", action="store_true", help="print one JSON object")
    release.set_defaults(handler=release_node)


async def release_node(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    async with connected(args, environ) as kube:
        try:
            node = await nodes.get(kube, args.node)
        except kubeerrors.NotFound:
            raise CommandFailed(f"node {args.node} not found") from None
        held = nodes.labels_of(node).get(REPLACEMENT_LABEL)
        if held != REPLACEMENT_REQUIRED:
            now = f"{REPLACEMENT_LABEL}={held}" if held else f"no {REPLACEMENT_LABEL} label"
            raise CommandFailed(f"node {args.node} is not held for hardware replacement ({now})")
        await nodes.set_labels(kube, args.node, {REPLACEMENT_LABEL: REPLACEMENT_DONE})
    message = (
        f"{args.node}: release asked; the orchestrator releases it once discovery shows the "
        "new GPUs, else refuses with an Event on the node"
    )
    document = {"node": args.node, "label": REPLACEMENT_LABEL, "value": REPLACEMENT_DONE}
    print(json.dumps(document) if args.json else message, flush=True)
    return 0
