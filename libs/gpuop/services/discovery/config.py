"""Discovery's own settings: how often the node role scans and beats, how the cluster role
labels. Read from the `--config` YAML file (`GPUOP_CONFIG`); every key is optional:

    scan_interval_seconds: 60        # full inventory scan (published only when it changed)
    heartbeat_interval_seconds: 30   # hardware.heartbeat
    retry_interval_seconds: 5        # a failed scan, or Kubernetes not reachable yet
    mig_strategy: none               # none | single | mixed, as the device plugin runs
    replicas: 1                      # time-slicing replicas per GPU (>1 adds -SHARED), for
                                     # nodes whose device plugin has not reported its config

Called once at start by both roles; tests build `DiscoveryConfig` directly.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from gpuop.inventory.labeling import LabelSettings, MigStrategy
from gpuop.runtime.settings import load_config_file


class DiscoveryConfig(BaseModel):
    """The discovery service's configuration file."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    scan_interval_seconds: float = Field(default=60.0, gt=0, le=86400)
    """Seconds between full scans of the host and NVML."""
    heartbeat_interval_seconds: float = Field(default=30.0, gt=0, le=3600)
    """Seconds between heartbeats."""
    retry_interval_seconds: float = Field(default=5.0, gt=0, le=3600)
    """Seconds before a failed scan, or a failed connection to Kubernetes, is retried."""
    mig_strategy: MigStrategy = MigStrategy.NONE
    """MIG strategy the device plugin runs with; it shapes the `nvidia.com/mig.*` labels."""
    replicas: int = Field(default=1, ge=1, le=1024)
    """Time-slicing replicas per GPU; more than one marks the product `-SHARED`. A node whose
    device plugin reports the config in force (`device.plugin-config-applied`) is labelled
    from that instead."""

    def label_settings(self) -> LabelSettings:
        # no gfd.timestamp: a label that changes every pass would patch every node each time
        return LabelSettings(mig_strategy=self.mig_strategy, replicas=self.replicas)


def load_config(path: Path | None) -> DiscoveryConfig:
    """The configuration in `path` (YAML or JSON); the defaults when `path` is None.
    Raises `SettingsError` naming the file and the first wrong key."""
    return load_config_file(path, DiscoveryConfig)
