"""`gpuop discover`: one node's inventory and the labels it implies, without NATS or
Kubernetes; the admin's first look at a node.

Runs the same scan as discovery's node role (`gpuop.inventory.scanning`) and the same label
derivation as its cluster role (`gpuop.inventory.labeling`), so what it prints is what the
service would publish and label. A table for people by default; with `--json` one JSON
object, `{"inventory": ..., "labels": ...}`, for tools.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuop.cli import nodes
from gpuop.events.hardware import HardwareDiscovered
from gpuop.host.errors import HostError
from gpuop.host.roots import HostRoot
from gpuop.inventory import labeling, scanning
from gpuop.nvml import NvmlError


def add_parser(verbs: Any) -> None:
    discover: argparse.ArgumentParser = verbs.add_parser(
        "discover",
        help="print this node's inventory and the labels it implies",
        description="Scan a host root and NVML once; print the inventory and its node labels.",
    )
    nodes.add_host_root(discover)
    nodes.add_nvml(discover)
    discover.add_argument("--json", action="store_true", help="one JSON object")
    discover.set_defaults(handler=discover_node)


async def discover_node(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    # one scan, all file reads and NVML calls: nothing else runs on the loop meanwhile
    return await asyncio.to_thread(discover_once, args, environ)


def discover_once(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    host_root = nodes.host_root(args, environ)
    nvml = nodes.open_nvml(args, environ, host_root, "gpuop-discover")
    try:
        inventory = scanning.scan(HostRoot(host_root), nvml)
    except (HostError, NvmlError) as error:
        print(f"gpuop discover: {error}", file=sys.stderr)
        return 1
    labels = dict(sorted(labeling.labels_for(inventory).items()))
    if args.json:
        document = {"inventory": inventory.model_dump(mode="json"), "labels": labels}
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    else:
        sys.stdout.write(render(inventory, labels, host_root))
    return 0


def render(inventory: HardwareDiscovered, labels: Mapping[str, str], host_root: Path) -> str:
    """The inventory and labels as tables for a terminal."""
    os_name = " ".join(filter(None, (inventory.os_id, inventory.os_version_id))) or "-"
    driver = inventory.driver_version or "not loaded"
    if inventory.cuda_driver_version:
        driver += f" (CUDA {inventory.cuda_driver_version})"
    lines = [
        f"Node inventory from {host_root}",
        *_pairs(
            [
                ("kernel", f"{inventory.kernel_release} ({inventory.machine})"),
                ("os", os_name),
                ("product", inventory.product_name or "-"),
                ("boot id", _boot_id(inventory.boot_id)),
                ("gpu driver", driver),
                ("ofed driver", inventory.ofed_version or "-"),
                ("modules", ", ".join(inventory.modules_loaded) or "-"),
                ("hash", inventory.inventory_hash),
            ]
        ),
        "",
        f"GPUs ({len(inventory.gpus)})",
        *_table(
            ("INDEX", "UUID", "PCI", "NAME", "MEMORY MiB", "CC", "MIG", "NUMA"),
            [
                (
                    str(gpu.index),
                    gpu.uuid,
                    gpu.pci_bus_id,
                    gpu.model_name,
                    str(gpu.memory_bytes // 2**20),
                    gpu.compute_capability,
                    gpu.mig_mode,
                    _optional(gpu.numa_node),
                )
                for gpu in inventory.gpus
            ],
        ),
        "",
        f"PCI functions ({len(inventory.pci_functions)})",
        *_table(
            ("ADDRESS", "VENDOR:DEVICE", "CLASS", "DRIVER", "NUMA", "LINK"),
            [
                (
                    function.address,
                    f"{function.vendor_id}:{function.device_id}",
                    function.class_id,
                    function.driver or "-",
                    _optional(function.numa_node),
                    _link(function.link_speed_gts, function.link_width),
                )
                for function in inventory.pci_functions
            ],
        ),
        "",
        f"Container runtimes ({len(inventory.container_runtimes)})",
        *_table(
            ("RUNTIME", "VERSION", "NVIDIA HANDLER", "CONFIG"),
            [
                (
                    runtime.name,
                    runtime.version or "-",
                    "yes" if runtime.nvidia_handler else "no",
                    runtime.config_error or "ok",
                )
                for runtime in inventory.container_runtimes
            ],
        ),
        "",
        f"CDI specs ({len(inventory.cdi_specs)})",
        *_table(
            ("PATH", "CDI VERSION", "DEVICES", "STATE"),
            [
                (spec.path, spec.cdi_version or "-", str(spec.device_count), spec.error or "valid")
                for spec in inventory.cdi_specs
            ],
        ),
        "",
        f"Labels ({len(labels)})",
        *(f"  {key}={value}" for key, value in labels.items()),
    ]
    return "\n".join(lines) + "\n"


def _pairs(rows: list[tuple[str, str]]) -> list[str]:
    width = max(len(name) for name, _ in rows)
    return [f"  {name.ljust(width)}  {value}" for name, value in rows]


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    if not rows:
        return ["  (none)"]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    return [
        ("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))).rstrip()
        for row in (header, *rows)
    ]


def _boot_id(boot_id: str) -> str:
    if boot_id == scanning.UNKNOWN_BOOT_ID:
        return "unknown (the host root has no proc/sys/kernel/random/boot_id)"
    return boot_id


def _optional(value: int | None) -> str:
    return "-" if value is None else str(value)


def _link(speed: float | None, width: int | None) -> str:
    if speed is None and width is None:
        return "-"
    shown = "-" if speed is None else f"{speed:g}"
    return f"{shown} GT/s x{_optional(width)}"
