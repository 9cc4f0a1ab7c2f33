"""`GPUClusterPolicy.status`: conditions and per-state node counts, as the orchestrator
writes them and `kubectl get gpuclusterpolicy` shows them.

The status also names the rollout of the current versions (`RolloutRecord`). Conditions
follow Kubernetes' `metav1.Condition`: `Valid` (False with reason `InvalidSpec`
names the wrong field, see `gpuop.policy.validation`), `Ready` (every managed node runs the
desired drivers) and `Progressing` (a rollout is under way). `lastTransitionTime` changes only
when a condition's status does: `set_condition` keeps the previous time otherwise, so a status
rewritten on every reconcile does not look as if it flapped. Times come from the caller's
clock (`gpuop.clocks`) and are kept to the second, as the API server stores them.

Status is written by gpuop and read back tolerantly: unknown fields are ignored, so an older
orchestrator replica can read what a newer one wrote.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
"""The syntax of a condition's reason (`metav1.Condition`): a CamelCase word."""
MAX_MESSAGE = 32768

ConditionStatus = Literal["True", "False", "Unknown"]


class ConditionType(StrEnum):
    """The conditions of a GPUClusterPolicy."""

    VALID = "Valid"
    """Whether the spec passed validation; when False its message names the wrong field."""
    READY = "Ready"
    """Whether every managed node runs the desired driver versions."""
    PROGRESSING = "Progressing"
    """Whether a rollout is under way."""
    STALLED = "Stalled"
    """Whether a node under way waits on nothing that can end its step (no deadline bounds
    it); set once a node stalled, its message names the nodes."""


class StatusRecord(BaseModel):
    """A part of the status: camelCase on the wire, frozen, tolerant of unknown fields."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        frozen=True,
        extra="ignore",
        use_attribute_docstrings=True,
    )


class Condition(StatusRecord):
    """One aspect of the policy's state, as `metav1.Condition`."""

    type: Annotated[str, Field(min_length=1, max_length=316)]
    """The aspect: `Valid`, `Ready`, `Progressing` or `Stalled` (`ConditionType`)."""
    status: ConditionStatus
    """Whether the aspect holds."""
    reason: Annotated[str, Field(min_length=1, max_length=1024, pattern=REASON_PATTERN)]
    """Why, as one CamelCase word for tools: `InvalidSpec`, `RolloutInProgress`."""
    message: Annotated[str, Field(max_length=MAX_MESSAGE)] = ""
    """Why, for people."""
    last_transition_time: AwareDatetime
    """When `status` last changed."""
    observed_generation: Annotated[int, Field(ge=0)] | None = None
    """The spec generation the condition was computed from."""


def condition(
    type: str,
    status: bool | ConditionStatus,
    reason: str,
    message: str = "",
    *,
    now: datetime,
    observed_generation: int | None = None,
) -> Condition:
    """A condition that changed at `now` (put it in a status with `set_condition`, which
    keeps the earlier time when the status did not change). `status` may be a bool."""
    if isinstance(status, bool):
        status = "True" if status else "False"
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 1] + "…"
    return Condition(
        type=type,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=now.replace(microsecond=0),
        observed_generation=observed_generation,
    )


def set_condition(conditions: Iterable[Condition], new: Condition) -> tuple[Condition, ...]:
    """`conditions` with `new` in place of the condition of its type (appended if none);
    if that condition had the same status, its `lastTransitionTime` is kept."""
    updated: list[Condition] = []
    placed = False
    for old in conditions:
        if old.type != new.type:
            updated.append(old)
            continue
        if old.status == new.status:
            new = new.model_copy(update={"last_transition_time": old.last_transition_time})
        updated.append(new)
        placed = True
    if not placed:
        updated.append(new)
    return tuple(updated)


class RolloutRecord(StatusRecord):
    """The rollout the orchestrator runs for the policy's current driver versions."""

    id: Annotated[str, Field(min_length=1, max_length=256)]
    """The rollout's id: the correlation id of its events and the stem of its saga ids."""
    versions: dict[str, Annotated[str, Field(max_length=64)]] = Field(max_length=51)
    """The driver version of each component it installs (`gpu`, `ofed`), and of each
    driver pool's (`<pool>/gpu`, `<pool>/ofed`); the GPU driver's `kernelModuleType` where
    it is not `auto` (`gpu.kernelModuleType`, `<pool>/gpu.kernelModuleType`)."""


class PoolProgress(StatusRecord):
    """How far one driver pool's nodes got in the current rollout."""

    name: Annotated[str, Field(min_length=1, max_length=32)]
    """The pool (`default`: the nodes no pool selects)."""
    total: Annotated[int, Field(ge=0)] = 0
    """The pool's nodes in the rollout."""
    done: Annotated[int, Field(ge=0)] = 0
    """Of those, in `upgrade-done`."""
    failed: Annotated[int, Field(ge=0)] = 0
    """In `upgrade-failed`."""
    skipped: Annotated[int, Field(ge=0)] = 0
    """Left out by admission (skip labels, `cordonedNodes: skip`)."""
    versions: dict[str, Annotated[str, Field(max_length=64)]] = Field(
        default_factory=dict, max_length=2
    )
    """The versions the pool's nodes should run (`gpu`, `ofed`)."""


class PolicyStatus(StatusRecord):
    """What gpuop observed and did about the policy."""

    observed_generation: Annotated[int, Field(ge=0)] | None = None
    """The `metadata.generation` of the spec this status describes."""
    conditions: tuple[Condition, ...] = Field(
        default=(),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """The policy's conditions: `Valid`, `Ready`, `Progressing`."""
    nodes: dict[str, Annotated[int, Field(ge=0)]] = Field(default_factory=dict)
    """How many managed nodes are in each upgrade state (`upgrade-done`, `cordon-required`,
    ...); states with no node are left out."""
    skipped: Annotated[int, Field(ge=0)] = 0
    """Of the managed nodes waiting in `upgrade-required`, how many admission leaves out: a
    skip label (`nvidia.com/gpu-driver-upgrade.skip=true`,
    `nvidia.com/ofed-driver-upgrade.skip=true`) covers every driver they need, or they are
    cordoned and `upgradePolicy.cordonedNodes` is `skip`."""
    pools: tuple[PoolProgress, ...] = Field(
        default=(),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    """Progress per driver pool (`driver.pools`), the nodes of no pool as `default`; empty
    when the policy has no pools."""
    upgraded: Annotated[str, Field(max_length=64)] = ""
    """`<done>/<total>` of the current rollout's nodes, for the printer column."""
    pool_summary: Annotated[str, Field(max_length=1024)] = ""
    """`<pool> <done>/<total>` per pool, for the printer column."""
    rollout: RolloutRecord | None = None
    """The rollout of the current driver versions. Kept here so that every replica names a
    rollout the same way, and a return to versions an earlier rollout installed (`gpuop
    upgrade abort`) is a new rollout with ids of its own."""

    def condition_of(self, type: str) -> Condition | None:
        """The condition of that type, if the status has one."""
        return next((c for c in self.conditions if c.type == type), None)

    def with_condition(self, new: Condition) -> PolicyStatus:
        """This status with `new` set as `set_condition` does."""
        return self.model_copy(update={"conditions": set_condition(self.conditions, new)})

    def to_wire(self) -> dict[str, Any]:
        """The status as written to the `status` subresource."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
