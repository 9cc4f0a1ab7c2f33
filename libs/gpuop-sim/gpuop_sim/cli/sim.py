"""`gpuop sim apiserver`: run a simulated GPU cluster in the foreground; `gpuop sim host`:
make one simulated node's host root, to run a node agent on by hand.

For development and for standard Kubernetes tools: the command writes a kubeconfig, prints
how to point kubectl at it, and serves until Ctrl-C or SIGTERM, then stops cleanly with
exit code 0. The cluster itself is :func:`gpuop_sim.cluster.cli.run_cluster`. The fault flags
(`--error-rate`, `--throttle-rate`, `--retry-after`, `--watch-drop-seconds`) make the API
server fail on purpose (`gpuop_sim.apiserver.faults`), to watch clients degrade and recover.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuop.cli.verbs import add_command
from gpuop.events import subjects
from gpuop.host import system
from gpuop.host.roots import HostRoot
from gpuop_sim.apiserver.faults import FaultPlan
from gpuop_sim.cluster import cli as simcli
from gpuop_sim.cluster import hosts
from gpuop_sim.cluster.cluster import SimCluster
from gpuop_sim.host import seeding

_VERSION = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+_~-]{0,63}$")
"""A driver version or kernel release, as the policy spells one."""


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
    actions = add_command(
        verbs, "sim", help="simulated Kubernetes cluster for development and tests"
    )
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
        help="also serve requests without a token, as system:anonymous allowed everything "
        "(default: yes; kubectl and clients given the kubeconfig send its token)",
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
    host = actions.add_parser(
        "host",
        help="make a simulated GPU node's host root from the recorded H200",
        description=(
            "Write the host root of one simulated GPU node into DIR (new or empty), made from "
            "the recorded H200 node, its GPU driver loaded, so a node agent can run on it by "
            "hand: gpuop run <service> --host-root DIR --nvml sim:<gpus> ..."
        ),
    )
    host.add_argument("directory", type=Path, metavar="DIR", help="where to write the host root")
    host.add_argument("--node", required=True, help="the node's Kubernetes name")
    host.add_argument("--gpus", type=int, default=8, help="H200 GPUs, 1 to 64 (default 8)")
    host.add_argument("--kernel", help="the running kernel's release (default: the recording's)")
    host.add_argument(
        "--driver",
        default=seeding.RECORDED_DRIVER_VERSION,
        help="GPU driver installed and loaded, or 'none' (default: the recording's, "
        f"{seeding.RECORDED_DRIVER_VERSION})",
    )
    host.add_argument("--ofed", help="OFED driver installed and loaded (default: none)")
    host.set_defaults(handler=make_host)


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


async def make_host(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """`gpuop sim host`: write the host root, then say how to run an agent on it."""
    node = subjects.validate_node_name(args.node)
    driver = None if args.driver == "none" else args.driver
    for flag, value in (("--driver", driver), ("--ofed", args.ofed), ("--kernel", args.kernel)):
        if value is not None and not _VERSION.match(value):
            raise ValueError(f"{flag} {value!r}: expected letters, digits and '. + _ ~ -'")
    directory = args.directory.resolve()
    await asyncio.to_thread(_build_host, directory, node, driver, args)
    loaded = f"driver {driver} loaded" if driver else "no GPU driver"
    ofed = f", OFED {args.ofed} loaded" if args.ofed else ""
    kernel = system.kernel_release(HostRoot(directory))
    print(f"host root of {node}: {args.gpus} x NVIDIA H200, {loaded}{ofed}, kernel {kernel}, "
          f"at {directory}")  # fmt: skip
    print("run a node agent on it, for example:")
    print(f"  gpuop run discovery --node {node} --host-root {directory} --nvml sim:{args.gpus} "
          "--nats nats://127.0.0.1:4222")  # fmt: skip
    return 0


def _build_host(directory: Path, node: str, driver: str | None, args: argparse.Namespace) -> None:
    """Write the host root into `directory` (new or empty); on failure, leave it as it was."""
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise ValueError(f"{directory}: exists and is not an empty directory")
    existed = directory.exists()
    try:
        hosts.build_host_root(
            directory,
            node,
            args.gpus,
            gpu_version=driver,
            ofed_version=args.ofed,
            kernel_release=args.kernel,
        )
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        if existed:
            directory.mkdir()
        raise
