"""Soak: a 200-node simulated cluster runs telemetry, device events and a never-ending
rollout for 10 minutes; does the resident memory of any service keep growing?

Run by `tests.bench.run_all` (`make bench`), or alone:
`.venv/bin/python -m tests.bench.soak [--quick] [--seconds S] [--nodes N] [--sample-nodes K]
[--work DIR] [--trace KIND]`.

Two hundred nodes with five node services each do not fit one small machine as processes,
so the cluster is made of three parts, all on one real nats-server:

- real processes (`gpuop run`, as a DaemonSet or Deployment starts them) for every cluster
  role (upgrade-orchestrator, discovery's labeler, telemetry's operator metrics,
  network-manager's controller) and, on `--sample-nodes` nodes spread over the cluster
  (6; 2 with `--quick`), discovery, the driver-manager, the device plugin and telemetry's
  exporter, each node on its own simulated host root with the simulated kubelet's gRPC
  side, as tests/support/stack.py builds them; a driver source holds both driver versions;
- every other node emulated by one more process (`tests/bench/_fleet.py`): its inventory,
  a heartbeat every 10 s, the driver-manager's and the operands' answers to every command
  at once; it also publishes GPU health changes (XID and ECC, one a second, each GPU
  recovering ten events later) for every node, the sample nodes' device plugins included;
- the simulated Kubernetes cluster (`gpuop_sim.SimCluster`, 200 nodes of 8 GPUs, 50 with
  `--quick`, GPU workloads under PodDisruptionBudgets, kubelets reporting every 10 s) in
  this process.

The service intervals are shorter than their defaults, so the same code runs more often:
discovery scans every 10 s and beats every 5 s, telemetry collects every second. Every
service's /metrics is scraped every 15 s, as Prometheus would. Once discovery has labelled
every node, a GPUClusterPolicy asks for driver NEW (maxParallelUpgrades 20, pods deleted,
nodes drained); whenever a rollout ends (`rollout-completed` or `rollout-failed` on the
bus) the policy asks for the other version, so a rollout runs from start to end.

Every `SAMPLE_SECONDS` the resident memory (VmRSS in /proc/<pid>/status) of every process
is read. The first quarter of the run (at least 60 s, or a third of a shorter run) is
warm-up and left out. A process's growth is the median of its last three samples over
the median of its first three after warm-up, less one; the target holds every service
process below `TARGET_GROWTH`, and none may exit during the run. The fleet, nats-server
and this process (the simulated cluster) are reported for information only.

To find what grows: `--work DIR` keeps every log and the samples (`rss.csv`); `--trace KIND`
runs that kind of service under tracemalloc from the end of warm-up (`_traced.py`) and
prints, after the run, the allocation sites of what it allocated since and still holds
(its memory is then no figure). Processes: `_processes.py`.

Nothing is asserted here. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes.aio import client as k8s

from tests.bench._processes import OWN_ENVIRONMENT

# the simulated kubelets serve gRPC in this process, and every service is forked from it
# (to set its parent-death signal) and exec'd at once: gRPC's fork handlers have nothing
# to protect, and would log a line for every fork, as for every plugin stopped at the end
os.environ.update(OWN_ENVIRONMENT)

from gpuop.bus import BusError, NatsBus, NatsServer, StoredMessage
from gpuop.events import MalformedMessage, UnknownEventType, decode, subjects
from gpuop.events import upgrade as up
from gpuop.host import packaging, system
from gpuop.host.roots import HostRoot
from gpuop.kube import client, customobjects
from gpuop.kube import errors as kubeerrors
from gpuop.policy import crd, specs
from gpuop_sim import SimCluster
from gpuop_sim.cluster import hosts
from gpuop_sim.cluster.kubelet_grpc import KubeletGrpc
from gpuop_sim.host import keys, seeding
from tests.bench._fleet import FleetConfig, FleetNode
from tests.bench._processes import (
    Tracked,
    held_allocations,
    held_snapshots,
    rss_kb,
    spawn,
    start_tracing,
    stop_all,
    tail,
    write_samples,
)
from tests.bench._traced import SNAPSHOT

OLD = seeding.RECORDED_DRIVER_VERSION
NEW = "580.200.01"
GPUS = 8
NODES = {False: 200, True: 50}
SAMPLE_NODES = {False: 6, True: 2}
SECONDS = {False: 600.0, True: 40.0}
SAMPLE_SECONDS = {False: 5.0, True: 2.5}
MAX_PARALLEL = {False: 20, True: 10}
STARTUP_TIMEOUT = {False: 300.0, True: 90.0}
"""Seconds from the first process started until discovery has labelled every node."""
SMOKE = {"nodes": 4, "sample_nodes": 1, "seconds": 6}
"""`--smoke`: quick's settings but these, a run that only shows the soak still runs."""
WARMUP_SHARE = 0.25
WARMUP_MIN_SECONDS = 60.0
SCRAPE_SECONDS = 15.0
TARGET_GROWTH = 0.10
SEED = 11
HEARTBEAT_SECONDS = 10.0
HEALTH_EVENTS_PER_SECOND = 1.0
RECOVER_AFTER = 10
KINDS = (
    "upgrade-orchestrator", "discovery-cluster", "telemetry-cluster", "network-manager-cluster",
    "discovery-node", "driver-manager", "device-plugin", "telemetry-node",
)  # fmt: skip

ROOT = Path(__file__).resolve().parents[2]
"""The service processes by kind: the cluster roles, then each sample node's services."""
DRIVER_LABEL = "nvidia.com/cuda.driver-version.full"
POLICY = "default"
DISCOVERY_CONFIG = "scan_interval_seconds: 10\nheartbeat_interval_seconds: 5\n"
DRIVER_MANAGER_CONFIG = f"kernel: auto\nunload_poll_seconds: 0.1\ntrust: {json.dumps(keys.TRUST)}\n"
TELEMETRY_CONFIG = "interval_seconds: 1\nslow_interval_seconds: 10\n"
ORCHESTRATOR_CONFIG = "resync_seconds: 1\noperands: [discovery, device-plugin, telemetry]\n"


def spread(names: list[str], count: int) -> list[str]:
    """`count` of `names`, evenly spaced, so the sample nodes fall into different waves."""
    count = min(count, len(names))
    return [names[index * len(names) // count] for index in range(count)]


@dataclass
class Rollouts:
    """Keeps a rollout going: when one ends, the policy asks for the other version."""

    kube: client.Kube
    bus: NatsBus
    version: str = NEW
    current: str | None = None
    started: int = 0
    completed: int = 0
    failed: int = 0
    nodes_done: int = 0
    nodes_failed: int = 0
    durations: list[float] = field(default_factory=list)
    read_retries: int = 0
    progress: str = ""
    ended: set[str] = field(default_factory=set)

    async def start(self, source: Path, max_parallel: int) -> None:
        """Install the CRD and create the policy asking for `NEW`."""
        extensions = k8s.ApiextensionsV1Api(self.kube.api_client)
        await self.kube.call(extensions.create_custom_resource_definition, crd.build())
        policy = {
            "apiVersion": specs.API_VERSION,
            "kind": specs.KIND,
            "metadata": {"name": POLICY},
            "spec": {
                "driver": {
                    "gpu": {
                        "version": self.version,
                        "source": str(source),
                        "publicKeys": [keys.PUBLIC_KEY],
                    }
                },
                "upgradePolicy": {
                    "maxParallelUpgrades": max_parallel,
                    "maxUnavailable": "25%",
                    "podDeletion": {"force": True, "deleteEmptyDir": True, "timeoutSeconds": 60},
                    "drain": {"enable": True, "force": True, "deleteEmptyDir": True},
                },
            },
        }
        for _ in range(100):  # the API server serves a new CRD a moment after creating it
            try:
                await customobjects.create(self.kube, customobjects.GPU_CLUSTER_POLICIES, policy)
                return
            except kubeerrors.NotFound:
                await asyncio.sleep(0.1)
        raise RuntimeError("the GPUClusterPolicy CRD was never served")

    async def follow(self) -> None:
        """Read the rollout events; flip the version whenever the latest rollout ends."""
        subject = subjects.events_filter(up.DOMAIN, subjects.CLUSTER, prefix=self.bus.prefix)
        last: StoredMessage | None = None
        while True:
            try:
                since = last.time if last is not None else None
                async for stored in self.bus.read(subject, since=since, follow=True):
                    if last is not None and stored.seq <= last.seq:
                        continue
                    last = stored
                    await self._observe(stored)
            except BusError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    # on Python 3.11 a cancel that meets the fetch's own timeout comes out
                    # as a timeout, which the bus reports as a broken read
                    raise asyncio.CancelledError from None
                # a follow-mode read breaks off now and then on a busy machine (a fetch
                # timing out), as `gpuop demo`'s view knows: read on from the last one seen
                self.read_retries += 1
                await asyncio.sleep(0.5)

    async def _observe(self, stored: StoredMessage) -> None:
        try:
            _, payload = decode(stored.data)
        except (MalformedMessage, UnknownEventType):
            return
        if isinstance(payload, up.RolloutStarted):
            if payload.rollout_id in self.ended:
                return  # told again, after it ended
            print(f"{payload.rollout_id} started: {payload.total} nodes", flush=True)
            self.current = payload.rollout_id
            self.started += 1
            return
        if isinstance(payload, up.RolloutProgress) and payload.rollout_id == self.current:
            self.progress = f"{payload.done}/{payload.total} of {payload.rollout_id}"
            return
        if not isinstance(payload, up.RolloutCompleted | up.RolloutFailed):
            return
        if payload.rollout_id != self.current:
            return
        self.current = None
        self.ended.add(payload.rollout_id)
        self.nodes_done += payload.done
        self.nodes_failed += payload.failed
        if isinstance(payload, up.RolloutCompleted):
            self.completed += 1
            self.durations.append(payload.duration_seconds)
        else:
            self.failed += 1
            print(f"rollout {payload.rollout_id} failed: {payload.reason} {payload.message}")
        self.version = OLD if self.version == NEW else NEW
        body = {"spec": {"driver": {"gpu": {"version": self.version}}}}
        await customobjects.patch(self.kube, customobjects.GPU_CLUSTER_POLICIES, POLICY, body)


async def sample(tracked: list[Tracked], began: float, every: float, rollouts: Rollouts) -> None:
    """Read every process's VmRSS every `every` seconds; a line of progress each minute."""
    shown = 0.0
    while True:
        at = time.monotonic() - began
        for item in tracked:
            rss = rss_kb(item.pid)
            if rss is not None:
                item.samples.append((at, rss))
        if at - shown >= 30.0 or not shown:
            shown = at or 1e-9
            services = sum(t.samples[-1][1] for t in tracked if t.service and t.samples) / 1024
            print(f"{at:6.0f} s: {rollouts.completed + rollouts.failed} rollouts ended, "
                  f"{rollouts.nodes_done} node upgrades, now {rollouts.progress or '-'}; "
                  f"services {services:.0f} MB", flush=True)  # fmt: skip
        await asyncio.sleep(every - (time.monotonic() - began - at))


async def scrape(tracked: list[Tracked], counts: dict[str, int]) -> None:
    """GET every service's /metrics every `SCRAPE_SECONDS`, as Prometheus would; counts
    the answers in `counts`."""
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while True:
            for item in tracked:
                if item.port is None:
                    continue
                try:
                    async with session.get(f"http://127.0.0.1:{item.port}/metrics") as response:
                        await response.read()
                        counts["scrapes" if response.status == 200 else "scrape_failures"] += 1
                except (aiohttp.ClientError, TimeoutError):
                    counts["scrape_failures"] += 1
            await asyncio.sleep(SCRAPE_SECONDS)


async def labelled(kube: client.Kube, nodes: int) -> int:
    """Nodes discovery has labelled with the driver they run at start."""
    found = await kube.call(kube.core.list_node)
    return sum(
        (item["metadata"].get("labels") or {}).get(DRIVER_LABEL) == OLD for item in found["items"]
    )


async def start_processes(
    tracked: list[Tracked],
    work: Path,
    nats_url: str,
    kubeconfig: Path,
    roots: dict[str, HostRoot],
    fleet_config: Path,
    trace: str | None,
) -> None:
    """Every cluster role, the node services of the sample nodes (`roots`) and the fleet;
    each is added to `tracked` as soon as it runs, so that it is stopped whatever happens.
    The services of kind `trace` run under tracemalloc (`_traced.py`)."""
    logs = work / "logs"

    def config(name: str) -> list[str]:
        return ["--config", str(work / f"{name}.yaml")]

    async def start(name: str, kind: str, argv: list[str]) -> None:
        if kind == trace:
            traced = ["-m", "tests.bench._traced", "run", *argv]
            snapshots = {"SOAK_SNAPSHOTS": str(work / "snapshots" / name)}
            started = await spawn(name, kind, traced, logs, service=True,
                                  extra_environment=snapshots)  # fmt: skip
        else:
            started = await spawn(name, kind, ["-m", "gpuop.cli.main", "run", *argv], logs,
                                  service=True)  # fmt: skip
        tracked.append(started)

    cluster_role = ["--role", "cluster", "--nats", nats_url, "--kubeconfig", str(kubeconfig)]
    for kind, argv in (
        ("upgrade-orchestrator", ["upgrade-orchestrator", *config("orchestrator")]),
        ("discovery-cluster", ["discovery", *config("discovery")]),
        ("telemetry-cluster", ["telemetry", *config("telemetry")]),
        ("network-manager-cluster", ["network-manager"]),
    ):
        await start(kind, kind, [*argv, *cluster_role])
    for node, root in roots.items():
        on_node = ["--role", "node", "--node", node, "--nats", nats_url]
        on_node += ["--host-root", str(root.path), "--nvml", f"sim:{GPUS}"]
        for kind, argv in (
            ("discovery-node", ["discovery", *config("discovery")]),
            ("driver-manager", ["driver-manager", *config("driver-manager")]),
            ("device-plugin", ["device-plugin"]),
            ("telemetry-node", ["telemetry", *config("telemetry")]),
        ):
            await start(f"{kind}-{node}", kind, [*argv, *on_node])
    fleet = ["-m", "tests.bench._fleet", str(fleet_config)]
    tracked.append(await spawn("fleet", "fleet", fleet, logs, service=False))


@dataclass
class Run:
    """What to run: the command line, read."""

    quick: bool
    nodes: int
    sample_nodes: int
    seconds: float
    sample_every: float
    max_parallel: int
    startup_timeout: float
    work: Path | None = None
    """Where the logs, host roots and nats-server's store go and stay; a temporary
    directory by default."""
    trace: str | None = None
    smoke: bool = False
    """The kind of service to run under tracemalloc, its growth shown by allocation site."""

    @property
    def warmup(self) -> float:
        return max(WARMUP_SHARE * self.seconds, min(WARMUP_MIN_SECONDS, self.seconds / 3))


@dataclass
class Outcome:
    """What happened during the soak, besides the samples."""

    setup_seconds: float = 0.0
    exits: dict[str, int] = field(default_factory=dict)
    """Processes that exited during the soak, and how."""
    stops: dict[str, int | None] = field(default_factory=dict)
    """Exit codes at the end (None: killed)."""
    scraped: dict[str, int] = field(default_factory=lambda: {"scrapes": 0, "scrape_failures": 0})


async def prepare_sample_nodes(
    exits: AsyncExitStack, cluster: SimCluster, work: Path, sampled: list[str]
) -> tuple[dict[str, HostRoot], Path]:
    """A host root per sample node with its kubelet's gRPC side, and a driver source with
    both versions for their kernel; (roots, source)."""
    roots: dict[str, HostRoot] = {}
    for node in sampled:
        machine = cluster.machine(node)
        roots[node] = hosts.build_host_root(
            work / "hosts" / node, node, GPUS, gpu_version=OLD, boot_id=machine.boot_id,
            product_name=machine.type.name,
        )  # fmt: skip
        await exits.enter_async_context(KubeletGrpc.under(roots[node].path))
    source = work / "driver-source"
    releases = sorted({system.kernel_release(root) or "" for root in roots.values()})
    packaging.build_driver_source(
        source,
        [("gpu", version, kernel) for kernel in releases for version in (OLD, NEW)],
        signing_key=keys.SIGNING_KEY,
    )
    return roots, source


def write_configs(work: Path, nats_url: str, cluster: SimCluster, sampled: list[str]) -> Path:
    """The services' configuration files, and the fleet's (whose path it returns)."""
    for name, text in (
        ("discovery", DISCOVERY_CONFIG), ("driver-manager", DRIVER_MANAGER_CONFIG),
        ("telemetry", TELEMETRY_CONFIG), ("orchestrator", ORCHESTRATOR_CONFIG),
    ):  # fmt: skip
        (work / f"{name}.yaml").write_text(text)
    emulated = [
        FleetNode(name=node, boot_id=cluster.boot_id(node),
                  product_name=cluster.machine(node).type.name)
        for node in cluster.node_names if node not in sampled
    ]  # fmt: skip
    fleet = FleetConfig(
        nats_url=nats_url, work=work / "fleet", gpus=GPUS, driver_version=OLD, emulated=emulated,
        sample_nodes=sampled, heartbeat_seconds=HEARTBEAT_SECONDS,
        health_events_per_second=HEALTH_EVENTS_PER_SECOND, recover_after=RECOVER_AFTER,
    )  # fmt: skip
    path = work / "fleet.json"
    path.write_text(fleet.model_dump_json())
    return path


async def wait_labelled(kube: client.Kube, tracked: list[Tracked], run: Run, logs: Path) -> None:
    """Until discovery has labelled every node; fails when a process exits meanwhile."""
    try:
        async with asyncio.timeout(run.startup_timeout):
            while await labelled(kube, run.nodes) < run.nodes:
                exited = [t.name for t in tracked if t.process and t.process.returncode is not None]
                if exited:
                    tails = [tail(logs / f"{name}.log") for name in exited]
                    raise RuntimeError("exited during start:\n" + "\n".join(tails))
                await asyncio.sleep(1.0)
    except TimeoutError:
        raise RuntimeError(
            f"discovery did not label every node within {run.startup_timeout:g} s "
            f"({await labelled(kube, run.nodes)} of {run.nodes})"
        ) from None


async def keep_rolling(
    run: Run, tracked: list[Tracked], rollouts: Rollouts, work: Path, outcome: Outcome
) -> None:
    """The soak itself: rollouts, samples, scrapes for `run.seconds`; with `run.trace`, the
    traced services start tracing at the end of warm-up and tell what they still hold."""
    began = time.monotonic()
    workers = [
        asyncio.create_task(sample(tracked, began, run.sample_every, rollouts)),
        asyncio.create_task(rollouts.follow()),
        asyncio.create_task(scrape(tracked, outcome.scraped)),
    ]
    traced = [t for t in tracked if t.kind == run.trace]
    tracing = False
    try:
        while time.monotonic() - began < run.seconds:
            await asyncio.sleep(1.0)
            if traced and not tracing and time.monotonic() - began >= run.warmup:
                start_tracing(traced)
                tracing = True
            for item in tracked:
                code = item.process.returncode if item.process else None
                if code is not None and item.name not in outcome.exits:
                    outcome.exits[item.name] = code
                    print(f"{item.name} exited with {code}", flush=True)
                    print(tail(work / "logs" / f"{item.name}.log"), flush=True)
            for worker in workers:
                if worker.done():
                    worker.result()
    finally:
        for task in workers:
            task.cancel()
        await asyncio.wait(workers, timeout=10.0)
    if tracing:
        await held_snapshots(traced, work / "snapshots")


async def soak(run: Run) -> dict[str, Any]:
    outcome = Outcome()
    with tempfile.TemporaryDirectory(prefix="gpuop-soak-") as tmp:
        work = run.work or Path(tmp)
        logs = work / "logs"
        logs.mkdir()
        tracked: list[Tracked] = []
        async with AsyncExitStack() as exits:
            server = await exits.enter_async_context(NatsServer(work / "nats"))
            began_setup = time.monotonic()
            cluster = await exits.enter_async_context(
                SimCluster(nodes=run.nodes, gpus=GPUS, workloads=True, seed=SEED)
            )
            kubeconfig = cluster.write_kubeconfig(work / "kubeconfig")
            kube = await exits.enter_async_context(await client.connect(kubeconfig))
            bus = NatsBus(server.url, name="soak")
            await bus.start()
            exits.push_async_callback(bus.close)
            sampled = spread(cluster.node_names, run.sample_nodes)
            roots, source = await prepare_sample_nodes(exits, cluster, work, sampled)
            fleet = write_configs(work, server.url, cluster, sampled)
            exits.push_async_callback(stop_all, tracked)
            await start_processes(tracked, work, server.url, kubeconfig, roots, fleet, run.trace)
            tracked.append(Tracked("nats-server", "nats-server", server.pid or 0, service=False))
            tracked.append(Tracked("benchmark", "benchmark", os.getpid(), service=False))
            print(f"{sum(t.service for t in tracked)} service processes, {len(sampled)} sample "
                  f"nodes, {run.nodes - len(sampled)} emulated", flush=True)  # fmt: skip
            await wait_labelled(kube, tracked, run, logs)
            outcome.setup_seconds = time.monotonic() - began_setup
            print(f"every node labelled after {outcome.setup_seconds:.0f} s; rolling", flush=True)
            rollouts = Rollouts(kube, bus)
            await rollouts.start(source, run.max_parallel)
            await keep_rolling(run, tracked, rollouts, work, outcome)
            outcome.stops = await stop_all(tracked)
            write_samples(work / "rss.csv", tracked)
            for item in tracked:
                if item.kind == run.trace:
                    print(f"--- what {item.name} allocated after warm-up and still holds:")
                    snapshot = work / "snapshots" / item.name / SNAPSHOT
                    print("\n".join(held_allocations(snapshot)), flush=True)
    return report(run, tracked, rollouts, outcome)


def report(
    run: Run, tracked: list[Tracked], rollouts: Rollouts, outcome: Outcome
) -> dict[str, Any]:
    warmup = run.warmup
    # the kinds held to the target: a traced service's memory is no figure
    held = {t.kind for t in tracked if t.service and t.kind != run.trace}
    by_kind: dict[str, list[tuple[float, Tracked, float, float]]] = {}
    unmeasured: list[str] = []
    for item in tracked:
        measured = item.growth(warmup)
        if measured is None:
            unmeasured.append(item.name)
            continue
        by_kind.setdefault(item.kind, []).append((measured[0], item, measured[1], measured[2]))
    figures: dict[str, Any] = {}
    worst: tuple[float, str] = (float("-inf"), "none")
    for kind, entries in sorted(by_kind.items()):
        growth, item, first, last = max(entries, key=lambda entry: entry[0])
        key = kind.replace("-", "_")
        figures[f"growth_pct_{key}"] = round(growth * 100, 2)
        figures[f"rss_mb_{key}"] = f"{first:.1f} -> {last:.1f}"
        if kind in held and growth > worst[0]:
            worst = (growth, item.name)
    services_unmeasured = [t.name for t in tracked if t.name in unmeasured and t.kind in held]
    met = worst[0] < TARGET_GROWTH and not outcome.exits and not services_unmeasured
    samples = max((len(t.samples) for t in tracked), default=0)
    unclean = [
        f"{name}: {'killed' if code is None else code}"
        for name, code in sorted(outcome.stops.items())
        if code != 0
    ]
    return {
        "benchmark": "soak",
        "about": (
            "A simulated cluster (SimCluster, GPU workloads) whose cluster-role services and a"
            " few sample nodes' node services run as real processes, the other nodes emulated"
            " on the bus by one process, under GPU health events and back-to-back rollouts"
            " between two driver versions; each process's resident memory after warm-up:"
            " growth = median of the last 3 samples / median of the first 3 - 1 (fleet,"
            " nats-server and the benchmark itself for information)."
        ),
        "mode": "smoke" if run.smoke else "quick" if run.quick else "full",
        "target": f"< {TARGET_GROWTH:.0%} RSS growth after warm-up for every service",
        "target_met": met,
        "nodes": run.nodes,
        "sample_nodes": run.sample_nodes,
        "service_processes": sum(t.service for t in tracked),
        "seconds": run.seconds,
        "warmup_s": round(warmup, 1),
        "sample_every_s": run.sample_every,
        "samples_per_process": samples,
        "setup_s": round(outcome.setup_seconds, 1),
        "max_parallel": run.max_parallel,
        "traced": run.trace or "none",
        "rollouts_started": rollouts.started,
        "rollouts_completed": rollouts.completed,
        "rollouts_failed": rollouts.failed,
        "node_upgrades": rollouts.nodes_done,
        "node_upgrades_failed": rollouts.nodes_failed,
        "rollout_p50_s": round(statistics.median(rollouts.durations), 1)
        if rollouts.durations
        else None,
        "rollout_event_read_retries": rollouts.read_retries,
        "scrapes": outcome.scraped["scrapes"],
        "scrape_failures": outcome.scraped["scrape_failures"],
        "worst_service_process": worst[1],
        "worst_growth_pct": round(worst[0] * 100, 2) if worst[1] != "none" else None,
        **figures,
        "exited_during_run": [f"{name}: {code}" for name, code in outcome.exits.items()] or "none",
        "unmeasured": unmeasured or "none",
        "unclean_stops": unclean or "none",
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--quick", action="store_true", help="50 nodes for 40 s (under 2 minutes in all)"
    )
    parser.add_argument("--smoke", action="store_true", help="4 nodes for 6 s: does it still run")
    parser.add_argument("--seconds", type=float, help="soak length after start-up")
    parser.add_argument("--nodes", type=int, help="nodes of the simulated cluster")
    parser.add_argument("--sample-nodes", type=int, help="nodes whose agents run as processes")
    parser.add_argument("--work", type=Path, help="keep logs and state in this new directory")
    parser.add_argument(
        "--trace",
        choices=KINDS,
        help="run this kind of service under tracemalloc and show what it allocated after "
        "warm-up and still holds at the end (its memory figures then mean nothing)",
    )
    args = parser.parse_args(argv)
    logging.getLogger("gpuop").setLevel(logging.WARNING)
    quick = args.quick or args.smoke
    smoke = SMOKE if args.smoke else {}
    run = Run(
        quick=quick,
        smoke=args.smoke,
        nodes=args.nodes or smoke.get("nodes", NODES[quick]),
        sample_nodes=(
            args.sample_nodes
            if args.sample_nodes is not None
            else smoke.get("sample_nodes", SAMPLE_NODES[quick])
        ),
        seconds=args.seconds or smoke.get("seconds", SECONDS[quick]),
        sample_every=SAMPLE_SECONDS[quick],
        max_parallel=MAX_PARALLEL[quick],
        startup_timeout=STARTUP_TIMEOUT[quick],
        work=args.work,
        trace=args.trace,
    )
    if args.work is not None:
        args.work.mkdir(parents=True)
    try:
        result = asyncio.run(_main(run))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted; every process stopped", file=sys.stderr)
        return 130
    print(json.dumps(result))
    return 0


async def _main(run: Run) -> dict[str, Any]:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await soak(run)


if __name__ == "__main__":
    sys.exit(main())
