"""What discovery, telemetry and the device plugin do on a node whose driver is not loaded
yet, with one NVML backend: run as `python -m tests.support.nvml_probe real|sim HOST_DIR`,
it prints one JSON document (`Findings`). The slow suite runs it with `real` in a process
whose `LD_LIBRARY_PATH` holds NVIDIA's real `libnvidia-ml.so.1` (`nvml_library`), and with
`sim` (the simulated NVML of a host root with no GPU driver), and compares the two.

Each service runs as its node role builds it (`NodeAgent`, `NodeExporter`, `DevicePlugins`
behind the simulated kubelet), on the in-memory bus, for long enough to retry NVML a few
times; warnings and errors they log are collected.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from gpuop.bus import InMemoryBus
from gpuop.host.roots import HostRoot
from gpuop.nvml import Nvml, NvmlError
from gpuop.nvml.real import PynvmlBackend
from gpuop.services.discovery.config import DiscoveryConfig
from gpuop.services.discovery.node_agent import NodeAgent as DiscoveryAgent
from gpuop.services.telemetry.config import TelemetryConfig
from gpuop.services.telemetry.node_exporter import NodeExporter
from gpuop_sim.cluster import hosts
from tests.support.kubelet_plugin import NODE, running_node, sim_nvml

GPUS = 8
BOOT_ID = "4b7f3f0e-6a52-4a5e-9d55-2f1e0d9c8a11"
RETRY_SECONDS = 0.1
RUN_SECONDS = 0.6
"""How long each service runs: several NVML retries at `RETRY_SECONDS`."""

Findings = dict[str, Any]


class Collected(logging.Handler):
    """The warnings and errors logged while it is installed."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}")


def host_without_driver(directory: Path) -> HostRoot:
    """A node with 8 H200s on its PCI bus and no GPU driver installed or loaded."""
    return hosts.build_host_root(directory, NODE, GPUS, gpu_version=None, boot_id=BOOT_ID)


def backend(kind: str, root: HostRoot) -> Nvml:
    return PynvmlBackend() if kind == "real" else sim_nvml(root, GPUS)


def init_error(nvml: Nvml) -> Findings:
    try:
        nvml.init()
    except NvmlError as error:
        return {"type": type(error).__name__, "code": error.code, "message": str(error)}
    nvml.shutdown()
    return {"type": None}


async def discovery(root: HostRoot, nvml: Nvml) -> Findings:
    readiness: list[tuple[bool, str]] = []
    config = DiscoveryConfig(
        scan_interval_seconds=RETRY_SECONDS,
        heartbeat_interval_seconds=3600,
        retry_interval_seconds=RETRY_SECONDS,
    )
    bus = InMemoryBus()
    await bus.start()
    try:
        agent = DiscoveryAgent(
            bus, NODE, root, nvml, config, readiness=lambda r, why: readiness.append((r, why))
        )
        stopping = asyncio.Event()
        task = asyncio.create_task(agent.run(stopping))
        await asyncio.sleep(RUN_SECONDS)
        stopping.set()
        await asyncio.wait_for(task, 10)
        published = agent.published
        assert published is not None, "discovery published no inventory"
        return {
            "readiness": readiness,
            "gpus": len(published.gpus),
            "driver_version": published.driver_version,
            "pci_functions": len(published.pci_functions),
            "inventory_hash": published.inventory_hash,
        }
    finally:
        await bus.close()


async def telemetry(nvml: Nvml) -> Findings:
    readiness: list[tuple[bool, str]] = []
    registry = CollectorRegistry()
    config = TelemetryConfig(
        interval_seconds=3600,
        slow_interval_seconds=3600,
        pods_interval_seconds=3600,
        retry_interval_seconds=RETRY_SECONDS,
    )
    bus = InMemoryBus()
    await bus.start()
    try:
        exporter = NodeExporter(
            bus,
            NODE,
            nvml,
            config,
            registry,
            readiness=lambda r, why: readiness.append((r, why)),
        )
        stopping = asyncio.Event()
        task = asyncio.create_task(exporter.run(stopping))
        await asyncio.sleep(RUN_SECONDS)
        stopping.set()
        await asyncio.wait_for(task, 10)
        opens = registry.get_sample_value("gpuop_telemetry_nvml_errors_total", {"query": "open"})
        return {
            "readiness": readiness,
            "failed_opens": int(opens or 0),
            "exposition_bytes": len(exporter.exposition()),
            "session_open": exporter.session.inventory is not None,
        }
    finally:
        await bus.close()


async def device_plugin(root: HostRoot, nvml: Nvml) -> Findings:
    async with running_node(root, nvml=nvml) as node:
        await node.wait_readiness(False, "NVML")
        await asyncio.sleep(RUN_SECONDS)
        return {
            "readiness": node.readiness[-1],
            "registrations": sorted(r.resource_name for r in node.kubelet.registrations),
            "session_open": node.plugins.gpu_session_open,
        }


async def probe(kind: str, directory: Path) -> Findings:
    collected = Collected()
    logging.getLogger().addHandler(collected)
    root = host_without_driver(directory)
    findings: Findings = {"backend": kind, "init": init_error(backend(kind, root))}
    findings["discovery"] = await discovery(root, backend(kind, root))
    findings["telemetry"] = await telemetry(backend(kind, root))
    findings["device_plugin"] = await device_plugin(root, backend(kind, root))
    findings["logged"] = collected.lines
    findings["library"] = loaded_library()
    findings["device_nodes"] = device_nodes()
    return findings


def device_nodes() -> list[str]:
    """The NVIDIA device nodes in this process's `/dev`."""
    return sorted(p.name for p in Path("/dev").glob("nvidia*"))


def loaded_library() -> str | None:
    """The NVML library this process mapped, from `/proc/self/maps`; None when none."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split(maxsplit=5)[-1]
        if "libnvidia-ml.so" in path:
            return path
    return None


def main(argv: list[str]) -> int:
    kind, directory = argv
    if kind not in ("real", "sim"):
        raise SystemExit(f"usage: python -m tests.support.nvml_probe real|sim HOST_DIR, not {kind}")
    print(json.dumps(asyncio.run(probe(kind, Path(directory)))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
