"""The `remediation` section: what gpuop does when telemetry reports a GPU unhealthy.

Read by the remediation saga (`gpuop.saga.remediation`) and by the orchestrator that starts
it. A fault whose action (`DeviceHealthChanged.action`, the XID catalog's resolution) is
`reset-gpu` or worse starts a remediation of the node, unless one runs there already:
quarantine (the taint `gpuop.io/gpu-unhealthy:NoSchedule`, when `quarantine`), evict only
the pods holding the affected GPUs (`upgradePolicy.podDeletion`'s force and emptyDir
rules), pause the operands, reset the GPUs (`allowDriverReload`: an unload and load of the
driver when one cannot be reset alone), reboot when the reset fails (`allowReboot`), the
validation ladder (`upgradePolicy.validation`, or the rungs `rungs` lists: `preflight` among
them runs the admin's GPU diagnostic on the node before it is released), then resume and
release.

The circuit breaker: at most `maxPerHour` remediations start in any sliding hour across the
cluster (0: no limit); a bad signal that marks many GPUs unhealthy at once then takes at most
that many nodes out, and the policy's `RemediationBreaker` condition says why the others wait.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, Field, field_validator

from gpuop.policy.fields import DeadlineSeconds, Section
from gpuop.policy.ladders import LADDER, Rung, checked_rungs, listed


class RemediationDeadlines(Section):
    """The longest each step of a remediation may take, in seconds."""

    holders: DeadlineSeconds = 60
    """The device plugin naming the pods that hold the affected GPUs."""
    eviction: DeadlineSeconds = 600
    """Evicting those pods until they are gone."""
    operands_pause: DeadlineSeconds = 300
    """The node's operands releasing the GPUs."""
    reset: DeadlineSeconds = 300
    """The driver-manager resetting the GPUs (a driver reload included)."""
    reboot: DeadlineSeconds = 1800
    """The node coming back with a new boot id after the reboot."""
    validation: DeadlineSeconds = 600
    """Each rung of the validation ladder after the reset or the reboot."""


class RemediationPolicy(Section):
    """How gpuop remediates a GPU that telemetry reports unhealthy."""

    enabled: bool = True
    """Start remediations; false: faults are only reported (the device plugin still marks
    the GPU Unhealthy)."""
    quarantine: bool = True
    """Taint the node `gpuop.io/gpu-unhealthy:NoSchedule` while it is remediated (and
    after a failed remediation), so nothing new is scheduled on it."""
    max_per_hour: Annotated[int, Field(ge=0, le=100_000)] = 3
    """The circuit breaker: remediations started in any sliding hour across the cluster, at
    most; 0: no limit."""
    allow_reboot: bool = True
    """Reboot the node when the GPU reset fails (confirmed by a new boot id)."""
    allow_driver_reload: bool = False
    """Let the driver-manager unload and load the GPU driver when a GPU cannot be reset
    alone (every GPU of the node is reset then, so all must be free)."""
    deadlines: RemediationDeadlines = RemediationDeadlines()
    """The longest each step may take."""
    rungs: Annotated[tuple[Rung, ...], BeforeValidator(listed)] = Field(
        default=(), max_length=len(LADDER)
    )
    """The validation ladder's rungs run before the release (`nvml`, `cuda`, `pod`,
    `preflight`; `peermem` is an OFED upgrade's), in the ladder's order; empty: those of
    `upgradePolicy.validation`. `preflight` runs `upgradePolicy.validation.preflight`."""

    @field_validator("rungs")
    @classmethod
    def _nvml_first(cls, value: tuple[Rung, ...]) -> tuple[Rung, ...]:
        return checked_rungs(value) if value else value
