"""`gpuop demo`: the embedded stack on one machine, shown as it is.

Starts a real nats-server, a simulated Kubernetes cluster (GPU nodes, kubelets, workloads
with PodDisruptionBudgets), a simulated host root per node (made from the recorded H200
host), and every installed service as its own process: node roles once per node, cluster
roles once. It then reports what each service says on /readyz and the labels discovery put
on the nodes. Services that are not built yet say so; the demo never fakes an upgrade.
Ctrl-C (or the end of the demo) stops every process it started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from gpuop.bus import NatsServer
from gpuop.kube import client as kubeclient
from gpuop.kube import nodes as kubenodes
from gpuop.runtime import services
from gpuop.runtime.settings import Role
from gpuop.sim.cluster import SimCluster
from gpuop.sim.hosts import build_host_root

LABELS_SHOWN = (
    "nvidia.com/gpu.count",
    "nvidia.com/gpu.product",
    "nvidia.com/cuda.driver-version.full",
    "feature.node.kubernetes.io/pci-10de.present",
)


def add_parser(verbs: Any) -> None:
    demo: argparse.ArgumentParser = verbs.add_parser(
        "demo",
        help="run the whole stack locally and show it",
        description="Start nats-server, a simulated cluster and every service locally, "
        "and show their state.",
    )
    demo.add_argument("--nodes", type=int, default=2, help="simulated nodes (default 2)")
    demo.add_argument("--gpus", type=int, default=8, help="simulated GPUs per node")
    demo.add_argument("--hold", action="store_true", help="keep running until Ctrl-C")
    demo.set_defaults(handler=run_demo)


@dataclass
class Process:
    service: str
    role: Role
    node: str | None
    port: int
    process: asyncio.subprocess.Process

    @property
    def label(self) -> str:
        return f"{self.service} ({self.node or self.role})"


async def run_demo(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    if not 1 <= args.gpus <= 64:
        raise ValueError(f"--gpus {args.gpus}: expected 1 to 64")
    if not 1 <= args.nodes <= 16:
        raise ValueError(f"--nodes {args.nodes}: expected 1 to 16")
    with tempfile.TemporaryDirectory(prefix="gpuop-demo-") as workdir:
        work = Path(workdir)
        async with (
            NatsServer(work / "nats") as server,
            SimCluster(nodes=args.nodes, gpus=args.gpus) as cluster,
        ):
            kubeconfig = cluster.write_kubeconfig(work / "kubeconfig")
            print(f"nats-server (JetStream) listening on {server.url}")
            print(f"simulated cluster: {args.nodes} nodes x {args.gpus} GPUs at {cluster.url}")
            processes: list[Process] = []
            try:
                processes = await _spawn_all(cluster, server.url, kubeconfig, args, work)
                await _show(processes)
                await _show_labels(kubeconfig, cluster.node_names)
                print()
                print("Tail events with:")
                print(f"  gpuop events tail --nats {server.url}")
                print(f"Inspect the cluster with:\n  kubectl --kubeconfig {kubeconfig} get nodes")
                _say_what_is_missing()
                if args.hold:
                    print("\nRunning; press Ctrl-C to stop.")
                    await asyncio.Event().wait()
            finally:
                await _stop_all(processes)
    return 0


async def _spawn_all(
    cluster: SimCluster, nats_url: str, kubeconfig: Path, args: argparse.Namespace, work: Path
) -> list[Process]:
    processes = []
    definitions = list(services.installed().values())
    for node in cluster.node_names:
        host_root = work / "hosts" / node
        build_host_root(host_root, node, args.gpus)
        extra = ["--node", node, "--nvml", f"sim:{args.gpus}", "--host-root", str(host_root)]
        for definition in definitions:
            if Role.NODE in definition.roles:
                processes.append(
                    await _spawn(definition.name, Role.NODE, node, nats_url, extra, work)
                )
    for definition in definitions:
        if Role.CLUSTER in definition.roles:
            extra = ["--kubeconfig", str(kubeconfig)]
            processes.append(
                await _spawn(definition.name, Role.CLUSTER, None, nats_url, extra, work)
            )
    return processes


async def _spawn(
    service: str, role: Role, node: str | None, nats_url: str, extra: list[str], work: Path
) -> Process:
    port = _free_port()
    command = [
        sys.executable, "-m", "gpuop.cli.main", "run", service,
        "--role", role, "--nats", nats_url,
        "--metrics-listen", f"127.0.0.1:{port}", "--log-format", "json", *extra,
    ]  # fmt: skip
    log = work / f"{service}-{node or role}.log"
    with log.open("wb") as sink:
        process = await asyncio.create_subprocess_exec(
            *command, stdout=sink, stderr=sink, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
    return Process(service, role, node, port, process)


async def _show_labels(kubeconfig: Path, node_names: list[str]) -> None:
    """Discovery's labels on each node, once they are there (or after a short wait)."""
    print(f"\n{'node':<14} " + " ".join(f"{key.rsplit('/', 1)[1]:<24}" for key in LABELS_SHOWN))
    async with await kubeclient.connect(kubeconfig) as kube:
        for node in node_names:
            labels: dict[str, str] = {}
            for _ in range(150):
                labels = kubenodes.labels_of(await kubenodes.get(kube, node))
                if LABELS_SHOWN[0] in labels:
                    break
                await asyncio.sleep(0.1)
            values = " ".join(f"{labels.get(key, '-'):<24}" for key in LABELS_SHOWN)
            print(f"{node:<14} {values}")


async def _show(processes: list[Process]) -> None:
    print(f"\n{'service':<36} {'pid':>7}  {'health':<8} ready")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        for proc in processes:
            health, ready = await _probe(session, proc)
            print(f"{proc.label:<36} {proc.process.pid:>7}  {health:<8} {ready}")


async def _probe(session: aiohttp.ClientSession, proc: Process) -> tuple[str, str]:
    base = f"http://127.0.0.1:{proc.port}"
    for _ in range(150):
        if proc.process.returncode is not None:
            return "exited", f"exit code {proc.process.returncode}"
        try:
            async with session.get(f"{base}/readyz") as response:
                body = json.loads(await response.text())
                if response.status == 200:
                    return "ok", "yes"
                if body.get("reason") != "starting":
                    return "ok", f"no: {body.get('reason')}"
        except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError):
            pass
        await asyncio.sleep(0.1)
    return "no answer", "unknown"


def _say_what_is_missing() -> None:
    pending = {d.name: d.pending_issue for d in services.installed().values() if d.main is None}
    if not pending:
        return
    print("\nNot built yet, so no driver upgrade runs in this demo:")
    for name, issue in pending.items():
        print(f"  - {name}: issue {issue}")
    print("  - the live rollout view, the Helm chart and `gpuop upgrade` (issue 9)")


async def _stop_all(processes: list[Process]) -> None:
    for proc in processes:
        if proc.process.returncode is None:
            proc.process.terminate()
    for proc in processes:
        try:
            await asyncio.wait_for(proc.process.wait(), 10)
        except TimeoutError:
            proc.process.kill()
            with contextlib.suppress(ProcessLookupError):
                await proc.process.wait()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
