"""What the policy tests share: the problems an invalid spec is refused with, and whether
the CRD's schema and the models agree on a spec."""

from __future__ import annotations

from typing import Any

import pytest

from gpuop.policy import PolicyInvalid, validate_spec
from gpuop.policy import crd as crds
from gpuop_sim.apiserver import schemas


def problems(raw: Any) -> list[str]:
    """The problems `validate_spec` refuses `raw` with, as the condition shows them."""
    with pytest.raises(PolicyInvalid) as refused:
        validate_spec(raw)
    return [str(problem) for problem in refused.value.problems]


def assert_schema_agrees(raw: dict[str, Any]) -> None:
    """The API server (the CRD's schema) accepts the spec `raw` exactly when the models do."""
    try:
        validate_spec(raw)
        model_accepts = True
    except PolicyInvalid:
        model_accepts = False

    schema_errors = schemas.validate_object({"spec": raw}, crds.schema())

    assert (not schema_errors) == model_accepts, schema_errors
