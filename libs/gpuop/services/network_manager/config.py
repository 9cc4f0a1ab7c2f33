"""Network-manager's own settings: where the node role finds its links, how often both
roles look again. Read from the `--config` YAML file (`GPUOP_CONFIG`); every key is optional:

    netns: null                      # node role: network namespace of the node's links
    resync_interval_seconds: 300     # converge again even when nothing announced a change
    retry_interval_seconds: 5        # after a failure to reach NATS or Kubernetes
    block_node_selector: ""          # cluster role: the Nodes that get address blocks

In production the node role runs with `hostNetwork: true` and `netns` unset: its own
network namespace is the host's. Tests and the simulated cluster give each simulated node a
namespace of its own (`ip netns add`), so several "nodes" share one machine.

Called once at start by both roles; tests build `NetworkManagerConfig` directly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from gpuop.runtime.settings import load_config_file


class NetworkManagerConfig(BaseModel):
    """The network-manager service's configuration file."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    netns: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")] | None = None
    """Named network namespace (`/run/netns/<name>`) holding the node's NICs; unset: the
    namespace the agent runs in."""
    resync_interval_seconds: float = Field(default=300.0, gt=0, le=86400)
    """Seconds between two full convergences of the node (links repaired, RDMA devices
    read again) or of the cluster (NetworkAttachmentDefinitions written again)."""
    retry_interval_seconds: float = Field(default=5.0, gt=0, le=3600)
    """Seconds before a pass that could not reach NATS or Kubernetes is tried again."""
    block_node_selector: str = Field(default="", max_length=1024)
    """Cluster role: a Kubernetes label selector of the Nodes that get a block of each pool
    with a `perNodeBlockSize` (those the node role runs on; the chart passes its
    `nicNodeSelector`); empty: every Node."""


def load_config(path: Path | None) -> NetworkManagerConfig:
    """The configuration in `path` (YAML or JSON); the defaults when `path` is None.
    Raises `SettingsError` naming the file and the first wrong key."""
    return load_config_file(path, NetworkManagerConfig)
