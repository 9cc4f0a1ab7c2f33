"""Reading a `GPUClusterPolicy` spec, and refusing it with the path of each wrong field.

The upgrade orchestrator calls `validate_spec(obj["spec"])` on every policy it sees. A good
spec becomes a `GPUClusterPolicySpec`. A bad one raises `PolicyInvalid`, which lists every
problem as a `FieldProblem` with its path in the wire's camelCase names, and gives the
`Valid=False` condition (reason `InvalidSpec`) that the orchestrator writes to the policy's
status, for example::

    spec.upgradePolicy.maxUnavailable: must be an integer >= 1 or a percentage like "25%"

An invalid spec changes nothing by itself: the orchestrator can go on with the last valid
one while the condition tells the operator what to fix. Messages of pydantic's own error
types are rephrased here; the section modules raise their own errors with the final wording.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from pydantic.alias_generators import to_camel
from pydantic_core import ErrorDetails

from gpuop.policy import conditions
from gpuop.policy.specs import GPUClusterPolicySpec

INVALID_SPEC = "InvalidSpec"
VALID_SPEC = "ValidSpec"


@dataclass(frozen=True)
class FieldProblem:
    """One wrong field: its path (`spec.upgradePolicy.drain.timeoutSeconds`) and what is wrong."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class PolicyInvalid(ValueError):
    """The spec cannot be used; `problems` says which fields are wrong and why."""

    def __init__(self, problems: tuple[FieldProblem, ...]) -> None:
        self.problems = problems
        self.message = "; ".join(str(problem) for problem in problems)
        super().__init__(self.message)

    def condition(
        self, *, now: datetime, observed_generation: int | None = None
    ) -> conditions.Condition:
        """The `Valid=False` condition to put in the policy's status."""
        return conditions.condition(
            conditions.ConditionType.VALID,
            False,
            INVALID_SPEC,
            self.message,
            now=now,
            observed_generation=observed_generation,
        )


def validate_spec(raw: Mapping[str, Any]) -> GPUClusterPolicySpec:
    """The spec in `raw` (the object's `spec`, as the API server returns it), or
    `PolicyInvalid` naming every wrong field."""
    try:
        return GPUClusterPolicySpec.model_validate(raw)
    except ValidationError as error:
        raise PolicyInvalid(tuple(_problem(detail) for detail in error.errors())) from None


def valid_condition(
    *, now: datetime, observed_generation: int | None = None
) -> conditions.Condition:
    """The `Valid=True` condition for a spec that `validate_spec` accepted."""
    return conditions.condition(
        conditions.ConditionType.VALID,
        True,
        VALID_SPEC,
        "the spec is valid",
        now=now,
        observed_generation=observed_generation,
    )


def _problem(detail: ErrorDetails) -> FieldProblem:
    context = detail.get("ctx") or {}
    loc = list(detail["loc"])
    # An unknown key is named as the user wrote it; known ones by their wire names, even
    # when the input used the attribute names.
    unknown = loc.pop() if detail["type"] == "extra_forbidden" else None
    if "field" in context:
        loc.append(context["field"])
    path = "spec" + "".join(
        f"[{part}]" if isinstance(part, int) else f".{to_camel(part)}" for part in loc
    )
    if unknown is not None:
        path += f"[{unknown}]" if isinstance(unknown, int) else f".{unknown}"
    return FieldProblem(path, _message(detail))


def _message(detail: ErrorDetails) -> str:
    kind = detail["type"]
    context = detail.get("ctx") or {}
    if kind in _FIXED:
        return _FIXED[kind]
    if kind in ("string_too_short", "too_short") and context.get("min_length") == 1:
        return "must not be empty"
    if kind in _BOUNDS:
        return _BOUNDS[kind].format(**context)
    return detail["msg"]


_FIXED = {
    "missing": "required field is missing",
    "extra_forbidden": "unknown field",
    "int_type": "must be an integer",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
    "dict_type": "must be an object",
}
_BOUNDS = {
    "greater_than_equal": "must be >= {ge}",
    "greater_than": "must be > {gt}",
    "less_than_equal": "must be <= {le}",
    "less_than": "must be < {lt}",
    "string_too_short": "must be at least {min_length} characters long",
    "string_too_long": "must be at most {max_length} characters long",
}
