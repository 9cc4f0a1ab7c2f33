"""Helpers for the bundled cluster's NATS configuration in real nats-servers on loopback
(tests/integration/deploy/test_nats_cluster.py and the callout-mode cluster test): free route
ports, each server's files with its addresses rewritten, and waiting until the servers form
one JetStream cluster."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import aiohttp

from tests.support.shipped_nats import loopback_config, rewrite


def free_ports(count: int) -> list[int]:
    """`count` distinct ports that nothing listens on now: each route names its peer's port,
    so the ports are needed before the servers start."""
    probes = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def cluster_files(
    files: dict[str, str], workdir: Path, tls: Path, route_port: int, routes: dict[str, str]
) -> dict[str, str]:
    """The ConfigMap's files for one server whose routes listen on `route_port`, with the
    servers' names in routes.conf replaced as `routes` says."""
    return {
        **files,
        "nats-server.conf": loopback_config(
            files["nats-server.conf"], store=workdir / "jetstream", tls=tls
        ),
        "cluster.conf": rewrite(
            files["cluster.conf"],
            {
                "listen: 0.0.0.0:6222": f"listen: 127.0.0.1:{route_port}",
                '"/etc/nats/tls/tls.crt"': f'"{tls / "tls.crt"}"',
                '"/etc/nats/tls/tls.key"': f'"{tls / "tls.key"}"',
                '"/etc/nats/tls/ca.crt"': f'"{tls / "ca.crt"}"',
            },
            name="deploy/nats/cluster.conf",
        ),
        "routes.conf": rewrite(files["routes.conf"], routes, name="the chart's routes.conf"),
    }


async def monitoring(session: aiohttp.ClientSession, url: str, endpoint: str) -> Any:
    async with session.get(f"{url}/{endpoint}") as response:
        response.raise_for_status()
        return await response.json()


async def formed(monitors: dict[str, str], timeout: float = 20.0) -> dict[str, Any]:
    """Wait until every server routes to all the others and all agree on one JetStream meta
    leader of a cluster of them all; each server's /jsz then."""
    names = set(monitors)
    jsz: dict[str, Any] = {}
    async with aiohttp.ClientSession() as session:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            routed, jsz = {}, {}
            for name, url in monitors.items():
                routez = await monitoring(session, url, "routez")
                routed[name] = {route["remote_name"] for route in routez["routes"]}
                jsz[name] = await monitoring(session, url, "jsz")
            leaders = {info.get("meta_cluster", {}).get("leader") for info in jsz.values()}
            sizes = {info.get("meta_cluster", {}).get("cluster_size") for info in jsz.values()}
            if (
                all(routed[name] == names - {name} for name in names)
                and len(leaders) == 1
                and leaders <= names
                and sizes == {len(names)}
            ):
                return jsz
            if loop.time() > deadline:
                raise AssertionError(f"no cluster within {timeout} s: routes {routed}, {jsz}")
            await asyncio.sleep(0.1)
