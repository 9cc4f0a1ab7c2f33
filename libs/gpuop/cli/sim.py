"""`gpuop sim apiserver`: run a simulated GPU cluster in the foreground.

For development and for standard Kubernetes tools: the command writes a kubeconfig, prints
how to point kubectl at it, and serves until Ctrl-C or SIGTERM, then stops cleanly with
exit code 0. The cluster itself is :func:`gpuop.sim.cli.run_cluster`.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuop.sim import cli as simcli
from gpuop.sim.cluster import SimCluster


def add_parser(verbs: Any) -> None:
    sim: argparse.ArgumentParser = verbs.add_parser(
        "sim", help="simulated Kubernetes cluster for development and tests"
    )
    actions = sim.add_subparsers(dest="action", required=True, metavar="ACTION")
    apiserver = actions.add_parser(
        "apiserver",
        help="run a simulated cluster's API server in the foreground",
        description=(
            "Run a simulated Kubernetes cluster (API server, GPU nodes, kubelets and, by "
            "default, GPU workloads with PodDisruptionBudgets) until Ctrl-C or SIGTERM. "
            "Point kubectl or any client at the kubeconfig it writes."
        ),
    )
    apiserver.add_argument("--nodes", type=int, default=3, help="simulated nodes (default 3)")
    apiserver.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
    apiserver.add_argument(
        "--kubeconfig-out", type=Path, required=True, help="where to write the kubeconfig"
    )
    apiserver.add_argument(
        "--workloads",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="create GPU Deployments, Jobs, DaemonSets and PDBs (default: yes)",
    )
    apiserver.add_argument("--host", default="127.0.0.1", help="listen address")
    apiserver.add_argument("--port", type=int, default=0, help="listen port (default: any)")
    apiserver.add_argument("--seed", type=int, default=0, help="seed of ids and pod names")
    apiserver.add_argument(
        "--pod-start-delay", type=float, default=0.5, help="seconds before a pod runs"
    )
    apiserver.add_argument(
        "--termination-cap",
        type=float,
        default=2.0,
        help="most seconds a terminating pod lingers (its grace period if shorter)",
    )
    apiserver.add_argument(
        "--anonymous-auth",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="serve requests without a token, since kubectl sends none over plain HTTP "
        "(default: yes; the kubeconfig carries a token for clients that do send one)",
    )
    apiserver.add_argument(
        "--manifest",
        type=Path,
        action="append",
        default=[],
        help="YAML file of objects to seed (repeatable)",
    )
    apiserver.set_defaults(handler=serve)


def _announce(cluster: SimCluster, kubeconfig: Path, args: argparse.Namespace) -> None:
    print(f"simulated cluster: {args.nodes} nodes x {args.gpus} GPUs, API server at {cluster.url}")
    print(f"kubeconfig: {kubeconfig}")
    print(f"  kubectl --kubeconfig {kubeconfig} get nodes")
    print("Press Ctrl-C to stop.", flush=True)


async def serve(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    if args.nodes < 0 or args.gpus < 0:
        raise ValueError(f"--nodes {args.nodes} --gpus {args.gpus}: expected 0 or more")
    kubeconfig = args.kubeconfig_out.resolve()
    serving = asyncio.create_task(
        simcli.run_cluster(
            kubeconfig,
            nodes=args.nodes,
            gpus=args.gpus,
            workloads=args.workloads,
            host=args.host,
            port=args.port,
            seed=args.seed,
            start_delay=args.pod_start_delay,
            termination_cap=args.termination_cap,
            anonymous_auth=args.anonymous_auth,
            manifests=args.manifest,
            on_ready=lambda cluster: _announce(cluster, kubeconfig, args),
        )
    )
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, serving.cancel)
    try:
        await serving
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise  # cancelled from outside, not stopped by a signal
    except OSError as error:
        print(f"gpuop sim apiserver: {error}", file=sys.stderr)
        return 1
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    print("stopped", flush=True)
    return 0
