"""The flags of the commands that read this node without a service (`gpuop discover`,
`gpuop cdi generate`, `gpuop runtime configure`) and what they resolve to: `--host-root`
(`GPUOP_HOST_ROOT`, `/host`), `--nvml` (`GPUOP_NVML`, `real`) and `--node` (`GPUOP_NODE`,
the host name), as the node's services read the same settings.
"""

from __future__ import annotations

import argparse
import socket
from collections.abc import Mapping
from pathlib import Path

from gpuop.nvml import Nvml, open_backend
from gpuop.runtime.settings import SettingsError


def add_host_root(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host-root", help="host root filesystem (GPUOP_HOST_ROOT, /host)")


def add_nvml(parser: argparse.ArgumentParser) -> None:
    """`--nvml` and the `--node` that names simulated GPUs."""
    parser.add_argument("--nvml", help="real, sim:<gpus> or recorded:<file> (GPUOP_NVML)")
    parser.add_argument("--node", help="node name; names simulated GPUs (GPUOP_NODE)")


DEFAULT_HOST_ROOT = Path("/host")
"""Where the chart mounts the host's root in a node agent's container."""


def host_root(args: argparse.Namespace, environ: Mapping[str, str]) -> Path:
    """The host root `--host-root` names; `SettingsError` when it is no directory."""
    root = Path(args.host_root or environ.get("GPUOP_HOST_ROOT") or DEFAULT_HOST_ROOT)
    if not root.is_dir():
        raise SettingsError(f"--host-root {root}: no such directory")
    return root


def open_nvml(
    args: argparse.Namespace, environ: Mapping[str, str], root: Path, holder_id: str
) -> Nvml:
    """The NVML backend `--nvml` names, for the node `--node` names, under `root`."""
    spec = args.nvml or environ.get("GPUOP_NVML") or "real"
    node = args.node or environ.get("GPUOP_NODE") or socket.gethostname()
    return open_backend(spec, host_root=root, node=node, holder_id=holder_id)
