"""`gpuop demo`: the embedded stack on one machine, rolling a real driver upgrade.

Starts a real nats-server, a simulated Kubernetes cluster (GPU nodes, kubelets, workloads
with PodDisruptionBudgets), a simulated host root per node (made from the recorded H200
host) and every built service as its own process (node roles once per node, cluster roles
once). Once discovery has labelled the nodes, it installs the GPUClusterPolicy CRD, builds a
driver source with a newer driver, and creates a policy asking for it: the orchestrator
rolls the upgrade across the nodes, and the demo prints each transition from the public
upgrade events, then one JSON line (nodes, done, failed, seconds). Exit 0 only when every
node is done. Ctrl-C (or the end) stops every process it started.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Mapping
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from kubernetes.aio import client as k8s

from gpuop.bus import NatsBus, NatsServer
from gpuop.cli import events, rollout_view
from gpuop.cli.processes import Process, say_what_is_missing, show, spawn, stop_all
from gpuop.host import packaging, seeding, system
from gpuop.kube import client as kubeclient
from gpuop.kube import errors as kubeerrors
from gpuop.kube import nodes as kubenodes
from gpuop.policy import crd, specs
from gpuop.runtime import services
from gpuop.runtime.settings import Role
from gpuop.sim.cluster import SimCluster
from gpuop.sim.hosts import build_host_root

NEW_VERSION = "580.200.01"
DRIVER_LABEL = "nvidia.com/cuda.driver-version.full"
LABELS_SHOWN = ("nvidia.com/gpu.count", "nvidia.com/gpu.product", DRIVER_LABEL)
DISCOVERY_CONFIG = "scan_interval_seconds: 2\nheartbeat_interval_seconds: 2\n"
DRIVER_MANAGER_CONFIG = "kernel: auto\nunload_poll_seconds: 0.2\n"
ORCHESTRATOR_CONFIG = "resync_seconds: 0.5\n"


def add_parser(verbs: Any) -> None:
    demo: argparse.ArgumentParser = verbs.add_parser(
        "demo",
        help="run the whole stack locally and roll a driver upgrade",
        description="Start nats-server, a simulated GPU cluster and every service locally, "
        "then roll a driver upgrade across the nodes and report how it went.",
    )
    demo.add_argument("--nodes", type=int, default=4, help="simulated nodes (default 4)")
    demo.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
    demo.add_argument("--max-parallel", type=int, default=2, help="maxParallelUpgrades")
    demo.add_argument("--headless", action="store_true", help="plain progress lines only")
    demo.add_argument("--timeout", type=float, default=300, help="seconds for the rollout")
    demo.add_argument("--record", type=Path, help="write the event log here at the end")
    demo.add_argument("--hold", action="store_true", help="keep running until Ctrl-C")
    demo.set_defaults(handler=run_demo)


async def run_demo(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    _check(args)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpuop-demo-") as workdir:
        work = Path(workdir)
        async with AsyncExitStack() as stack:
            server = await stack.enter_async_context(NatsServer(work / "nats"))
            cluster = await stack.enter_async_context(SimCluster(nodes=args.nodes, gpus=args.gpus))
            kubeconfig = cluster.write_kubeconfig(work / "kubeconfig")
            print(f"nats-server (JetStream) listening on {server.url}")
            print(f"simulated cluster: {args.nodes} nodes x {args.gpus} GPUs at {cluster.url}")
            processes: list[Process] = []
            stack.push_async_callback(stop_all, processes)
            source = await _spawn_all(processes, cluster, server.url, kubeconfig, args, work)
            if not args.headless:
                await show(processes)
            kube = await stack.enter_async_context(await kubeclient.connect(kubeconfig))
            await _wait_for_labels(kube, cluster.node_names, args.headless)
            bus = NatsBus(server.url, name="gpuop-demo")
            await bus.start()
            stack.push_async_callback(bus.close)
            await _start_rollout(kube, source, args)
            print(f"rolling GPU driver {seeding.RECORDED_DRIVER_VERSION} -> {NEW_VERSION}")
            try:
                outcome = await asyncio.wait_for(
                    rollout_view.follow(bus, cluster.node_names, started), args.timeout
                )
            except TimeoutError:
                print(f"the rollout did not finish within {args.timeout:g} s", file=sys.stderr)
                outcome = rollout_view.RolloutOutcome(cluster.node_names)
                outcome.seconds = time.monotonic() - started
            if args.record is not None:
                lines = await events.export_lines(bus)
                args.record.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
                print(f"recorded {len(lines)} messages to {args.record}; check with:")
                print(f"  gpuop replay {args.record}")
            if not args.headless:
                print(f"\nTail events with:\n  gpuop events tail --nats {server.url}")
                print(f"Inspect the cluster with:\n  kubectl --kubeconfig {kubeconfig} get nodes")
                say_what_is_missing()
            if args.hold:
                print("\nRunning; press Ctrl-C to stop.", flush=True)
                await asyncio.Event().wait()
    print(outcome.summary(), flush=True)
    return 0 if outcome.done == len(outcome.nodes) else 1


def _check(args: argparse.Namespace) -> None:
    if not 1 <= args.gpus <= 64:
        raise ValueError(f"--gpus {args.gpus}: expected 1 to 64")
    if not 1 <= args.nodes <= 16:
        raise ValueError(f"--nodes {args.nodes}: expected 1 to 16")
    if args.max_parallel < 0:
        raise ValueError(f"--max-parallel {args.max_parallel}: expected 0 (no limit) or more")


async def _spawn_all(
    processes: list[Process],
    cluster: SimCluster,
    nats_url: str,
    kubeconfig: Path,
    args: argparse.Namespace,
    work: Path,
) -> Path:
    """Host roots, the driver source and every built service; returns the source."""
    (work / "discovery.yaml").write_text(DISCOVERY_CONFIG)
    (work / "driver-manager.yaml").write_text(DRIVER_MANAGER_CONFIG)
    (work / "orchestrator.yaml").write_text(ORCHESTRATOR_CONFIG)
    configs = {
        "discovery": work / "discovery.yaml",
        "driver-manager": work / "driver-manager.yaml",
        "upgrade-orchestrator": work / "orchestrator.yaml",
    }
    built = [d for d in services.installed().values() if d.main is not None]
    source = work / "driver-source"
    for node in cluster.node_names:
        machine = cluster.machine(node)
        root = build_host_root(
            work / "hosts" / node,
            node,
            args.gpus,
            boot_id=machine.boot_id,
            product_name=machine.type.name,
        )
        if not source.exists():
            kernel = system.kernel_release(root) or ""
            packaging.build_driver_source(
                source,
                [("gpu", seeding.RECORDED_DRIVER_VERSION, kernel), ("gpu", NEW_VERSION, kernel)],
            )
        on_node = ["--node", node, "--nvml", f"sim:{args.gpus}", "--host-root", str(root.path)]
        for definition in built:
            if Role.NODE in definition.roles:
                extra = [*on_node, *_config(configs, definition.name)]
                processes.append(
                    await spawn(definition.name, Role.NODE, node, nats_url, extra, work)
                )
    for definition in built:
        if Role.CLUSTER in definition.roles:
            extra = ["--kubeconfig", str(kubeconfig), *_config(configs, definition.name)]
            processes.append(
                await spawn(definition.name, Role.CLUSTER, None, nats_url, extra, work)
            )
    return source


def _config(configs: dict[str, Path], service: str) -> list[str]:
    return ["--config", str(configs[service])] if service in configs else []


async def _wait_for_labels(kube: kubeclient.Kube, node_names: list[str], quiet: bool) -> None:
    """Wait until discovery has labelled every node, then show the labels."""
    if not quiet:
        print(f"\n{'node':<14} " + " ".join(f"{k.rsplit('/', 1)[1]:<26}" for k in LABELS_SHOWN))
    for node in node_names:
        labels: dict[str, str] = {}
        for _ in range(300):
            labels = kubenodes.labels_of(await kubenodes.get(kube, node))
            if DRIVER_LABEL in labels:
                break
            await asyncio.sleep(0.1)
        if not quiet:
            values = " ".join(f"{labels.get(key, '-'):<26}" for key in LABELS_SHOWN)
            print(f"{node:<14} {values}")
    print(flush=True)


async def _start_rollout(kube: kubeclient.Kube, source: Path, args: argparse.Namespace) -> None:
    """Install the CRD and create a GPUClusterPolicy asking for the new driver."""
    extensions = k8s.ApiextensionsV1Api(kube.api_client)
    await kube.call(extensions.create_custom_resource_definition, crd.build())
    policy = {
        "apiVersion": specs.API_VERSION,
        "kind": specs.KIND,
        "metadata": {"name": "default"},
        "spec": {
            "driver": {"gpu": {"version": NEW_VERSION, "source": str(source)}},
            "upgradePolicy": {
                "maxParallelUpgrades": args.max_parallel,
                "maxUnavailable": "50%",
                "podDeletion": {"force": True, "deleteEmptyDir": True, "timeoutSeconds": 60},
                "drain": {"enable": True, "force": True, "deleteEmptyDir": True},
            },
        },
    }
    for _ in range(50):  # the API server serves a new CRD a moment after creating it
        try:
            await kube.call(
                kube.custom_objects.create_cluster_custom_object,
                specs.GROUP,
                specs.VERSION,
                specs.PLURAL,
                policy,
            )
            return
        except kubeerrors.NotFound:
            await asyncio.sleep(0.1)
    raise RuntimeError("the GPUClusterPolicy CRD was never served")
