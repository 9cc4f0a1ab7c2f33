"""`gpuop demo`: the embedded stack on one machine, rolling a real driver upgrade.

Starts a real nats-server, a simulated Kubernetes cluster (by default 8 GPU nodes of 8 GPUs,
with kubelets and GPU workloads under PodDisruptionBudgets), a simulated host root per node
(made from the recorded H200 host) with the kubelet's gRPC side on it (device plugin
registration, PodResources), and every built service as its own process (node roles once per
node, cluster roles once). The GPUClusterPolicy CRD is installed first, as Helm installs a
chart's CRDs before its workloads. The processes start in two waves, as a cluster comes up:
what labelling the nodes and admitting the first ones needs (the orchestrator, discovery's
labeler, each node's discovery), then, once every node is labelled, the rest (the other node
agents and cluster roles): 44 Python processes starting at once on two cores would all be
slow together. Then it creates a policy asking for a newer driver (from a driver source it
built): the orchestrator rolls the upgrade across the nodes. That is the default scenario,
`--scenario upgrade`; `remediation` (a fatal XID on two nodes, quarantine to recovery) and
`mig` (two nodes relabelled to a mixed MIG layout) keep the running driver and act on two
nodes instead (`gpuop_sim.cli.scenarios`), with the same view and their own summary.

On a terminal the rollout is shown live (`gpuop_sim.cli.screens`): the nodes' states, a progress
bar, the latest events, and where the metrics are and how to tail the events. Otherwise, or
with `--headless`, it prints one line per node transition. Either way it ends with one JSON
line (nodes, done, failed, seconds) and exits 0 only when every node is done; `--record FILE`
exports the event log first, for `gpuop replay`. Ctrl-C, SIGTERM, SIGHUP (or the end) stop
every process it started (`processes.watching`: a signal ends the wait in progress, then the
cleanup runs as after the end), each with its process group (`gpuop_sim.cli.processes`); those
processes end too if the demo is killed outright.

`--kubeconfig FILE` runs the same demo on an existing cluster instead of the simulated one:
its nodes are KWOK nodes the demo registers (`gpuop_sim.cluster.kwok`; the cluster needs KWOK
and a controller manager, as kind with KWOK or `make cluster` has), its workloads run under
the real scheduler, drains go through the real eviction API. Its own NATS, host roots and
node agents run here as before. It refuses a cluster that already has a GPUClusterPolicy,
and deletes its nodes, workload namespaces and policy when it ends. Where gpuop is installed
already (`make cluster` installs the chart), it pauses the installed cluster roles and has its
orchestrator skip the nodes already there, until it ends (`gpuop_sim.cluster.installed`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Mapping
from contextlib import AsyncExitStack, suppress
from pathlib import Path
from typing import Any

from kubernetes.aio import client as k8s

from gpuop.bus import NatsBus, NatsServer
from gpuop.cli import events
from gpuop.cli.errors import CommandFailed
from gpuop.events.device import OperandService
from gpuop.host import packaging, system
from gpuop.kube import client as kubeclient
from gpuop.kube import errors as kubeerrors
from gpuop.kube import nodes as kubenodes
from gpuop.policy import crd, specs
from gpuop.runtime import services
from gpuop.runtime.settings import Role
from gpuop_sim.cli import rollout_view, scenarios, screens
from gpuop_sim.cli.processes import Process, Stop, Stopped, show, spawn, stop_all, watching
from gpuop_sim.cluster import installed
from gpuop_sim.cluster.cluster import SimCluster
from gpuop_sim.cluster.hosts import build_host_root
from gpuop_sim.cluster.kubelet_grpc import KubeletGrpc
from gpuop_sim.cluster.kwok import FleetError, KwokFleet
from gpuop_sim.host import keys, seeding

UPGRADE = "upgrade"
NEW_VERSION = "580.200.01"
DRIVER_LABEL = "nvidia.com/cuda.driver-version.full"
LABELS_SHOWN = ("nvidia.com/gpu.count", "nvidia.com/gpu.product", DRIVER_LABEL)
DISCOVERY_CONFIG = "scan_interval_seconds: 2\nheartbeat_interval_seconds: 2\n"
DRIVER_MANAGER_CONFIG = f"kernel: auto\nunload_poll_seconds: 0.2\ntrust: {json.dumps(keys.TRUST)}\n"
ORCHESTRATOR_CONFIG = "resync_seconds: 0.5\noperands: [{operands}]\n"
"""The orchestrator waits for a pause confirmation from every operand the demo runs."""


def add_parser(verbs: Any) -> None:
    demo: argparse.ArgumentParser = verbs.add_parser(
        "demo",
        help="run the whole stack locally and roll a driver upgrade",
        description="Start nats-server, a simulated GPU cluster and every service locally, "
        "then roll a driver upgrade across the nodes and report how it went.",
    )
    demo.add_argument(
        "--scenario",
        choices=scenarios.SCENARIOS,
        default=UPGRADE,
        help="upgrade: roll a new driver across the nodes (default); remediation: a fatal "
        "XID on two nodes, quarantine to recovery; mig: two nodes relabelled to a mixed MIG "
        "layout, and their new resources; dra: two nodes switched to DRA by the device-API "
        "saga, a claim on each, a GPU fault",
    )
    demo.add_argument("--nodes", type=int, default=8, help="simulated nodes (default 8)")
    demo.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
    demo.add_argument("--max-parallel", type=int, default=2, help="maxParallelUpgrades")
    demo.add_argument(
        "--headless",
        action="store_true",
        help="plain progress lines for CI, then one JSON line (nodes, done, failed, "
        "seconds; a scenario's adds what happened on each target node); exit 0 only when "
        "every node is done (a scenario: both targets, as the scenario expects)",
    )
    demo.add_argument("--timeout", type=float, default=300, help="seconds for the rollout")
    demo.add_argument(
        "--kubeconfig",
        type=Path,
        help="run on this existing cluster, with KWOK nodes the demo registers (needs KWOK)",
    )
    demo.add_argument("--record", type=Path, help="write the event log here at the end")
    demo.add_argument("--hold", action="store_true", help="keep running until Ctrl-C")
    demo.add_argument(
        "--nats",
        help="use this NATS (URLs, comma separated: a server or a JetStream cluster) instead "
        "of starting one; it should hold no gpuop streams yet",
    )
    demo.add_argument(
        "--nats-replicas",
        type=int,
        help="replicas of the streams and buckets (default 3 when --nats lists 3 or more "
        "servers, else 1)",
    )
    demo.set_defaults(handler=run_demo)


async def run_demo(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    _check(args)
    with watching() as stop:
        try:
            return await _run(args, stop)
        except Stopped as stopped:
            print(f"stopped by {stopped.signum.name}; every process it started is stopped",
                  file=sys.stderr)  # fmt: skip
            return 128 + stopped.signum
        except FleetError as refused:  # the cluster cannot take the demo's nodes: one line
            raise CommandFailed(str(refused)) from None


async def _run(args: argparse.Namespace, stop: Stop) -> int:
    started = time.monotonic()
    live = sys.stdout.isatty() and not args.headless
    with tempfile.TemporaryDirectory(prefix="gpuop-demo-") as workdir:
        work = Path(workdir)
        async with AsyncExitStack() as stack:
            if args.nats:
                nats_url = args.nats
                print(f"using NATS at {nats_url} ({args.nats_replicas} replicas)")
            else:
                server = await stack.enter_async_context(NatsServer(work / "nats"))
                nats_url = server.url
                print(f"nats-server (JetStream) listening on {nats_url}")
            cluster: SimCluster | KwokFleet
            if args.kubeconfig is None:
                cluster = await stack.enter_async_context(
                    SimCluster(nodes=args.nodes, gpus=args.gpus)
                )
                kubeconfig = cluster.write_kubeconfig(work / "kubeconfig")
                kube = await stack.enter_async_context(await kubeclient.connect(kubeconfig))
                print(f"simulated cluster: {args.nodes} nodes x {args.gpus} GPUs at {cluster.url}")
            else:
                kubeconfig = args.kubeconfig
                kube = await stack.enter_async_context(await kubeclient.connect(kubeconfig))
                await _no_policy_yet(kube)
                await stack.enter_async_context(installed.set_aside(kube, _say))
                cluster = await stack.enter_async_context(KwokFleet(kube, args.nodes, args.gpus))
                print(f"cluster of {kubeconfig}: {args.nodes} KWOK nodes x {args.gpus} GPUs")
            tracker = rollout_view.Tracker(cluster.node_names, started)
            processes: list[Process] = []
            stack.push_async_callback(stop_all, processes)
            await _install_crd(kube)
            start = Start(processes, cluster, nats_url, kubeconfig, args, work)
            source = await start.hosts(stack)
            scenario = None
            if args.scenario != UPGRADE:
                assert isinstance(cluster, SimCluster)  # _check refuses --kubeconfig
                stage = scenarios.Stage(kube, cluster, start.roots, start.kubelets, args.gpus)
                scenario = scenarios.make(args.scenario, stage)
                start.add_configs(scenario.configs())
                tracker.targets = []  # chosen once the stack runs
                tracker.echo = not live
            await start.wave(first=True)
            await stop.unless_stopped(_wait_for_labels(kube, cluster.node_names, args.headless))
            await start.wave(first=False)
            if not args.headless:
                await stop.unless_stopped(show(processes))
            bus = NatsBus(nats_url, name="gpuop-demo", replicas=args.nats_replicas)
            await bus.start()
            stack.push_async_callback(bus.close)
            await _start_rollout(kube, source, args, scenario)
            if args.kubeconfig is not None:
                stack.push_async_callback(_delete_policy, kube)
            title = _title(args)
            footer = _footer(processes, nats_url, kubeconfig)
            play = _follow(bus, tracker, args, scenario, print_lines=not live)
            if live:
                async with screens.LiveScreen(tracker, title=title, footer=footer).showing():
                    await stop.unless_stopped(play)
            else:
                print(f"{'rolling' if scenario is None else 'playing'} {title}", flush=True)
                await stop.unless_stopped(play)
            ok, summary = tracker.outcome.done == len(cluster.node_names), None
            if scenario is not None:
                ok, found = await scenario.conclude(tracker)
                summary = json.dumps(found)
            if args.record is not None:
                lines = await events.export_lines(bus)
                args.record.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
                print(f"recorded {len(lines)} messages to {args.record}; check with:")
                print(f"  gpuop replay {args.record}")
            if not live and (args.hold or not args.headless):
                print("", *footer, sep="\n")
            summary = summary or tracker.outcome.summary()
            if args.hold:
                print(summary, "", "Running; Ctrl-C (or SIGTERM) stops it.", sep="\n")
                sys.stdout.flush()
                await stop.unless_stopped(asyncio.Event().wait())
    print(summary, flush=True)
    return 0 if ok else 1


def _title(args: argparse.Namespace) -> str:
    if args.scenario == rollout_view.REMEDIATION:
        return (
            f"GPU remediation on {scenarios.TARGETS} of {args.nodes} nodes: a GPU fallen off "
            "the bus (kernel log, XID 79, twice) and an NVLink error storm"
        )
    if args.scenario == "dra":
        return (
            f"DRA: {scenarios.TARGETS} of {args.nodes} nodes switched by the device-API saga, "
            "a claim on each, a GPU fault"
        )
    if args.scenario == rollout_view.MIG:
        return (
            f"MIG reconfiguration: {scenarios.TARGETS} of {args.nodes} nodes to "
            f"{scenarios.MIG_CONFIG}"
        )
    return (
        f"GPU driver {seeding.RECORDED_DRIVER_VERSION} -> {NEW_VERSION}, "
        f"{args.nodes} nodes, {args.max_parallel or 'all'} at a time"
    )


async def _follow(
    bus: NatsBus,
    tracker: rollout_view.Tracker,
    args: argparse.Namespace,
    scenario: scenarios.Scenario | None,
    *,
    print_lines: bool,
) -> None:
    """Follow the rollout, or play the scenario and follow its sagas, within `--timeout`."""
    following = rollout_view.follow(bus, tracker, print_lines=print_lines)
    try:
        async with asyncio.timeout(args.timeout):
            if scenario is None:
                await following
                return
            task = asyncio.create_task(following)
            try:
                await scenario.begin(tracker)
                await task
            finally:
                task.cancel()
                with suppress(asyncio.CancelledError):
                    await task
    except TimeoutError:
        tracker.outcome.seconds = tracker.elapsed
        what = "rollout" if scenario is None else f"{args.scenario} scenario"
        print(f"the {what} did not finish within {args.timeout:g} s", file=sys.stderr)
    except scenarios.ScenarioFailed as failed:
        tracker.outcome.seconds = tracker.elapsed
        print(f"the {args.scenario} scenario cannot go on: {failed}", file=sys.stderr)


def _footer(processes: list[Process], nats_url: str, kubeconfig: Path) -> list[str]:
    """Where to look while it runs: metrics, the event log, the rollout and the cluster."""
    cluster = [p for p in processes if p.node is None]
    lines = [
        f"{'metrics' if i == 0 else '':<9} {p.service:<21} {p.metrics_url}"
        for i, p in enumerate(cluster)
    ]
    first = next((p.node for p in processes if p.node is not None), None)
    ports = "  ".join(f"{p.service} :{p.port}" for p in processes if first and p.node == first)
    lines += [
        f"          on {first}: {ports} (every service: table above)",
        f"events    gpuop events tail --nats {nats_url}",
        f"rollout   gpuop upgrade status --kubeconfig {kubeconfig} --nats {nats_url}",
        f"cluster   kubectl --kubeconfig {kubeconfig} get nodes",
        "Ctrl-C stops everything.",
    ]
    return lines


def _check(args: argparse.Namespace) -> None:
    if not 1 <= args.gpus <= 64:
        raise ValueError(f"--gpus {args.gpus}: expected 1 to 64")
    if not 1 <= args.nodes <= 16:
        raise ValueError(f"--nodes {args.nodes}: expected 1 to 16")
    if args.max_parallel < 0:
        raise ValueError(f"--max-parallel {args.max_parallel}: expected 0 (no limit) or more")
    if args.scenario != UPGRADE and args.kubeconfig is not None:
        raise ValueError(
            f"--scenario {args.scenario}: runs on the simulated cluster only, not with "
            "--kubeconfig (its faults and MIG changes go through the simulated nodes)"
        )
    servers = [url for url in (args.nats or "").split(",") if url.strip()]
    if args.nats is not None and not servers:
        raise ValueError("--nats: expected one or more URLs, comma separated")
    if args.nats_replicas is None:
        args.nats_replicas = 3 if len(servers) >= 3 else 1
    if not 1 <= args.nats_replicas <= 5:
        raise ValueError(f"--nats-replicas {args.nats_replicas}: expected 1 to 5")


FIRST_WAVE = {(Role.CLUSTER, "upgrade-orchestrator"), (Role.CLUSTER, "discovery"),
              (Role.NODE, "discovery")}  # fmt: skip
"""What labelling the nodes and admitting the first of them needs, started before the rest."""


class Start:
    """Host roots with their kubelets, the driver source, then every built service in two
    waves (`FIRST_WAVE`, then the others)."""

    def __init__(
        self,
        processes: list[Process],
        cluster: SimCluster | KwokFleet,
        nats_url: str,
        kubeconfig: Path,
        args: argparse.Namespace,
        work: Path,
    ) -> None:
        self.processes = processes
        self.cluster = cluster
        self.nats_url = nats_url
        self.kubeconfig = kubeconfig
        self.args = args
        self.work = work
        self.built = list(services.installed().values())
        self.roots: dict[str, Path] = {}
        self.kubelets: dict[str, KubeletGrpc] = {}
        operands = [d.name for d in self.built if d.name in set(OperandService)]
        (work / "discovery.yaml").write_text(DISCOVERY_CONFIG)
        (work / "driver-manager.yaml").write_text(DRIVER_MANAGER_CONFIG)
        (work / "orchestrator.yaml").write_text(
            ORCHESTRATOR_CONFIG.format(operands=", ".join(operands))
        )
        self.configs = {
            "discovery": work / "discovery.yaml",
            "driver-manager": work / "driver-manager.yaml",
            "upgrade-orchestrator": work / "orchestrator.yaml",
        }

    async def hosts(self, stack: AsyncExitStack) -> Path:
        """Every node's host root with its kubelet's gRPC side, and the driver source with
        both versions; returns the source."""
        source = self.work / "driver-source"
        for node in self.cluster.node_names:
            machine = self.cluster.machine(node)
            root = build_host_root(
                self.work / "hosts" / node,
                node,
                self.args.gpus,
                boot_id=machine.boot_id,
                product_name=machine.type.name,
            )
            self.roots[node] = root.path
            self.kubelets[node] = await stack.enter_async_context(KubeletGrpc.under(root.path))
            if not source.exists():
                kernel = system.kernel_release(root) or ""
                versions = (seeding.RECORDED_DRIVER_VERSION, NEW_VERSION)
                packaging.build_driver_source(
                    source, [("gpu", v, kernel) for v in versions], signing_key=keys.SIGNING_KEY
                )
        return source

    def add_configs(self, configs: dict[str, str]) -> None:
        """More configuration for these services, by service (a scenario's): appended to
        the demo's own file of the service, or its file."""
        for service, text in configs.items():
            path = self.work / f"{service}.yaml"
            before = path.read_text() if service in self.configs else ""
            path.write_text(before + text)
            self.configs[service] = path

    async def wave(self, *, first: bool) -> None:
        """Start the services of the first wave, or of the second."""
        for role in (Role.CLUSTER, Role.NODE):
            for definition in self.built:
                if role not in definition.roles:
                    continue
                if ((role, definition.name) in FIRST_WAVE) != first:
                    continue
                if role is Role.CLUSTER:
                    await self._cluster_role(definition.name)
                else:
                    for node in self.cluster.node_names:
                        await self._node_role(definition.name, node)

    async def _cluster_role(self, service: str) -> None:
        extra = ["--kubeconfig", str(self.kubeconfig), *_config(self.configs, service)]
        extra += ["--nats-replicas", str(self.args.nats_replicas)]
        self.processes.append(
            await spawn(service, Role.CLUSTER, None, self.nats_url, extra, self.work)
        )

    async def _node_role(self, service: str, node: str) -> None:
        extra = ["--node", node, "--nvml", f"sim:{self.args.gpus}"]
        extra += ["--host-root", str(self.roots[node])]
        extra += ["--nats-replicas", str(self.args.nats_replicas), *_config(self.configs, service)]
        self.processes.append(
            await spawn(service, Role.NODE, node, self.nats_url, extra, self.work)
        )


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


async def _install_crd(kube: kubeclient.Kube) -> None:
    """The GPUClusterPolicy CRD, before any service starts (the orchestrator would otherwise
    find it missing and look again only seconds later)."""
    extensions = k8s.ApiextensionsV1Api(kube.api_client)
    with suppress(kubeerrors.AlreadyExists):  # an existing cluster may have it from the chart
        await kube.call(extensions.create_custom_resource_definition, crd.build())


async def _no_policy_yet(kube: kubeclient.Kube) -> None:
    """Refuse a cluster whose orchestrator already has a policy to follow."""
    try:
        found = await kube.call(
            kube.custom_objects.list_cluster_custom_object, specs.GROUP, specs.VERSION, specs.PLURAL
        )
    except kubeerrors.NotFound:
        return  # no CRD yet
    names = [item["metadata"]["name"] for item in found.get("items") or []]
    if names:
        raise ValueError(
            f"--kubeconfig: the cluster already has GPUClusterPolicy {', '.join(names)}; the "
            "demo makes its own and would fight over its nodes"
        )


async def _delete_policy(kube: kubeclient.Kube) -> None:
    with suppress(kubeerrors.NotFound):
        await kube.call(
            kube.custom_objects.delete_cluster_custom_object,
            specs.GROUP,
            specs.VERSION,
            specs.PLURAL,
            "default",
        )


async def _start_rollout(
    kube: kubeclient.Kube,
    source: Path,
    args: argparse.Namespace,
    scenario: scenarios.Scenario | None,
) -> None:
    """Create a GPUClusterPolicy asking for the new driver; for a scenario, the running one
    (no upgrade) with what the scenario adds."""
    version = NEW_VERSION if scenario is None else seeding.RECORDED_DRIVER_VERSION
    policy: dict[str, Any] = {
        "apiVersion": specs.API_VERSION,
        "kind": specs.KIND,
        "metadata": {"name": "default"},
        "spec": {
            # the source is signed with the simulation's (public, worthless) key, so the
            # nodes verify its index as they would a real mirror's
            "driver": {
                "gpu": {
                    "version": version,
                    "source": str(source),
                    "publicKeys": [keys.PUBLIC_KEY],
                }
            },
            "upgradePolicy": {
                "maxParallelUpgrades": args.max_parallel,
                "maxUnavailable": "50%",
                "podDeletion": {"force": True, "deleteEmptyDir": True, "timeoutSeconds": 60},
                # a node its PodDisruptionBudgets block fails with the reason well within the
                # demo's timeout, instead of waiting out upstream's default
                "drain": {
                    "enable": True,
                    "force": True,
                    "deleteEmptyDir": True,
                    "timeoutSeconds": 60,
                },
            },
        },
    }
    if scenario is not None:
        scenario.policy(policy["spec"])
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


def _say(line: str) -> None:
    print(line, flush=True)
