"""``gpuop sim apiserver``: run the simulated API server in the foreground.

The CLI command awaits :func:`run_apiserver`, which starts the server, seeds it with any
manifests given, writes a kubeconfig for clients, and serves until cancelled (Ctrl-C or the
demo shutting down). Every other gpuop process then reaches it through that kubeconfig.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml

from gpuop.sim.server import ApiServer

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
    on_ready: Callable[[ApiServer], None] | None = None,
) -> None:
    """Serve until cancelled. ``on_ready`` is called once the kubeconfig is written."""
    objects = load_manifests(manifests)
    async with ApiServer(host=host, port=port, kubelet_delay=kubelet_delay) as server:
        for obj in objects:
            server.seed(obj)
        server.write_kubeconfig(kubeconfig_out)
        logger.info("simulated API server at %s, kubeconfig %s", server.url, kubeconfig_out)
        if on_ready is not None:
            on_ready(server)
        await asyncio.Event().wait()
