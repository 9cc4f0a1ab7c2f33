"""`make cluster`: the real control plane with one real node and gpuop's chart on it, in the
foreground for a person, until Ctrl-C (SIGINT or SIGTERM), which stops everything it started.

It starts the control plane (`tests.support.control_plane`: KWOK managing only its own
nodes, the apiserver advertised at the real node's address), the real node
(`tests.support.real_node`: a simulated GPU node's host root with `--gpus` GPUs), and
`--nodes` KWOK GPU nodes beside it (nodes alone: `gpuop demo --kubeconfig` brings its own
nodes and workloads). It builds the images (`make image`, cached; gpuop's with the
simulation added), imports them into the node, installs the chart with the real Helm
(`tests.support.node_chart`), waits until every gpuop pod is Ready, and prints the pods, the
kubeconfig, the image's name and how to stop it.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

from tests.support import node_chart, real_node
from tests.support.control_plane import ControlPlane, ControlPlaneError
from tests.support.fleet import create_nodes
from tests.support.real_node import RealNode


def _interrupt(number: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make cluster", description=__doc__)
    parser.add_argument("--nodes", type=int, default=3, help="KWOK GPU nodes (NODES)")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node (GPUS)")
    parser.add_argument("--work", type=Path, default=None, help="its directory (a new one)")
    arguments = parser.parse_args(argv)
    absent = real_node.missing()
    if absent:
        print(f"make cluster: the real node needs: {', '.join(absent)}", file=sys.stderr)
        return 1
    work = arguments.work or Path(tempfile.mkdtemp(prefix="gpuop-cluster-"))
    # Ctrl-C and SIGTERM stop it, even where it was started with SIGINT ignored (a
    # background job of a non-interactive shell)
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, _interrupt)
    started = time.monotonic()
    try:
        with (
            ControlPlane(
                work / "control-plane", kwok_fake_only=True, advertise=real_node.NODE_IP
            ) as plane,
            RealNode(plane, work / "real-node", gpus=arguments.gpus) as node,
        ):
            kwok = create_nodes(plane, arguments.nodes, arguments.gpus, workloads=False)
            print(
                f"control plane up at {plane.url}: the real node {node.name} "
                f"({arguments.gpus} simulated GPUs) and {len(kwok)} KWOK GPU nodes",
                flush=True,
            )
            print("building the images (make image) and installing the chart ...", flush=True)
            gpuop, nats = node_chart.install(plane, node)
            node_chart.wait_ready(plane)
            print(node_chart.table(plane), flush=True)
            seconds = time.monotonic() - started
            print(
                f"helm release {node_chart.RELEASE} installed in {node_chart.NAMESPACE}, every pod "
                f"Ready ({seconds:.0f} s)\n"
                f"image: {gpuop.name} ({gpuop.digest}: gpuop's image with the simulation), "
                f"NATS: {nats.name}\n"
                f"export KUBECONFIG={plane.admin_kubeconfig}\n"
                "then: kubectl get pods -A; "
                f"gpuop demo --kubeconfig {plane.admin_kubeconfig}\n"
                f"logs in {work}; Ctrl-C stops it",
                flush=True,
            )
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        print("stopped", flush=True)
        return 0
    except ControlPlaneError as error:
        print(f"make cluster: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
