"""Label selector strings in the policy, checked when the policy is read.

`waitForCompletion.podSelector` and `drain.podSelector` are label selectors in the syntax of
`kubectl get -l` (`app=training,tier!=batch`, `queue in (a,b)`, `!preemptible`). The
orchestrator hands the drain's to the API server with its list; a malformed one would fail
those requests in the middle of a rollout, so the policy refuses it up front instead, with
the field's path.

Where the orchestrator already watches the objects, it narrows them down itself with
`matches`, the API server's matching rules (`gpuop.selectors`, the one matcher):
`upgradePolicy.nodeSelector` over the GPU nodes, `waitForCompletion.podSelector` over the
pods of a node that waits for jobs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

from gpuop import selectors as selecting
from gpuop.selectors import terms

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_PREFIX = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_KEY = rf"({_PREFIX}/)?{_NAME}"
_VALUE = rf"({_NAME})?"

_TERMS = (
    re.compile(rf"^!?\s*{_KEY}$"),
    re.compile(rf"^{_KEY}\s*(==|!=|=)\s*{_VALUE}$"),
    re.compile(rf"^{_KEY}\s+(in|notin)\s*\(\s*{_VALUE}(\s*,\s*{_VALUE})*\s*\)$"),
    re.compile(rf"^{_KEY}\s*[<>]\s*-?[0-9]+$"),
)
MAX_LENGTH = 4096


def is_valid(selector: str) -> bool:
    """Whether `selector` is empty (selects everything) or a well-formed label selector."""
    if not selector.strip():
        return True
    return all(
        any(pattern.match(term) for pattern in _TERMS) and _prefix_fits(term)
        for term in terms(selector)
    )


def _prefix_fits(term: str) -> bool:
    key = re.split(r"[\s=!<>(]", term.lstrip("!").strip(), maxsplit=1)[0]
    prefix, _, _ = key.rpartition("/")
    return len(prefix) <= 253


def _check(selector: str) -> str:
    if not is_valid(selector):
        raise PydanticCustomError(
            "label_selector",
            'must be a label selector such as "app=training,tier!=batch"',
        )
    return selector


def matches(selector: str, labels: Mapping[str, str]) -> bool:
    """Whether `labels` satisfy every requirement of `selector` (a valid one: see
    `is_valid`), as the API server decides it (`gpuop.selectors`)."""
    return selecting.matches(selecting.parse(selector), labels)


LabelSelector = Annotated[str, Field(max_length=MAX_LENGTH), AfterValidator(_check)]
"""A label selector string; empty selects every pod."""
