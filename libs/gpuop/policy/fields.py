"""The base of every policy section and the constrained types they share.

`Section` fixes how the `GPUClusterPolicy` spec reads on the wire: camelCase names
(`maxUnavailable`), snake_case attributes (`max_unavailable`), strict types (a YAML `5` is not
a string, `"5"` is not an integer, exactly as the API server's schema check sees them), and
unknown fields refused so that a typo is reported instead of silently ignored. The attribute
docstrings become the descriptions of the CRD schema (`gpuop.policy.crd`), which is what
`kubectl explain gpuclusterpolicy.spec` shows.

Errors raised by validators here and in the section modules are `PydanticCustomError`s whose
message is the text an operator reads after the field path; `gpuop.policy.validation` adds the
path. A validator that checks one field of a model from the model's level names that field
with `context={"field": "<camelCase name>"}`.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

MAX_SECONDS = 7 * 86400
"""The longest timeout, deadline or backoff a policy may set: a week, as agents accept."""


class Section(BaseModel):
    """A part of the cluster policy spec: frozen, strict, camelCase on the wire."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        frozen=True,
        strict=True,
        extra="forbid",
        use_attribute_docstrings=True,
    )


TimeoutSeconds = Annotated[int, Field(ge=0, le=MAX_SECONDS)]
"""An upstream-style timeout in seconds, where 0 means "no timeout of its own"."""
DeadlineSeconds = Annotated[int, Field(ge=1, le=MAX_SECONDS)]
"""A deadline in seconds: always bounded, never "forever"."""


def matching(pattern: str, message: str) -> AfterValidator:
    """A check that a string matches `pattern`, refusing it with `message` (pydantic's own
    words quote the regular expression). Pair it with
    `Field(json_schema_extra={"pattern": pattern})` so the CRD checks the same."""
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if not compiled.match(value):
            raise PydanticCustomError("pattern", message)
        return value

    return AfterValidator(check)
