"""Pod uids for the `pod_uid` label (dcgm-exporter's `--kubernetes-enable-pod-uid`), read
from the node itself: the kubelet names each pod's log directory
`/var/log/pods/<namespace>_<name>_<uid>`, and Kubernetes names never contain `_`, so the
listing maps every pod of the node to its uid without a Kubernetes token.

The node exporter lists the directory (under the host root) on its pods loop when `pod_uid`
is among the configured labels, and `pods.Attributor` stamps each owner with its uid; a pod
given a GPU through a DRA claim already has its uid from the claim. A pod whose directory is
not there yet (or a node without the directory mounted) keeps its series without `pod_uid`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)

POD_LOGS = Path("var/log/pods")
"""The kubelet's pod log root, relative to the node's root."""

PodKey = tuple[str, str]
"""A pod by namespace and name."""


class PodUids:
    """The uids of the node's pods, from the kubelet's pod log directories."""

    def __init__(self, host_root: Path) -> None:
        self.directory = host_root / POD_LOGS
        self._readable: bool | None = None

    def read(self) -> Mapping[PodKey, str]:
        """Every pod of the node with a log directory, to its uid; empty when unreadable."""
        try:
            names = [entry.name for entry in self.directory.iterdir() if entry.is_dir()]
        except OSError as error:
            if self._readable is not False:
                log.warning("no pod_uid labels: %s is unreadable: %s", self.directory, error)
            self._readable = False
            return {}
        self._readable = True
        return dict(parsed for name in names if (parsed := parse(name)) is not None)


def parse(directory: str) -> tuple[PodKey, str] | None:
    """`(namespace, name), uid` of a pod log directory's name; None for any other name."""
    parts = directory.split("_")
    if len(parts) != 3 or not all(parts):
        return None
    namespace, name, uid = parts
    return (namespace, name), uid
