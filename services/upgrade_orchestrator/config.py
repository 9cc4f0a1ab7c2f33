"""The orchestrator's own settings, from the `--config` YAML file (`GPUOP_CONFIG`); every key
is optional:

    operands: [discovery]          # node services that must confirm a pause before an unload
    lease_name: gpuop-upgrade-orchestrator
    lease_namespace: default
    lease_duration_seconds: 15     # a crashed leader's lease is taken over after this
    resync_seconds: 2              # reconcile at least this often (admission, progress)
    event_namespace: default       # where Kubernetes Events about nodes are written

Only the operands actually deployed belong in `operands`: a saga waits for every one it
names to confirm its pause. Read once at start; tests build `OrchestratorConfig` directly.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from gpuop.events.device import OperandService
from gpuop.runtime.settings import load_config_file


class OrchestratorConfig(BaseModel):
    """The upgrade orchestrator's configuration file."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    operands: tuple[OperandService, ...] = (OperandService.DISCOVERY,)
    """Operand services deployed on the nodes, each of which must confirm a pause."""
    lease_name: str = Field(default="gpuop-upgrade-orchestrator", min_length=1, max_length=253)
    """The Lease the replicas elect their leader with."""
    lease_namespace: str = Field(default="default", min_length=1, max_length=63)
    """Namespace of that Lease."""
    lease_duration_seconds: int = Field(default=15, ge=3, le=300)
    """Seconds a leader's lease lasts without renewal; a takeover waits at most this."""
    resync_seconds: float = Field(default=2.0, gt=0, le=300)
    """Seconds between reconciles when nothing woke the controller."""
    event_namespace: str = Field(default="default", min_length=1, max_length=63)
    """Namespace of the Kubernetes Events recorded about nodes."""


def load_config(path: Path | None) -> OrchestratorConfig:
    """The configuration in `path` (YAML or JSON); the defaults when `path` is None.
    Raises `SettingsError` naming the file and the first wrong key."""
    return load_config_file(path, OrchestratorConfig)
