"""The real node serving its GPUs through DRA, for the real-node suites: gpuop's DRA kubelet
plugin runs as the device plugin's node agent (`gpuop run device-plugin --role node`), which
the real kubelet registers, and its cluster role (`--role cluster`) writes the node's
ResourceSlice and tells the node the claims' allocations over the bus.

The real node's kubelet runs with `--root-dir <work>/kubelet`, outside the node's host root,
so `kubelet_root_seen` (and `show_kubelet_root`, for the chart's install) makes that
directory appear under the host root where the host has it (as on a node whose host root is
`/`), and `plugin_config` names it as the device plugin's `flags.kubeletRootDir` (the chart's
`nodeAgents.kubeletRootDir`): the plugin's sockets are then where the kubelet watches and
dials.
`serving_dra` keeps DRA as the node's device API, as a finished switch leaves it, so the
plugin serves DRA from its start.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpuop.events import dra
from gpuop.events.device_api_commands import DeviceApi
from gpuop.host.roots import HostRoot
from gpuop.services.device_plugin.dra import deviceapis
from tests.support.real_node import RealNode

RESOURCE = "/apis/resource.k8s.io/v1"
REGISTERED = f"the kubelet registered DRA plugin {dra.DRIVER}"
"""What the device plugin logs each time the kubelet registers its DRA plugin."""
CLASS = dra.DRIVER
"""NVIDIA's DeviceClass of whole GPUs (the chart's)."""


def show_kubelet_root(node: RealNode) -> list[Path]:
    """The kubelet's root directory made to appear at its own path under the host root (a
    link to it), as on a node whose host root is `/`; the directories made for the link,
    outermost first (none when it is there already)."""
    root = node.kubelet_root.resolve()
    link = node.host_root / root.relative_to("/")
    if link.is_symlink():
        return []
    made = [parent for parent in reversed(link.parents) if not parent.exists()]
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(root)
    return made


@contextlib.contextmanager
def kubelet_root_seen(node: RealNode) -> Iterator[Path]:
    """The kubelet's root directory at its own path under the host root (a link to it)
    while the block runs; yields that path as the host sees it."""
    root = node.kubelet_root.resolve()
    link = node.host_root / root.relative_to("/")
    there = link.is_symlink()
    made = show_kubelet_root(node)
    try:
        yield root
    finally:
        if not there:
            link.unlink()
        for directory in reversed(made):
            directory.rmdir()


def plugin_config(node: RealNode, path: Path) -> Path:
    """The device plugin's `--config` at `path`: the kubelet's root directory its own."""
    path.write_text(f"flags:\n  kubeletRootDir: {node.kubelet_root.resolve()}\n", encoding="utf-8")
    return path


def serving_dra(node: RealNode) -> None:
    """DRA as the node's device API, kept on its host as a switch to it keeps it."""
    deviceapis.save(HostRoot(node.host_root), DeviceApi.DRA)


def registrations(log: Path) -> int:
    """How often the device plugin logged the kubelet's registration of its DRA plugin."""
    if not log.exists():
        return 0
    return log.read_text(errors="replace").count(REGISTERED)


def device_class() -> dict[str, Any]:
    expression = f"device.driver == '{dra.DRIVER}'"
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": CLASS},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def slice_of(node: RealNode) -> dict[str, Any] | None:
    """gpuop's ResourceSlice of the node, once the cluster role wrote it."""
    listed = node.plane.call("GET", f"{RESOURCE}/resourceslices")["items"]
    ours = [
        s
        for s in listed
        if s["spec"].get("nodeName") == node.name and s["spec"]["driver"] == dra.DRIVER
    ]
    return ours[0] if ours and ours[0]["spec"].get("devices") else None


def resource_claim(name: str, namespace: str = "default") -> dict[str, Any]:
    """A claim for one whole GPU of the node's pool."""
    request = {"name": "gpu", "exactly": {"deviceClassName": CLASS}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [request]}},
    }


def allocated_devices(node: RealNode, claim: str, namespace: str = "default") -> list[str]:
    """The devices the scheduler allocated `claim` (none before)."""
    path = f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{claim}"
    status = node.plane.call("GET", path).get("status", {})
    results = status.get("allocation", {}).get("devices", {}).get("results", [])
    return [result["device"] for result in results]


def with_claim(pod: dict[str, Any], claim: str) -> dict[str, Any]:
    """`pod` with its first container holding the ResourceClaim `claim`."""
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return pod
