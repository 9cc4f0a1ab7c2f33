"""The `upgradePolicy.validation` section: the ladder of checks a node passes before the
uncordon.

Each rung is a step of the saga's validation-required state with its own deadline
(`upgradePolicy.deadlines`) and failure reason; a failed rung compensates like any failed
step after the unload (rollback, then the restored driver's NVML check). The rungs run in
the ladder's order whatever order the policy lists them in:

    nvml      driver-manager: module and user space version, NVML sees the GPUs (always)
    cuda      driver-manager: `cuInit`, device count, a context on every GPU
    peermem   driver-manager: `nvidia_peermem` registered with the RDMA core; only when
              OFED is among the components upgraded
    pod       the orchestrator: a pod requesting one GPU, placed on the cordoned node,
              Succeeded
    preflight the orchestrator: a diagnostic the admin names (`validation.preflight`: DCGM's
              `dcgmi diag -r 1`, a gpu-burn image) in a pod holding every GPU of the node,
              exiting 0 within its own deadline; listed only on purpose, as no image is
              pulled by default

The remediation runs the same ladder before it releases a node, with its own choice of rungs
where `remediation.rungs` lists some.

Read by the decision core (`gpuop.saga.upgrade.steps.validation_plan`) and by the orchestrator's
executor for the pods (`pod`, `preflight`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from gpuop.policy.fields import DeadlineSeconds, Section

Rung = Literal["nvml", "cuda", "pod", "peermem", "preflight"]
"""One rung of the validation ladder."""
LADDER: tuple[Rung, ...] = ("nvml", "cuda", "peermem", "pod", "preflight")
"""Every rung, in the order they run: the node's own checks before the pods, the short pod
before the long diagnostic."""
DEFAULT_RUNGS: tuple[Rung, ...] = ("nvml", "cuda", "pod")


def listed(value: object) -> object:
    """A JSON list as the tuple the frozen, hashable policy keeps."""
    return tuple(value) if isinstance(value, list) else value


class ValidationPod(Section):
    """The pod of the `pod` rung: it requests one `nvidia.com/gpu`, tolerates the cordon's
    taint and gpuop's taints, and is bound to the node by `nodeName` (no scheduler)."""

    image: str = Field(
        default="nvcr.io/nvidia/cuda:12.2.2-base-ubuntu22.04", min_length=1, max_length=512
    )
    """The container image."""
    command: Annotated[tuple[str, ...], BeforeValidator(listed)] = Field(
        default=("nvidia-smi", "-L"), min_length=1, max_length=32
    )
    """The container's command; exiting 0 passes the rung."""
    namespace: str = Field(default="", max_length=63, pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$")
    """The namespace the pod is created in; empty: the orchestrator's own (the release's,
    where the chart lets it create pods)."""
    runtime_class_name: str = Field(default="", max_length=253)
    """The RuntimeClass of the pod (`nvidia` where the runtime needs one); empty: none."""


class Preflight(Section):
    """The diagnostic of the `preflight` rung: a pod holding every GPU of the cordoned node
    (as many `nvidia.com/gpu` as its capacity counts, or, on a DRA node, a claim for every
    device of its slices), bound or pinned to it like the `pod` rung's, that must exit 0."""

    image: str = Field(min_length=1, max_length=512)
    """The diagnostic's image, e.g. `nvcr.io/nvidia/cloud-native/dcgm:<version>`; no
    default, so none is pulled unless an admin names one."""
    command: Annotated[tuple[str, ...], BeforeValidator(listed)] = Field(
        min_length=1, max_length=32
    )
    """The diagnostic's command, e.g. `["dcgmi", "diag", "-r", "1"]`; exiting 0 passes the
    rung, any other exit fails it with the container's last log lines as the reason."""
    namespace: str = Field(default="", max_length=63, pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$")
    """The namespace the pod is created in; empty: the orchestrator's own."""
    runtime_class_name: str = Field(default="", max_length=253)
    """The RuntimeClass of the pod; empty: none."""
    deadline_seconds: DeadlineSeconds = 900
    """How long the rung may take, the pod's start and the image's pull included; a pod
    that never starts fails the rung then, with the reason it was waiting for."""


class Validation(Section):
    """Which rungs of the validation ladder a node passes before it is uncordoned."""

    rungs: Annotated[tuple[Rung, ...], BeforeValidator(listed)] = Field(
        default=DEFAULT_RUNGS, min_length=1, max_length=len(LADDER)
    )
    """The rungs to run (`nvml`, `cuda`, `peermem`, `pod`, `preflight`), always in that
    order; `nvml` must be one of them."""
    pod: ValidationPod = ValidationPod()
    """The pod of the `pod` rung."""
    preflight: Preflight | None = None
    """The diagnostic of the `preflight` rung (of the upgrade's ladder or the remediation's);
    required when either lists that rung."""

    @field_validator("rungs")
    @classmethod
    def _nvml_first(cls, value: tuple[Rung, ...]) -> tuple[Rung, ...]:
        return checked_rungs(value)

    @model_validator(mode="after")
    def _preflight_named(self) -> Validation:
        if "preflight" in self.rungs:
            require_preflight(self, "rungs")
        return self

    def ladder(self, rungs: tuple[Rung, ...] = ()) -> tuple[Rung, ...]:
        """The chosen rungs (`rungs`, else this ladder's own) in the order they run."""
        chosen = rungs or self.rungs
        return tuple(rung for rung in LADDER if rung in chosen)


def checked_rungs(value: tuple[Rung, ...]) -> tuple[Rung, ...]:
    """A list of rungs as a policy may give it: `nvml` in it, no rung twice."""
    if "nvml" not in value:
        raise PydanticCustomError("rungs", "must include nvml, the ladder's first rung")
    if len(set(value)) != len(value):
        raise PydanticCustomError("rungs", "names a rung twice")
    return value


def require_preflight(validation: Validation, field: str, which: str = "") -> None:
    """Refuse a ladder listing `preflight` without the diagnostic it runs: gpuop has no
    default diagnostic image to pull in its place."""
    if validation.preflight is None:
        raise PydanticCustomError(
            "preflight",
            which + "lists the preflight rung but upgradePolicy.validation.preflight names no "
            "diagnostic image and command (e.g. nvcr.io/nvidia/cloud-native/dcgm with "
            "dcgmi diag -r 1): gpuop pulls no default diagnostic",
            {"field": field},
        )
