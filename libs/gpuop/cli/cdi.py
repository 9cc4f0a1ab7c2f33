"""`gpuop cdi generate`: the CDI spec for the NVIDIA driver gpuop installed in a host root, as
`nvidia-ctk cdi generate` prints one; the admin's way to look at, or write by hand, what the
driver-manager writes after every load.

The same code as the driver-manager's (`gpuop.inventory.cdi_devices`, `gpuop.host.cdi`): the
files from the manifest of the user space in use, the GPUs from NVML (`--nvml`, as for
`gpuop discover`). The spec goes to stdout, or with `--out` to a file, replaced atomically
with the one it replaces kept beside it as `<file>.previous`. A host root without a driver
installed by gpuop, a broken manifest and NVML failing exit 1 naming what is wrong.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuop.cli import nodes
from gpuop.cli.verbs import add_command
from gpuop.host import cdi
from gpuop.host.errors import HostError
from gpuop.host.roots import HostRoot
from gpuop.inventory import cdi_devices
from gpuop.nvml import NvmlError


def add_parser(verbs: Any) -> None:
    actions = add_command(
        verbs,
        "cdi",
        help="the CDI spec of the installed NVIDIA driver",
        description="Container Device Interface specs for the driver gpuop installed.",
    )
    generate: argparse.ArgumentParser = actions.add_parser(
        "generate",
        help="print (or write) the spec for a host root",
        description=(
            f"The {cdi.KIND} spec for the driver in use under the host root: its libraries, "
            "binaries and firmware as read-only mounts, the GPUs by index, UUID and all."
        ),
    )
    nodes.add_host_root(generate)
    generate.add_argument("--out", type=Path, help="write the spec to FILE instead of stdout")
    nodes.add_nvml(generate)
    generate.set_defaults(handler=generate_spec)


async def generate_spec(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    return await asyncio.to_thread(generate_once, args, environ)


def generate_once(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    host_root = nodes.host_root(args, environ)
    nvml = nodes.open_nvml(args, environ, host_root, "gpuop-cdi")
    try:
        data = cdi_devices.generate(HostRoot(host_root), nvml)
    except cdi.CdiError as error:
        print(f"gpuop cdi generate: {error}", file=sys.stderr)
        return 1
    except (HostError, NvmlError) as error:
        print(f"gpuop cdi generate: NVML cannot name the GPUs: {error}", file=sys.stderr)
        return 1
    if args.out is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return 0
    try:
        cdi.write(args.out, data)
    except OSError as error:
        print(f"gpuop cdi generate: cannot write {args.out}: {error}", file=sys.stderr)
        return 1
    print(f"gpuop cdi generate: {args.out}", file=sys.stderr)
    return 0
