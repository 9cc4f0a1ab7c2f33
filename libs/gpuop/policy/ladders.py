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

Read by the decision core (`gpuop.saga.upgrade.steps.validation_plan`) and by the orchestrator's
executor for the pod (`pod`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator
from pydantic_core import PydanticCustomError

from gpuop.policy.fields import Section

Rung = Literal["nvml", "cuda", "pod", "peermem"]
"""One rung of the validation ladder."""
LADDER: tuple[Rung, ...] = ("nvml", "cuda", "peermem", "pod")
"""Every rung, in the order they run: the node's own checks before the pod."""
DEFAULT_RUNGS: tuple[Rung, ...] = ("nvml", "cuda", "pod")


def _listed(value: object) -> object:
    """A JSON list as the tuple the frozen, hashable policy keeps."""
    return tuple(value) if isinstance(value, list) else value


class ValidationPod(Section):
    """The pod of the `pod` rung: it requests one `nvidia.com/gpu`, tolerates the cordon's
    taint and gpuop's taints, and is bound to the node by `nodeName` (no scheduler)."""

    image: str = Field(
        default="nvcr.io/nvidia/cuda:12.2.2-base-ubuntu22.04", min_length=1, max_length=512
    )
    """The container image."""
    command: Annotated[tuple[str, ...], BeforeValidator(_listed)] = Field(
        default=("nvidia-smi", "-L"), min_length=1, max_length=32
    )
    """The container's command; exiting 0 passes the rung."""
    namespace: str = Field(default="", max_length=63, pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$")
    """The namespace the pod is created in; empty: the orchestrator's own (the release's,
    where the chart lets it create pods)."""
    runtime_class_name: str = Field(default="", max_length=253)
    """The RuntimeClass of the pod (`nvidia` where the runtime needs one); empty: none."""


class Validation(Section):
    """Which rungs of the validation ladder a node passes before it is uncordoned."""

    rungs: Annotated[tuple[Rung, ...], BeforeValidator(_listed)] = Field(
        default=DEFAULT_RUNGS, min_length=1, max_length=4
    )
    """The rungs to run (`nvml`, `cuda`, `peermem`, `pod`), always in that order; `nvml`
    must be one of them."""
    pod: ValidationPod = ValidationPod()
    """The pod of the `pod` rung."""

    @field_validator("rungs")
    @classmethod
    def _nvml_first(cls, value: tuple[Rung, ...]) -> tuple[Rung, ...]:
        if "nvml" not in value:
            raise PydanticCustomError("rungs", "must include nvml, the ladder's first rung")
        if len(set(value)) != len(value):
            raise PydanticCustomError("rungs", "names a rung twice")
        return value

    def ladder(self) -> tuple[Rung, ...]:
        """The chosen rungs in the order they run."""
        return tuple(rung for rung in LADDER if rung in self.rungs)
