"""The CDI spec that gives the `cdi` device list strategy's names their meaning.

Under the `cdi` strategy Allocate answers with CDI device names
(`k8s.device-plugin.nvidia.com/gpu=<uuid>`, the kind NVIDIA's plugin uses in `cdi-cri`
mode); the container runtime resolves them through a spec file. `write_spec` keeps that
file at `<host root>/var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json`, rewritten
atomically (a runtime never reads half a file) by `plugins.DevicePlugins` whenever it
reads the inventory, and removed when the node has no GPU. Every GPU and MIG device is
named by its UUID; the control device nodes the host has go to the spec-wide edits, with
`NVIDIA_VISIBLE_DEVICES=void` so the legacy runtime hook injects nothing a second time.
Device nodes the host root has carry their type and numbers (`gpuop.host.cdi.node_edit`).
Spec version 0.5.0 covers every field used (the CDI specification, SPEC.md).

This spec has device nodes only: the plugin's pod mounts neither the driver's user space nor
its package's manifest. Where the node has the complete spec the driver-manager writes
(`gpuop.host.cdi`, kind `nvidia.com/gpu`, with the driver's files), Allocate names its
devices instead (`allocating`), and this one serves the devices it lacks (MIG devices made
since the driver's load).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuop.host import cdi as host_cdi
from gpuop.host.files import write_atomic
from gpuop.host.roots import HostRoot
from gpuop.kubelet import constants
from gpuop.services.device_plugin.inventory import GpuInventory, Target

KIND = "k8s.device-plugin.nvidia.com/gpu"
"""Vendor and class of every device in the spec."""
SPEC_VERSION = "0.5.0"
"""The lowest CDI version that covers the fields used."""
SPEC_FILE = "k8s.device-plugin.nvidia.com-gpu.json"
"""The spec's file name in the CDI spec directory."""


def qualified_name(target: Target) -> str:
    """The fully qualified CDI name of a GPU or MIG device: `<kind>=<uuid>`."""
    return f"{KIND}={target.uuid}"


def spec_path(root: HostRoot) -> Path:
    return root.join(f"{constants.CDI_SPEC_DIR}/{SPEC_FILE}")


def spec(inventory: GpuInventory, root: HostRoot | None = None) -> dict[str, Any]:
    """The spec document for the inventory's GPUs and MIG devices, their nodes numbered
    from `root` where it has them."""
    targets = [t for gpu in inventory.gpus for t in (gpu.whole, *gpu.mig_devices)]
    return {
        "cdiVersion": SPEC_VERSION,
        "kind": KIND,
        "devices": [
            {
                "name": target.uuid,
                "containerEdits": {
                    "deviceNodes": [host_cdi.node_edit(n, root) for n in target.device_nodes]
                },
            }
            for target in targets
        ],
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [host_cdi.node_edit(node, root) for node in inventory.control_nodes],
        },
    }


def write_spec(root: HostRoot, inventory: GpuInventory) -> Path:
    """Write the inventory's spec (or remove it when there is no GPU); returns its path."""
    path = spec_path(root)
    if not inventory.gpus:
        path.unlink(missing_ok=True)  # a spec must define at least one device
        return path
    write_atomic(path, json.dumps(spec(inventory, root), indent=2) + "\n")
    return path
