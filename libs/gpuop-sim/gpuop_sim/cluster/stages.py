"""The simulated kubelet's lifecycle, written as a table of stages, as KWOK's `Stage`s are.

A stage selects the objects it applies to, waits a delay, and then does its `next`; the
kubelet (`kubelet.py`) only interprets the table: on each pass, every pod takes the first
stage that selects it, is due `delay` after the stage first selected it (the earlier time
wins when the delay shrinks, as a second delete with a shorter grace period does), and when
due the stage's `next` is done. What a stage selects on, how long it waits and what comes
next are data:

    stage          selects                                     waits            next
    pod-delete     marked for deletion                         grace, capped    gone
    pod-ready      admitted (or restarting after a reboot)     start_delay      Running
    pod-complete   Running, annotated sim.gpuop.io/run-seconds  that long        Succeeded
    pod-validate   Running, labelled gpuop.io/validation-pod   0 (or the        Succeeded
                   (the upgrade's validation pod)              annotation)
    node-heartbeat the node, while its machine is up           heartbeat        status+Lease

Admission is not a stage: it weighs a node's pods against each other (their GPUs against
the node's), so `Kubelet._admit` does it before the stages run. Faults are not stages either:
a test or the demo powers a machine off and on (`Cluster.power_off`, `power_on`); KWOK's
node-unreachable and reboot stages are those two calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpuop_sim.cluster.podstatus import RUN_SECONDS_ANNOTATION

VALIDATION_POD_LABEL = "gpuop.io/validation-pod"
"""The label of gpuop's validation pod (`gpuop.kube.validationpods.LABEL`): its containers
exit 0 as soon as they run, as a healthy node's `nvidia-smi -L` does in a moment."""

Obj = dict[str, Any]


class Next(StrEnum):
    """What a stage does when it is due."""

    RUN = "run"
    """Every container started and ready, with a pod IP: Running."""
    SUCCEED = "succeed"
    """Every container exited 0: Succeeded."""
    DELETE = "delete"
    """The deletion confirmed: the pod is gone from the API server."""
    HEARTBEAT = "heartbeat"
    """Node conditions posted and the node's Lease renewed."""


@dataclass(frozen=True)
class Timings:
    """The kubelet's settings the delays read."""

    start_delay: float
    """Seconds from admission to Running."""
    termination_cap: float
    """The most seconds a deletion's grace period is waited for."""
    heartbeat_interval: float
    """Seconds between node heartbeats."""


@dataclass(frozen=True)
class Select:
    """Which pods a stage applies to; None matches either way."""

    phase: str | None = None
    """The pod's `status.phase` (Pending when it has none)."""
    terminating: bool | None = None
    """Marked for deletion (`metadata.deletionTimestamp`)."""
    admitted: bool | None = None
    """Admitted by the kubelet and not started yet (or restarting after a reboot)."""
    annotation: str | None = None
    """This annotation is present."""
    label: str | None = None
    """This label is present."""

    def matches(self, pod: Obj, admitted: bool) -> bool:
        metadata = pod["metadata"]
        checks = (
            (self.phase, phase_of(pod)),
            (self.terminating, bool(metadata.get("deletionTimestamp"))),
            (self.admitted, admitted),
        )
        if any(wanted is not None and wanted != actual for wanted, actual in checks):
            return False
        if self.label is not None and self.label not in (metadata.get("labels") or {}):
            return False
        return self.annotation is None or self.annotation in (metadata.get("annotations") or {})


@dataclass(frozen=True)
class Delay:
    """How long a stage waits: a kubelet setting, an annotation's seconds (KWOK's
    `durationFrom`), or the pod's deletion grace period capped by `termination_cap`."""

    setting: str | None = None
    annotation: str | None = None
    grace: bool = False

    def seconds(self, obj: Obj, timings: Timings) -> float:
        if self.grace:
            grace = float(obj["metadata"].get("deletionGracePeriodSeconds") or 0)
            return min(grace, timings.termination_cap)
        if self.annotation is not None:
            return float((obj["metadata"].get("annotations") or {})[self.annotation])
        if self.setting is not None:
            return float(getattr(timings, self.setting))
        return 0.0


@dataclass(frozen=True)
class Stage:
    """One row of the table."""

    name: str
    select: Select
    delay: Delay
    next: Next


POD_STAGES: tuple[Stage, ...] = (
    Stage("pod-delete", Select(terminating=True), Delay(grace=True), Next.DELETE),
    Stage("pod-ready", Select(terminating=False, admitted=True), Delay("start_delay"), Next.RUN),
    Stage(
        "pod-complete",
        Select(
            phase="Running", terminating=False, admitted=False, annotation=RUN_SECONDS_ANNOTATION
        ),
        Delay(annotation=RUN_SECONDS_ANNOTATION),
        Next.SUCCEED,
    ),
    Stage(
        "pod-validate",
        Select(phase="Running", terminating=False, admitted=False, label=VALIDATION_POD_LABEL),
        Delay(),
        Next.SUCCEED,
    ),
)
"""A pod's stages, first match first."""

NODE_HEARTBEAT = Stage("node-heartbeat", Select(), Delay("heartbeat_interval"), Next.HEARTBEAT)
"""The node's one stage, repeated while its machine is up."""


def phase_of(pod: Obj) -> str:
    """The pod's phase; Pending when it has none yet."""
    return str((pod.get("status") or {}).get("phase") or "Pending")


def stage_of(pod: Obj, admitted: bool) -> Stage | None:
    """The first of `POD_STAGES` that selects `pod`, or None."""
    return next((s for s in POD_STAGES if s.select.matches(pod, admitted)), None)
