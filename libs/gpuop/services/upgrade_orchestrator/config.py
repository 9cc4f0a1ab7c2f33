"""The orchestrator's own settings, from the `--config` YAML file (`GPUOP_CONFIG`); every key
is optional:

    operands: [discovery]          # node services that must confirm a pause before an unload
    lease_name: gpuop-upgrade-orchestrator
    lease_namespace: default
    lease_duration_seconds: 15     # a leader that stops renewing is taken over after this
    presence_seconds: 3            # a crashed leader is taken over after about this (0: off)
    resync_seconds: 2              # reconcile at least this often (admission, progress)
    event_namespace: default       # where Kubernetes Events about nodes are written

`presence_seconds` is the leader's NATS presence (`presence`): a standby that finds it
unrenewed that long fences the leader off and takes the Lease before it expires. With 0, a
takeover waits for the Lease to expire, as with client-go's leader election alone. Left out,
it is 3 s, or off for a Lease shorter than twice that (it would gain little).

Only the operands actually deployed belong in `operands`: a saga waits for every one it
names to confirm its pause. Read once at start; tests build `OrchestratorConfig` directly.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpuop.events.device import OperandService
from gpuop.runtime.settings import load_config_file

DEFAULT_PRESENCE_SECONDS = 3.0
"""The presence's duration when the file leaves it out: with the default 15 s Lease, a
crashed leader's standby acts about 3 s after the crash."""


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
    presence_seconds: float | None = Field(default=None, ge=0, le=60)
    """Seconds a leader's NATS presence lasts without renewal, after which a standby fences
    it off and takes the Lease at once; 0 leaves takeovers to the Lease alone. Shorter than
    the Lease's duration. Unset: `DEFAULT_PRESENCE_SECONDS`, or 0 for a Lease shorter than
    twice that."""
    resync_seconds: float = Field(default=2.0, gt=0, le=300)
    """Seconds between reconciles when nothing woke the controller."""
    event_namespace: str = Field(default="default", min_length=1, max_length=63)
    """Namespace of the Kubernetes Events recorded about nodes."""

    @property
    def presence_duration(self) -> float:
        """The presence's duration in force; 0 when there is none."""
        if self.presence_seconds is not None:
            return self.presence_seconds
        if self.lease_duration_seconds < 2 * DEFAULT_PRESENCE_SECONDS:
            return 0.0
        return DEFAULT_PRESENCE_SECONDS

    @model_validator(mode="after")
    def _presence_shorter_than_lease(self) -> OrchestratorConfig:
        chosen = self.presence_seconds
        if chosen and not 0.5 <= chosen < self.lease_duration_seconds:
            raise ValueError(
                "presence_seconds must be 0 (off) or from 0.5 to under lease_duration_seconds"
            )
        return self


def load_config(path: Path | None) -> OrchestratorConfig:
    """The configuration in `path` (YAML or JSON); the defaults when `path` is None.
    Raises `SettingsError` naming the file and the first wrong key."""
    return load_config_file(path, OrchestratorConfig)
