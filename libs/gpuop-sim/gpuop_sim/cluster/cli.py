"""``gpuop sim apiserver``: run the simulated cluster, or a bare API server, in the foreground.

The CLI command (``gpuop_sim.cli.sim``) awaits :func:`run_cluster`, which starts a
:class:`~gpuop_sim.cluster.cluster.SimCluster` (API server, GPU nodes, kubelets, workloads), seeds
it with any manifests given, writes a kubeconfig for clients, and serves until cancelled
(Ctrl-C, SIGTERM or the demo shutting down). :func:`run_apiserver` does the same with an
API server alone. Every other gpuop process then reaches it through that kubeconfig. Both
take a :class:`~gpuop_sim.apiserver.faults.FaultPlan` for a server that fails on purpose.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml

from gpuop_sim.apiserver.faults import FaultPlan
from gpuop_sim.apiserver.server import ApiServer
from gpuop_sim.cluster.cluster import SimCluster

logger = logging.getLogger(__name__)


def load_manifests(paths: Sequence[Path]) -> list[dict[str, object]]:
    """Every object in the given YAML files (multi-document, ``List`` kinds expanded)."""
    objects: list[dict[str, object]] = []
    for path in paths:
        for document in yaml.safe_load_all(path.read_text()):
            if not isinstance(document, dict):
                continue
            if str(document.get("kind", "")).endswith("List") and "items" in document:
                objects.extend(item for item in document["items"] if isinstance(item, dict))
            else:
                objects.append(document)
    return objects


async def run_apiserver(
    kubeconfig_out: Path,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    kubelet_delay: float | None = 0.0,
    manifests: Sequence[Path] = (),
    faults: FaultPlan | None = None,
    on_ready: Callable[[ApiServer], None] | None = None,
) -> None:
    """Serve until cancelled. ``on_ready`` is called once the kubeconfig is written."""
    objects = load_manifests(manifests)
    async with ApiServer(
        host=host, port=port, kubelet_delay=kubelet_delay, faults=faults
    ) as server:
        for obj in objects:
            server.seed(obj)
        server.write_kubeconfig(kubeconfig_out)
        logger.info("simulated API server at %s, kubeconfig %s", server.url, kubeconfig_out)
        if on_ready is not None:
            on_ready(server)
        await asyncio.Event().wait()


async def run_cluster(
    kubeconfig_out: Path,
    *,
    nodes: int,
    gpus: int,
    workloads: bool = True,
    host: str = "127.0.0.1",
    port: int = 0,
    seed: int = 0,
    start_delay: float = 0.5,
    termination_cap: float = 2.0,
    anonymous_auth: bool = True,
    manifests: Sequence[Path] = (),
    faults: FaultPlan | None = None,
    on_ready: Callable[[SimCluster], None] | None = None,
) -> None:
    """Serve a simulated cluster until cancelled; ``on_ready`` is called once the
    kubeconfig is written. The delays default to what a person can watch happen, and
    requests without credentials are served by default, for tools given no kubeconfig
    (kubectl and the clients given the kubeconfig send its bearer token over TLS)."""
    objects = load_manifests(manifests)
    async with SimCluster(
        nodes,
        gpus,
        workloads=workloads,
        host=host,
        port=port,
        seed=seed,
        start_delay=start_delay,
        termination_cap=termination_cap,
        anonymous_auth=anonymous_auth,
        faults=faults,
    ) as cluster:
        for obj in objects:
            cluster.server.seed(obj)
        cluster.write_kubeconfig(kubeconfig_out)
        logger.info("simulated cluster at %s, kubeconfig %s", cluster.url, kubeconfig_out)
        if on_ready is not None:
            on_ready(cluster)
        await asyncio.Event().wait()
