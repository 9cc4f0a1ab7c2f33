"""`gpuop sim apiserver`: run a simulated GPU cluster in the foreground.

For development and for standard Kubernetes tools: the command writes a kubeconfig, prints
how to point kubectl at it, and serves until Ctrl-C or SIGTERM, then stops cleanly with
exit code 0. The cluster itself is :func:`gpuop.sim.cli.run_cluster`. The fault flags
(`--error-rate`, `--throttle-rate`, `--retry-after`, `--watch-drop-seconds`) make the API
server fail on purpose (`gpuop.sim.faults`), to watch clients degrade and recover.
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
from gpuop.sim.faults import FaultPlan


def _share(text: str) -> float:
    """An argparse type: a share of requests, 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a share between 0 and 1, got {text!r}")
    return value


def _seconds(text: str) -> float:
    """An argparse type: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


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
    apiserver.add_argument("--seed", type=int, default=0, help="seed of ids, pod names and faults")
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
    faults = apiserver.add_argument_group(
        "faults", "make the API server fail on purpose (default: it never does)"
    )
    faults.add_argument(
        "--error-rate",
        type=_share,
        default=0.0,
        help="share of API requests answered 500 InternalError before they run (0 to 1)",
    )
    faults.add_argument(
        "--throttle-rate",
        type=_share,
        default=0.0,
        help="share of API requests answered 429 TooManyRequests before they run (0 to 1)",
    )
    faults.add_argument(
        "--retry-after",
        type=_seconds,
        default=1.0,
        help="seconds a throttled client is asked to wait (default 1)",
    )
    faults.add_argument(
        "--watch-drop-seconds",
        type=_seconds,
        default=None,
        help="end every watch after a random time of this mean, in seconds (default: never)",
    )
    apiserver.set_defaults(handler=serve)


def fault_plan(args: argparse.Namespace) -> FaultPlan:
    """The fault plan the flags ask for; ValueError names the flags of a bad combination."""
    if args.error_rate + args.throttle_rate > 1.0:
        raise ValueError(
            f"--error-rate {args.error_rate:g} --throttle-rate {args.throttle_rate:g}: "
            "together they exceed 1"
        )
    return FaultPlan(
        error_rate=args.error_rate,
        throttle_rate=args.throttle_rate,
        retry_after=args.retry_after,
        watch_drop_seconds=args.watch_drop_seconds,
        seed=args.seed,
    )


def describe(plan: FaultPlan) -> str:
    """One line for the person at the terminal: what the server gets wrong on purpose."""
    parts = []
    if plan.error_rate:
        parts.append(f"{plan.error_rate:.0%} of requests answer 500")
    if plan.throttle_rate:
        parts.append(f"{plan.throttle_rate:.0%} answer 429 (Retry-After {plan.retry_after:g}s)")
    if plan.watch_drop_seconds is not None:
        parts.append(f"watches end after {plan.watch_drop_seconds:g}s on average")
    return "faults: " + (", ".join(parts) if parts else "none")


def _announce(cluster: SimCluster, kubeconfig: Path, args: argparse.Namespace) -> None:
    print(f"simulated cluster: {args.nodes} nodes x {args.gpus} GPUs, API server at {cluster.url}")
    if cluster.faults.active:
        print(describe(cluster.faults))
    print(f"kubeconfig: {kubeconfig}")
    print(f"  kubectl --kubeconfig {kubeconfig} get nodes")
    print("Press Ctrl-C to stop.", flush=True)


async def serve(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    if args.nodes < 0 or args.gpus < 0:
        raise ValueError(f"--nodes {args.nodes} --gpus {args.gpus}: expected 0 or more")
    faults = fault_plan(args)
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
            faults=faults,
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
