"""Side by side with upstream: gpuop's rollout and the GPU Operator's (NVIDIA's
k8s-operator-libs upgrade state machine) on the same real control plane, the same KWOK GPU
nodes and workloads, the same policy, the same driver reload time.

Run by `tests.bench.run_all` (`make bench`, which builds the harness with `make
peer-tools`), or alone: `.venv/bin/python -m tests.bench.vs_upstream [--quick]`. Quick: 20
nodes, maxParallelUpgrades 5, a 5 s reload; full: 100 nodes, 10, 30 s.

Each side runs on a fresh control plane of its own (`tests.support.control_plane`, with
KWOK's stages plus ours, `tests/peer/kwok/driver-reload.yaml`) with `KwokFleet`'s GPU nodes
and workloads (Deployments under PodDisruptionBudgets, a Job). Both policies: maxUnavailable
25%, GPU pod deletion (not forced, emptyDir allowed, 300 s), drain enabled (not forced,
emptyDir allowed, 300 s), no wait for jobs (KWOK's Job pods never finish).

- **upstream**: `tests/peer`'s `upstream-upgrade` (see its README) with a ServiceAccount of its
  own bound to cluster-admin, over a driver DaemonSet (`OnDelete`) and a validator DaemonSet
  whose pods KWOK makes Ready a reload time after they appear. The rollout starts when the
  driver DaemonSet's template changes, once the harness has marked every node upgrade-done.
  A node is done when it is labelled upgrade-done and its driver pod is the new one, Ready.
- **gpuop**: the chart installed by the real Helm (its CRD, ServiceAccounts and RBAC),
  nats-server, two upgrade-orchestrator replicas as processes (the chart's pair, its default
  settings: a 15 s Lease, a 3 s NATS presence), acting as the chart's ServiceAccount, and an
  emulated fleet of node
  agents on the bus (`tests/bench/_fleet.py`) whose driver load takes the reload time. The
  rollout starts when the GPUClusterPolicy is created. A node is done when it is labelled
  upgrade-done and its emulated driver-manager loaded the new driver.

Figures, each for both sides and as the ratio gpuop/upstream:
- makespan: from the rollout's start until every node is done;
- API requests per upgraded node: the controller's user's requests in the apiserver's audit
  log received during the rollout (both replicas for gpuop), over the nodes done;
- peak controller memory: the highest VmHWM of the controller processes;
- the controller SIGKILLed once half the nodes are done (upstream's one process, started
  again at once; gpuop's leading replica, the standby takes over): seconds until a node's
  upgrade state changes again, in-flight drains (nodes between cordon and drain at the kill)
  that still finish, and the makespan;
- one broken node (its new driver never becomes ready): whether every other node finishes,
  and when.
A kill can land in the middle of an eviction: the apiserver has already counted it in the
budget (its status's disruptedPods) but the request ends with its client and the pod stays.
Every eviction under that budget is then refused until the disruption controller drops the
entry, 2 minutes later (seen for gpuop in three of five quick runs before 2026-12-07). gpuop's
new leader now deletes a pod its budget already counts (`gpuop.kube.budgets.counted`; on
purpose in tests/e2e/test_kill_mid_eviction_real_cluster_e2e.py); upstream's drain evicts
again and waits, so its kill makespan includes the stall when the kill lands there.
- the apiserver answering slowly: both controllers reach it through a TCP proxy that holds
  every chunk a client sends for 50 ms (`SlowProxy`); the makespan. Quick mode leaves it out
  unless `--slow` asks for it: with it a quick run takes about fifteen minutes, not ten
  (`make bench` runs it; `run_all --quick --args vs_upstream=--slow` writes every figure).

The last line printed is one JSON object; its `about` holds the "vs upstream" table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuop.bus import NatsBus, NatsServer
from gpuop.bus.launcher import exiting_with_parent
from gpuop.events import driver
from gpuop.kube import client, customobjects
from gpuop.kube import errors as kubeerrors
from gpuop.policy import specs
from gpuop.saga.actions import STATE_LABEL
from gpuop_sim.cluster.kwok import KwokFleet
from gpuop_sim.host import keys
from tests.bench._fleet import Fleet, FleetConfig, FleetNode, template_inventory
from tests.support import fleet as chart
from tests.support.control_plane import STAGES, ControlPlane
from tests.support.processes import start_service

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / ".cache" / "peer-tools" / "bin" / "upstream-upgrade"
RELOAD_STAGE = ROOT / "tests" / "peer" / "kwok" / "driver-reload.yaml"
RELOAD_LABEL = "gpuop.dev/reload"
UPSTREAM_STATE_LABEL = "nvidia.com/gpu-driver-upgrade-state"
DRIVER_NAMESPACE = "gpu-operator"
DRIVER_DAEMONSET = "nvidia-driver-daemonset"
VALIDATOR_DAEMONSET = "nvidia-operator-validator"
UPSTREAM_ACCOUNT = "upstream-upgrade"
UPSTREAM_USER = f"system:serviceaccount:{DRIVER_NAMESPACE}:{UPSTREAM_ACCOUNT}"
ORCHESTRATOR_ACCOUNT = chart.service_account("upgrade-orchestrator")
GPUOP_USER = f"system:serviceaccount:{chart.RELEASE_NAMESPACE}:{ORCHESTRATOR_ACCOUNT}"
OLD, NEW = "570.1", "580.2"
GPUS = 8
DONE = "upgrade-done"
DRAINING = frozenset({"cordon-required", "wait-for-jobs-required", "pod-deletion-required",
                      "drain-required"})  # fmt: skip
"""Upgrade states between cordon and the end of the drain, the same names on both sides."""
POLL_SECONDS = 0.25


@dataclass(frozen=True)
class Size:
    nodes: int
    max_parallel: int
    reload_seconds: float
    requeue_seconds: float
    """The upstream controller's planned requeue. The GPU Operator's is 2 minutes, and it
    watches no pods: a restarted driver pod that became ready waits for it. Quick mode makes
    it 15 s (in favour of upstream) to fit in ten minutes."""
    timeout_seconds: float
    """Seconds one side's rollout may take before the run gives up on it: upstream's full
    rollout waits up to a requeue per wave, ten waves of 100 nodes at 10 at a time, so past
    20 minutes."""


SIZES = {True: Size(20, 5, 5.0, 15.0, 20.0 * 60), False: Size(100, 10, 30.0, 120.0, 60.0 * 60)}
SMOKE_SIZE = Size(4, 2, 1.0, 5.0, 5.0 * 60)
"""`--smoke`: the plain rollout alone, on a few nodes, to show both sides still run."""


# The pure parts: audit log, stages, figures.


def parse_time(stamp: str) -> datetime.datetime:
    """An audit event's RFC 3339 time ("...T08:10:52.123456Z") as an aware datetime."""
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def requests_by_user(
    events: Iterable[dict[str, Any]],
    user: str,
    start: datetime.datetime,
    end: datetime.datetime,
) -> Counter[tuple[str, str]]:
    """The requests `user` made that the apiserver received in [`start`, `end`], by (verb,
    resource[/subresource]); an event without a user or a time is an error that names it."""
    counted: Counter[tuple[str, str]] = Counter()
    for number, event in enumerate(events, 1):
        try:
            name = event["user"]["username"]
            received = parse_time(event["requestReceivedTimestamp"])
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"audit event {number} has no user or time: {error!r}") from None
        if name != user or not start <= received <= end:
            continue
        ref = event.get("objectRef") or {}
        sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
        counted[(str(event.get("verb", "")), ref.get("resource", "") + sub)] += 1
    return counted


def ratio(ours: float | None, theirs: float | None) -> float | None:
    """gpuop/upstream, rounded; None when either is missing or upstream's is 0."""
    if ours is None or theirs is None or theirs == 0:
        return None
    return round(ours / theirs, 3)


def stage_set(
    defaults: dict[str, str], reload_stage: str, reload_seconds: float, broken: str | None
) -> dict[str, str]:
    """The KWOK stage files of a run, by file name: KWOK's defaults (`defaults`) with their
    pod-ready stage kept off pods labelled `RELOAD_LABEL`, and our reload stage with the
    run's delay. With a `broken` node, the new driver pod there (labelled "new") matches no
    stage and stays Pending for ever, while its old pods still come up."""
    found = dict(defaults)
    ready_name = next(
        (
            name
            for name, text in found.items()
            if yaml.safe_load(text)["metadata"]["name"] == "pod-ready"
        ),
        None,
    )
    if ready_name is None:
        raise ValueError("KWOK's pod-ready stage is not among the default stages")
    ready = yaml.safe_load(found[ready_name])
    expressions = ready["spec"].setdefault("selector", {}).setdefault("matchExpressions", [])
    expressions.append({"key": f'.metadata.labels["{RELOAD_LABEL}"]', "operator": "DoesNotExist"})
    found[ready_name] = yaml.safe_dump(ready, sort_keys=False)
    stage = yaml.safe_load(reload_stage)
    if stage.get("kind") != "Stage":
        raise ValueError("the reload stage is not a KWOK Stage")
    stage["spec"]["delay"] = {"durationMilliseconds": int(reload_seconds * 1000)}
    if broken is None:
        found["driver-reload.yaml"] = yaml.safe_dump(stage, sort_keys=False)
        return found
    healthy = json.loads(json.dumps(stage))
    healthy["spec"]["selector"]["matchExpressions"].append(
        {"key": ".spec.nodeName", "operator": "NotIn", "values": [broken]}
    )
    old_there = json.loads(json.dumps(stage))
    old_there["metadata"]["name"] = "driver-reload-broken-node"
    old_there["spec"]["selector"]["matchExpressions"] += [
        {"key": ".spec.nodeName", "operator": "In", "values": [broken]},
        {"key": f'.metadata.labels["{RELOAD_LABEL}"]', "operator": "NotIn", "values": ["new"]},
    ]
    found["driver-reload.yaml"] = yaml.safe_dump(healthy, sort_keys=False)
    found["driver-reload-broken-node.yaml"] = yaml.safe_dump(old_there, sort_keys=False)
    return found


@dataclass
class Side:
    """What one rollout of one side measured."""

    nodes: int
    done: int = 0
    makespan: float | None = None
    requests: Counter[tuple[str, str]] = field(default_factory=Counter)
    peak_rss_mb: float | None = None
    moved_after_kill: float | None = None
    in_flight_at_kill: int | None = None
    in_flight_kept: int | None = None

    @property
    def requests_per_node(self) -> float | None:
        return round(sum(self.requests.values()) / self.done, 2) if self.done else None


@dataclass(frozen=True)
class Row:
    """One line of the comparison: a figure for gpuop and upstream."""

    figure: str
    gpuop: float | str | None
    upstream: float | str | None
    compare: bool = True
    """Whether gpuop/upstream means anything (numbers of the same kind)."""

    @property
    def ratio(self) -> float | None:
        if not self.compare or isinstance(self.gpuop, str) or isinstance(self.upstream, str):
            return None
        return ratio(self.gpuop, self.upstream)


def table(rows: Sequence[Row]) -> str:
    """The "vs upstream" table in Markdown."""

    def cell(value: float | str | None) -> str:
        if value is None:
            return "not measured"
        return f"{value:g}" if isinstance(value, float | int) else str(value)

    lines = ["| figure | gpuop | upstream | gpuop/upstream |", "|---|---|---|---|"]
    for row in rows:
        shown = "" if row.ratio is None else f"{row.ratio:g}"
        lines.append(f"| {row.figure} | {cell(row.gpuop)} | {cell(row.upstream)} | {shown} |")
    return "\n".join(lines)


def comparison(
    size: Size,
    version: str,
    plain: dict[str, Side],
    killed: dict[str, Side] | None,
    broken: dict[str, Side] | None,
    slow: dict[str, Side] | None = None,
) -> dict[str, Any]:
    """The benchmark's JSON result from the runs' sides ("gpuop", "upstream")."""

    def both(
        runs: dict[str, Side] | None, pick: Callable[[Side], float | str | None]
    ) -> tuple[float | str | None, float | str | None]:
        if runs is None:
            return None, None
        return pick(runs["gpuop"]), pick(runs["upstream"])

    def of(done: int, total: int) -> str:
        return f"{done} of {total}"

    rows = [
        Row("makespan (s)", *both(plain, lambda s: s.makespan)),
        Row("API requests per upgraded node", *both(plain, lambda s: s.requests_per_node)),
        Row("peak controller memory (MB)", *both(plain, lambda s: s.peak_rss_mb)),
        Row(
            "kill: seconds until the rollout moves again",
            *both(killed, lambda s: s.moved_after_kill),
        ),
        Row(
            "kill: in-flight drains that finished",
            *both(
                killed,
                lambda s: (
                    None
                    if s.in_flight_at_kill is None
                    else of(s.in_flight_kept or 0, s.in_flight_at_kill)
                ),
            ),
            compare=False,
        ),
        Row("kill: makespan (s)", *both(killed, lambda s: s.makespan)),
        Row(
            "broken node: healthy nodes done",
            *both(broken, lambda s: of(s.done, s.nodes - 1)),
            compare=False,
        ),
        Row(
            "broken node: seconds until the healthy nodes were done",
            *both(broken, lambda s: s.makespan),
        ),
        Row("slow apiserver (+50 ms a request): makespan (s)", *both(slow, lambda s: s.makespan)),
    ]
    by_figure = {row.figure: row for row in rows}
    makespan = by_figure["makespan (s)"].ratio
    api = by_figure["API requests per upgraded node"].ratio
    moved = by_figure["kill: seconds until the rollout moves again"].gpuop
    result: dict[str, Any] = {
        "about": (
            f"gpuop against NVIDIA's k8s-operator-libs {version} (the GPU Operator's upgrade "
            f"state machine, tests/peer) on the same real control plane: {size.nodes} KWOK GPU "
            f"nodes, maxParallelUpgrades {size.max_parallel}, maxUnavailable 25%, GPU pod "
            f"deletion and drain enabled, a {size.reload_seconds:g} s driver reload on both "
            "sides. What favours upstream: its harness reads no ClusterPolicy, has no leader "
            "election and is started again at once after a kill; its validator pods are not "
            "restarted by the reload. What favours gpuop: its node agents are emulated on the "
            "bus (no driver pod to delete and recreate, no kubelet), and its driver steps "
            "other than the load are instant. gpuop runs the chart's pair of replicas and "
            "counts both; its standby takes over a killed leader when the leader's NATS "
            "presence (3 s) runs out, before the 15 s Lease would. Upstream's planned requeue "
            f"is {size.requeue_seconds:g} s (the GPU Operator's is 120 s; it watches no pods, "
            "so a node whose new driver pod became ready waits for that requeue)."
            + (
                ""
                if slow is not None
                else " The slow apiserver run was left out (quick mode without `--slow`)."
            )
            + "\n\n"
            + table(rows)
        ),
        "upstream_version": version,
        "nodes": size.nodes,
        "max_parallel": size.max_parallel,
        "reload_seconds": size.reload_seconds,
        "upstream_requeue_seconds": size.requeue_seconds,
        "makespan_ratio": makespan,
        "api_requests_ratio": api,
        "peak_memory_ratio": by_figure["peak controller memory (MB)"].ratio,
        "kill_seconds_to_move_gpuop": moved,
        "kill_seconds_to_move_upstream": by_figure[
            "kill: seconds until the rollout moves again"
        ].upstream,
        "kill_makespan_ratio": by_figure["kill: makespan (s)"].ratio,
        "broken_healthy_done_gpuop": by_figure["broken node: healthy nodes done"].gpuop,
        "broken_healthy_done_upstream": by_figure["broken node: healthy nodes done"].upstream,
        "broken_makespan_ratio": by_figure[
            "broken node: seconds until the healthy nodes were done"
        ].ratio,
        "slow_makespan_ratio": by_figure["slow apiserver (+50 ms a request): makespan (s)"].ratio,
    }
    result["targets"] = {
        "makespan_ratio": "<= 0.5",
        "api_requests_ratio": "<= 0.5",
        "kill_seconds_to_move_gpuop": "<= 5",
    }
    return result


# The runs.


@dataclass
class Scenario:
    size: Size
    kill: bool = False
    broken: str | None = None
    slow: bool = False
    """The controller reaches the apiserver through `SlowProxy`."""


KEEP: Path | None = None
"""Where runs keep their work directories (`--keep`, or the environment's
GPUOP_BENCH_KEEP, a new directory); temporary ones otherwise."""
SLOW_SECONDS = 0.05
SCENARIOS = ("kill", "broken", "slow")
"""The runs beyond the plain rollout, in the order of their priority."""


class SlowProxy:
    """A TCP proxy in front of the apiserver that holds every chunk a client sends for
    `delay` seconds before passing it on, so each request is answered that much later (TLS
    passes through untouched; answers and watch events flow back at once)."""

    def __init__(self, target_port: int, delay: float) -> None:
        self.target_port = target_port
        self.delay = delay
        self.port = 0
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> SlowProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        """Stop listening and end the connections still open (watches)."""
        if self._server is not None:
            self._server.close()
        for connection in self._connections:
            connection.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        upstream_writer: asyncio.StreamWriter | None = None
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                "127.0.0.1", self.target_port
            )
            await asyncio.gather(
                self._pump(reader, upstream_writer, self.delay),
                self._pump(upstream_reader, writer, 0.0),
                return_exceptions=True,
            )
        except (OSError, asyncio.CancelledError):
            pass  # the apiserver is gone, or the proxy stops: nothing to report
        finally:
            writer.close()
            if upstream_writer is not None:
                upstream_writer.close()
            self._connections.discard(task)

    @staticmethod
    async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter, delay: float) -> None:
        try:
            while data := await source.read(65536):
                if delay:
                    await asyncio.sleep(delay)
                sink.write(data)
                await sink.drain()
        finally:
            sink.close()


async def slowed(
    kubeconfig: Path, plane: ControlPlane, scenario: Scenario, exits: contextlib.AsyncExitStack
) -> Path:
    """`kubeconfig`, or in a slow scenario a copy through a `SlowProxy` that lives as long
    as `exits`."""
    if not scenario.slow:
        return kubeconfig
    proxy = await exits.enter_async_context(SlowProxy(plane.ports["apiserver"], SLOW_SECONDS))
    return through(kubeconfig, proxy)


def through(kubeconfig: Path, proxy: SlowProxy) -> Path:
    """A copy of `kubeconfig` whose server is `proxy` (same host, so the certificate holds)."""
    config = yaml.safe_load(kubeconfig.read_text(encoding="utf-8"))
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    slowed = kubeconfig.with_name("slow-" + kubeconfig.name)
    slowed.write_text(yaml.safe_dump(config), encoding="utf-8")
    return slowed


class Watched:
    """The controller processes of one side, their peak memory."""

    def __init__(self) -> None:
        self.pids: set[int] = set()
        self.peak_kb = 0

    def sample(self) -> None:
        for pid in list(self.pids):
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                self.pids.discard(pid)
                continue
            for line in status.splitlines():
                if line.startswith("VmHWM:"):
                    self.peak_kb = max(self.peak_kb, int(line.split()[1]))


NodeStates = dict[str, tuple[str | None, bool]]
"""node -> (upgrade state label, done)."""


async def follow(
    observe: Callable[[], Awaitable[NodeStates]],
    healthy: set[str],
    side: Side,
    watched: Watched,
    kill: Callable[[], Awaitable[None]] | None,
    timeout: float,
) -> None:
    """Poll until every healthy node is done (or `timeout`); SIGKILL the controller through
    `kill` once half are done. Fills in `side`."""
    began = time.monotonic()
    killed_at: float | None = None
    at_kill: dict[str, str | None] = {}
    in_flight: set[str] = set()
    last = ""
    while True:
        states = await observe()
        watched.sample()
        now = time.monotonic()
        done = {node for node, (_, finished) in states.items() if finished and node in healthy}
        side.done = len(done)
        line = " ".join(
            f"{s}={n}" for s, n in sorted(Counter(str(st) for st, _ in states.values()).items())
        )
        if line != last:
            print(f"  {now - began:6.1f}s done {len(done)}/{len(healthy)}: {line}", flush=True)
            last = line
        if kill is not None and killed_at is None and len(done) * 2 >= len(healthy):
            await kill()
            killed_at = time.monotonic()
            # the states the dead controller left (a write it had in flight may have landed)
            at_kill = {node: state for node, (state, _) in (await observe()).items()}
            in_flight = {node for node, state in at_kill.items() if state in DRAINING}
            side.in_flight_at_kill = len(in_flight)
            print(f"  killed the controller; {len(in_flight)} nodes in flight", flush=True)
        elif (
            killed_at is not None
            and side.moved_after_kill is None
            and any(states.get(node, (None, False))[0] != state for node, state in at_kill.items())
        ):
            side.moved_after_kill = round(now - killed_at, 2)
        if done >= healthy:
            side.makespan = round(now - began, 1)
            side.in_flight_kept = len(in_flight & done) if killed_at is not None else None
            break
        if now - began > timeout:
            side.in_flight_kept = len(in_flight & done) if killed_at is not None else None
            print(f"  gave up after {timeout:g} s", flush=True)
            break
        await asyncio.sleep(POLL_SECONDS)
    side.peak_rss_mb = round(watched.peak_kb / 1024, 1) if watched.peak_kb else None


def write_stages(directory: Path, reload_seconds: float, broken: str | None) -> Path:
    defaults = {
        path.name: path.read_text(encoding="utf-8") for path in sorted(STAGES.glob("*.yaml"))
    }
    if not defaults:
        raise SystemExit(f"no KWOK stages under {STAGES}: run `make cluster-tools`")
    directory.mkdir(parents=True)
    made = stage_set(defaults, RELOAD_STAGE.read_text(encoding="utf-8"), reload_seconds, broken)
    for name, text in made.items():
        (directory / name).write_text(text, encoding="utf-8")
    return directory


def nodes_and_labels(plane: ControlPlane, label: str) -> dict[str, str | None]:
    found = plane.call("GET", "/api/v1/nodes?labelSelector=nvidia.com%2Fgpu.present%3Dtrue")
    return {
        n["metadata"]["name"]: (n["metadata"].get("labels") or {}).get(label)
        for n in found["items"]
    }


# upstream


def driver_daemonset(tag: str, image: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": DRIVER_DAEMONSET, "labels": {"app": DRIVER_DAEMONSET}},
        "spec": {
            "selector": {"matchLabels": {"app": DRIVER_DAEMONSET}},
            "updateStrategy": {"type": "OnDelete"},
            "template": {
                "metadata": {"labels": {"app": DRIVER_DAEMONSET, RELOAD_LABEL: tag}},
                "spec": _driver_pod(image),
            },
        },
    }


def _driver_pod(image: str) -> dict[str, Any]:
    return {
        "nodeSelector": {"nvidia.com/gpu.deploy.driver": "true"},
        "tolerations": [{"operator": "Exists"}],
        "priorityClassName": "system-node-critical",
        "containers": [{"name": "nvidia-driver-ctr", "image": image}],
    }


def validator_daemonset() -> dict[str, Any]:
    labels = {"app": VALIDATOR_DAEMONSET, RELOAD_LABEL: "validator"}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": VALIDATOR_DAEMONSET, "labels": {"app": VALIDATOR_DAEMONSET}},
        "spec": {
            "selector": {"matchLabels": {"app": VALIDATOR_DAEMONSET}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.present": "true"},
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "validator", "image": "nvcr.io/nvidia/validator:v1"}],
                },
            },
        },
    }


def prepare_upstream(plane: ControlPlane, work: Path) -> Path:
    """Swap the fleet's driver DaemonSet for one that upgrades OnDelete and reloads in the
    reload time, add the validator, and make the harness's ServiceAccount; its kubeconfig."""
    sets = f"/apis/apps/v1/namespaces/{DRIVER_NAMESPACE}/daemonsets"
    plane.call("DELETE", f"{sets}/{DRIVER_DAEMONSET}", {"propagationPolicy": "Foreground"})
    deadline = time.monotonic() + 60
    while plane.request(f"{sets}/{DRIVER_DAEMONSET}")[0] != 404:
        if time.monotonic() > deadline:
            raise RuntimeError("the fleet's driver DaemonSet was not deleted within 60 s")
        time.sleep(0.2)
    plane.call("POST", sets, driver_daemonset("old", f"nvcr.io/nvidia/driver:{OLD}"))
    plane.call("POST", sets, validator_daemonset())
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": UPSTREAM_ACCOUNT}}
    plane.call("POST", f"/api/v1/namespaces/{DRIVER_NAMESPACE}/serviceaccounts", account)
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": UPSTREAM_ACCOUNT},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "cluster-admin",
        },
        "subjects": [
            {"kind": "ServiceAccount", "name": UPSTREAM_ACCOUNT, "namespace": DRIVER_NAMESPACE}
        ],
    }
    plane.call("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
               "spec": {"expirationSeconds": 7200}}  # fmt: skip
    answer = plane.call(
        "POST",
        f"/api/v1/namespaces/{DRIVER_NAMESPACE}/serviceaccounts/{UPSTREAM_ACCOUNT}/token",
        request,
    )
    return plane.write_token_kubeconfig(
        work / "upstream.kubeconfig", UPSTREAM_USER, answer["status"]["token"]
    )


def upstream_policy(size: Size) -> dict[str, Any]:
    """The library's DriverUpgradePolicySpec: the GPU Operator's Helm defaults with drain
    enabled and emptyDir allowed (the workloads use emptyDir volumes)."""
    return {
        "autoUpgrade": True,
        "maxParallelUpgrades": size.max_parallel,
        "maxUnavailable": "25%",
        "waitForCompletion": {"timeoutSeconds": 0, "podSelector": ""},
        "podDeletion": {"force": False, "timeoutSeconds": 300, "deleteEmptyDir": True},
        "drain": {"enable": True, "force": False, "podSelector": "", "timeoutSeconds": 300,
                  "deleteEmptyDir": True},
    }  # fmt: skip


def upstream_states(plane: ControlPlane, broken: str | None) -> NodeStates:
    labels = nodes_and_labels(plane, UPSTREAM_STATE_LABEL)
    pods = plane.call(
        "GET", f"/api/v1/namespaces/{DRIVER_NAMESPACE}/pods?labelSelector=app%3D{DRIVER_DAEMONSET}"
    )
    fresh = set()
    for pod in pods["items"]:
        conditions = (pod.get("status") or {}).get("conditions") or []
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
        new = (pod["metadata"].get("labels") or {}).get(RELOAD_LABEL) == "new"
        if ready and new and not pod["metadata"].get("deletionTimestamp"):
            fresh.add(pod["spec"].get("nodeName"))
    return {node: (state, state == DONE and node in fresh) for node, state in labels.items()}


async def run_upstream(scenario: Scenario, work: Path, side: Side) -> None:
    async with contextlib.AsyncExitStack() as exits:
        await _run_upstream(scenario, work, side, exits)


async def _run_upstream(
    scenario: Scenario, work: Path, side: Side, exits: contextlib.AsyncExitStack
) -> None:
    size = scenario.size
    stages = write_stages(work / "stages", size.reload_seconds, scenario.broken)
    with ControlPlane(work / "plane", stages=stages) as plane:
        async with await client.connect(plane.admin_kubeconfig) as admin:
            await KwokFleet(admin, size.nodes, GPUS, prefix="gpu-node-", seed=5).create()
        kubeconfig = await asyncio.to_thread(prepare_upstream, plane, work)
        kubeconfig = await slowed(kubeconfig, plane, scenario, exits)
        policy = work / "policy.json"
        policy.write_text(json.dumps(upstream_policy(size)), encoding="utf-8")
        arguments = [str(HARNESS), "--kubeconfig", str(kubeconfig), "--policy", str(policy),
                     "--requeue", f"{size.requeue_seconds:g}s"]  # fmt: skip
        watched = Watched()
        processes: list[asyncio.subprocess.Process] = []
        log = work / "upstream.log"

        async def start() -> None:
            with log.open("ab") as output:
                process = await asyncio.create_subprocess_exec(
                    *exiting_with_parent(arguments), stdout=output, stderr=output
                )
            processes.append(process)
            watched.pids.add(process.pid)

        async def kill() -> None:
            processes[-1].send_signal(signal.SIGKILL)
            await processes[-1].wait()
            await start()  # as at once as a restart gets

        await start()
        try:
            deadline = time.monotonic() + 180
            while set(nodes_and_labels(plane, UPSTREAM_STATE_LABEL).values()) != {DONE}:
                if time.monotonic() > deadline or processes[-1].returncode is not None:
                    raise RuntimeError(f"the harness never marked every node done:\n{_tail(log)}")
                await asyncio.sleep(0.5)
            start_time = datetime.datetime.now(datetime.UTC)
            container = {"name": "nvidia-driver-ctr", "image": f"nvcr.io/nvidia/driver:{NEW}"}
            new_template = {"spec": {"template": {
                "metadata": {"labels": {RELOAD_LABEL: "new"}},
                "spec": {"containers": [container]},
            }}}  # fmt: skip
            path = f"/apis/apps/v1/namespaces/{DRIVER_NAMESPACE}/daemonsets/{DRIVER_DAEMONSET}"
            plane.call("PATCH", path, new_template, content_type="application/merge-patch+json")
            healthy = set(nodes_and_labels(plane, UPSTREAM_STATE_LABEL)) - {scenario.broken or ""}
            await follow(
                lambda: asyncio.to_thread(upstream_states, plane, scenario.broken),
                healthy, side, watched, kill if scenario.kill else None, size.timeout_seconds,
            )  # fmt: skip
            end_time = datetime.datetime.now(datetime.UTC)
        finally:
            for process in processes:
                if process.returncode is None:
                    process.send_signal(signal.SIGTERM)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(process.wait(), 15)
                if process.returncode is None:
                    process.kill()
                    await process.wait()
        side.requests = requests_by_user(plane.audit_events(), UPSTREAM_USER, start_time, end_time)


# gpuop


class ReloadingFleet(Fleet):
    """The emulated node agents, whose GPU driver load takes the reload time; on the broken
    node it never ends."""

    def __init__(
        self, config: FleetConfig, bus: NatsBus, reload_seconds: float, broken: str | None
    ):
        super().__init__(config, bus, template_inventory(config))
        self.reload_seconds = reload_seconds
        self.broken = broken
        self._loading: set[asyncio.Task[None]] = set()

    def driver(self, node: str) -> str | None:
        return self._nodes[node].driver_version

    async def on_command(self, delivery: Any) -> None:
        payload, node = delivery.payload, delivery.envelope.node
        if isinstance(payload, driver.LoadDriver) and payload.component is driver.Component.GPU:
            if node == self.broken:
                return  # its driver never comes up
            task = asyncio.create_task(self._load_later(delivery))
            self._loading.add(task)
            task.add_done_callback(self._loading.discard)
            return
        await super().on_command(delivery)

    async def _load_later(self, delivery: Any) -> None:
        await asyncio.sleep(self.reload_seconds)
        await Fleet.on_command(self, delivery)


def gpuop_policy(size: Size) -> dict[str, Any]:
    """The same policy as upstream's, as a GPUClusterPolicy."""
    return {
        "apiVersion": specs.API_VERSION,
        "kind": specs.KIND,
        "metadata": {"name": "default"},
        "spec": {
            "driver": {
                "gpu": {"version": NEW, "source": "/srv/drivers", "publicKeys": [keys.PUBLIC_KEY]}
            },
            "upgradePolicy": {
                "maxParallelUpgrades": size.max_parallel,
                "maxUnavailable": "25%",
                "podDeletion": {"force": False, "deleteEmptyDir": True, "timeoutSeconds": 300},
                "drain": {
                    "enable": True,
                    "force": False,
                    "deleteEmptyDir": True,
                    "timeoutSeconds": 300,
                },
            },
        },
    }


def leader(logs: dict[str, Path]) -> str | None:
    """The replica whose last word on the lease is that it leads."""
    for name, log in logs.items():
        said = [line for line in log.read_text(errors="replace").splitlines()
                if "leading as" in line or "lost the lease" in line]  # fmt: skip
        if said and "leading as" in said[-1]:
            return name
    return None


async def run_gpuop(scenario: Scenario, work: Path, side: Side) -> None:
    async with contextlib.AsyncExitStack() as exits:
        await _run_gpuop(scenario, work, side, exits)


async def _run_gpuop(
    scenario: Scenario, work: Path, side: Side, exits: contextlib.AsyncExitStack
) -> None:
    size = scenario.size
    stages = write_stages(work / "stages", size.reload_seconds, scenario.broken)
    with ControlPlane(work / "plane", stages=stages) as plane:
        async with await client.connect(plane.admin_kubeconfig) as admin:
            made = KwokFleet(admin, size.nodes, GPUS, prefix="gpu-node-", seed=5)
            await made.create()
        await asyncio.to_thread(chart.install_chart, plane)
        kubeconfig = await asyncio.to_thread(
            chart.service_account_kubeconfig,
            plane,
            "upgrade-orchestrator",
            work / "orchestrator.kubeconfig",
        )
        kubeconfig = await slowed(kubeconfig, plane, scenario, exits)
        config = work / "orchestrator.yaml"
        config.write_text(f"lease_namespace: {chart.RELEASE_NAMESPACE}\n", encoding="utf-8")
        async with NatsServer(work / "nats") as nats:
            replicas: dict[str, asyncio.subprocess.Process] = {}
            logs: dict[str, Path] = {}
            watched = Watched()
            arguments = ["upgrade-orchestrator", "--role", "cluster", "--nats", nats.url,
                         "--kubeconfig", str(kubeconfig), "--config", str(config)]  # fmt: skip
            for index in (1, 2):
                name = f"orchestrator-{index}"
                logs[name] = work / f"{name}.log"
                replicas[name] = await start_service(arguments, logs[name])
                watched.pids.add(replicas[name].pid)
            bus = NatsBus(nats.url, name="vs-upstream-fleet")
            await bus.start()
            stopping = asyncio.Event()
            emulated = [
                FleetNode(name=node, boot_id=made.machine(node).boot_id,
                          product_name=made.machine(node).type.name)
                for node in made.node_names
            ]  # fmt: skip
            fleet = ReloadingFleet(
                FleetConfig(nats_url=nats.url, work=work / "fleet", gpus=GPUS, driver_version=OLD,
                            emulated=emulated, sample_nodes=[], heartbeat_seconds=10.0,
                            health_events_per_second=1e-6, recover_after=1),
                bus, size.reload_seconds, scenario.broken,
            )  # fmt: skip
            running: asyncio.Task[None] | None = None
            try:
                deadline = time.monotonic() + 120
                while leader(logs) is None:
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            "no orchestrator replica leads:\n" + _tail(*logs.values())
                        )
                    await asyncio.sleep(0.25)
                await fleet.start()
                running = asyncio.create_task(fleet.run(stopping))
                async with await client.connect(plane.admin_kubeconfig) as admin:
                    start_time = datetime.datetime.now(datetime.UTC)
                    await _create_policy(admin, gpuop_policy(size))

                async def kill() -> None:
                    name = leader(logs)
                    if name is None:
                        raise RuntimeError("no replica leads at the kill")
                    replicas[name].send_signal(signal.SIGKILL)
                    await replicas[name].wait()

                def states() -> NodeStates:
                    labels = nodes_and_labels(plane, STATE_LABEL)
                    return {node: (state, state == DONE and fleet.driver(node) == NEW)
                            for node, state in labels.items()}  # fmt: skip

                healthy = set(made.node_names) - {scenario.broken or ""}
                await follow(
                    lambda: asyncio.to_thread(states), healthy, side, watched,
                    kill if scenario.kill else None, size.timeout_seconds,
                )  # fmt: skip
                end_time = datetime.datetime.now(datetime.UTC)
            finally:
                for process in replicas.values():
                    if process.returncode is None:
                        process.send_signal(signal.SIGTERM)
                for process in replicas.values():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(process.wait(), 30)
                    if process.returncode is None:
                        process.kill()
                        await process.wait()
                stopping.set()
                if running is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(running, 10)
                await bus.close()
        side.requests = requests_by_user(plane.audit_events(), GPUOP_USER, start_time, end_time)


async def _create_policy(kube: client.Kube, policy: dict[str, Any]) -> None:
    for _ in range(100):  # the chart's CRD is served a moment after Helm made it
        try:
            await customobjects.create(kube, customobjects.GPU_CLUSTER_POLICIES, policy)
            return
        except kubeerrors.NotFound:
            await asyncio.sleep(0.1)
    raise RuntimeError("the GPUClusterPolicy CRD was never served")


def _tail(*logs: Path, keep: int = 3000) -> str:
    return "\n".join(
        f"--- {log.name}\n{log.read_text(errors='replace')[-keep:]}" for log in logs if log.exists()
    )


async def both_sides(scenario: Scenario, label: str) -> dict[str, Side]:
    """One scenario on each side, each on a fresh plane; gpuop's first."""
    sides = {"gpuop": Side(scenario.size.nodes), "upstream": Side(scenario.size.nodes)}
    for name, runner in (("gpuop", run_gpuop), ("upstream", run_upstream)):
        print(f"{label}: {name}", flush=True)
        if KEEP is not None:  # the logs stay for a look
            work = KEEP / f"{label}-{name}"
            work.mkdir(parents=True)
            await runner(scenario, work, sides[name])
        else:
            with tempfile.TemporaryDirectory(prefix=f"gpuop-vs-{name}-") as tmp:
                await runner(scenario, Path(tmp), sides[name])
        side = sides[name]
        total = sum(side.requests.values())
        print(f"{label}: {name}: {side.done} done, makespan {side.makespan} s, "
              f"{total} requests, peak {side.peak_rss_mb} MB", flush=True)  # fmt: skip
        for (verb, resource), count in side.requests.most_common(8):
            print(f"    {verb} {resource}: {count}", flush=True)
    return sides


def harness_version() -> str:
    go_mod = (ROOT / "tests" / "peer" / "go.mod").read_text(encoding="utf-8")
    for line in go_mod.splitlines():
        parts = line.split()
        if parts[:1] == ["github.com/NVIDIA/k8s-operator-libs"]:
            return parts[1]
    return "unknown"


async def measure(size: Size, figures: set[str]) -> dict[str, Any]:
    if not HARNESS.exists():
        raise SystemExit(f"no {HARNESS.relative_to(ROOT)}: run `make peer-tools`")
    plain = await both_sides(Scenario(size), "plain")
    killed = await both_sides(Scenario(size, kill=True), "kill") if "kill" in figures else None
    broken = None
    if "broken" in figures:
        broken = await both_sides(Scenario(size, broken="gpu-node-1"), "broken")
    slow = await both_sides(Scenario(size, slow=True), "slow") if "slow" in figures else None
    return comparison(size, harness_version(), plain, killed, broken, slow)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--quick", action="store_true", help="20 nodes, maxParallel 5, a 5 s reload"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="4 nodes, the plain rollout only: does it still run"
    )
    parser.add_argument("--only", nargs="*", choices=SCENARIOS, default=None,
                        help="of the scenarios beyond the plain rollout, only these (by "
                        "default all; quick leaves out slow without --slow)")  # fmt: skip
    parser.add_argument("--slow", action="store_true",
                        help="with --quick, run the slow apiserver scenario too (it takes a "
                        "quick run past ten minutes)")  # fmt: skip
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR",
                        help="run in DIR (new) and keep every log there")  # fmt: skip
    args = parser.parse_args(argv)
    global KEEP
    keep = args.keep or (
        Path(os.environ["GPUOP_BENCH_KEEP"]) if "GPUOP_BENCH_KEEP" in os.environ else None
    )
    if keep is not None:
        keep.mkdir(parents=True)
        KEEP = keep
    default = set(SCENARIOS) - ({"slow"} if args.quick and not args.slow else set())
    figures = default if args.only is None else set(args.only)
    if args.smoke:
        figures = set()
    result = asyncio.run(measure(SMOKE_SIZE if args.smoke else SIZES[args.quick], figures))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
