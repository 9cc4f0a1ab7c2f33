"""Helpers for discovery's node agent tests: an NVML that counts sessions, and quiet
intervals. Running the agent and reading the bus: `tests.support.node_agents`."""

from __future__ import annotations

from typing import Any

from gpuop.services.discovery.config import DiscoveryConfig

BOOT_ID = "8c1f2f5e-0c53-4d57-a0a4-3e3c1b0c9a11"
QUIET = DiscoveryConfig(
    scan_interval_seconds=3600, heartbeat_interval_seconds=3600, retry_interval_seconds=0.05
)
"""Intervals long enough that only what a test does makes the agent act."""


class CountingNvml:
    """An NVML backend that counts the sessions opened on it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.sessions = 0

    def init(self) -> None:
        self.sessions += 1
        self.inner.init()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
