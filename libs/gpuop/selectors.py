"""Label selectors, matched as the API server matches them: one model for both spellings.

A selector is a conjunction of `Requirement`s. `parse` reads the string form
(`kubectl get -l`: `app=training,tier!=batch`, `queue in (a,b)`, `!preemptible`, `gen>3`);
`from_label_selector` reads a Kubernetes `LabelSelector` object (`matchLabels`,
`matchExpressions`). `matches` decides both alike: `k!=v` and `k notin (..)` also hold when
`k` is absent, `k>n` and `k<n` need an integer value, and an operator this does not know
selects nothing. Checking a string is well-formed is the policy's (`gpuop.policy.selectors`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Requirement:
    """One requirement on one label key."""

    key: str
    operator: str
    """`=`, `!=`, `in`, `notin`, `exists`, `!` (does not exist), `>` or `<`."""
    values: tuple[str, ...] = ()

    def satisfied(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.operator in ("=", "in"):
            return value is not None and value in self.values
        if self.operator in ("!=", "notin"):
            return value is None or value not in self.values
        if self.operator == "exists":
            return value is not None
        if self.operator == "!":
            return value is None
        if self.operator in (">", "<") and value is not None:
            try:
                number, bound = int(value), int(self.values[0])
            except (ValueError, IndexError):
                return False
            return number > bound if self.operator == ">" else number < bound
        return False


def matches(requirements: Iterable[Requirement], labels: Mapping[str, str]) -> bool:
    """Whether `labels` satisfy every requirement (none: every labels do)."""
    return all(requirement.satisfied(labels) for requirement in requirements)


def terms(selector: str) -> list[str]:
    """The comma-separated requirements of `selector`, commas inside `( )` kept."""
    found: list[str] = []
    depth = 0
    current: list[str] = []
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            found.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    found.append("".join(current).strip())
    return found


_SET = re.compile(r"^(?P<key>[^\s!=<>()]+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$")
_COMPARED = re.compile(r"^(?P<key>[^\s!=<>()]+)\s*(?P<op>==|!=|=|<|>)\s*(?P<value>\S*)$")


def parse(selector: str) -> tuple[Requirement, ...]:
    """The requirements of a string selector (a well-formed one; empty selects all)."""
    return tuple(_requirement(term) for term in terms(selector) if term)


def _requirement(term: str) -> Requirement:
    if term.startswith("!"):
        return Requirement(term[1:].strip(), "!")
    found = _SET.match(term)
    if found:
        values = tuple(v.strip() for v in found["values"].split(","))
        return Requirement(found["key"], found["op"], values)
    found = _COMPARED.match(term)
    if found is None:
        return Requirement(term, "exists")
    operator = "=" if found["op"] == "==" else found["op"]
    return Requirement(found["key"], operator, (found["value"],))


_EXPRESSIONS = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}


def from_label_selector(selector: Mapping[str, Any]) -> tuple[Requirement, ...]:
    """The requirements of a Kubernetes `LabelSelector` object."""
    found = [Requirement(k, "=", (str(v),)) for k, v in (selector.get("matchLabels") or {}).items()]
    for expression in selector.get("matchExpressions") or []:
        operator = _EXPRESSIONS.get(expression.get("operator", ""), "unknown")
        values = tuple(str(v) for v in expression.get("values") or ())
        found.append(Requirement(expression.get("key", ""), operator, values))
    return tuple(found)


def common_labels(
    first: Iterable[Requirement], second: Iterable[Requirement]
) -> dict[str, str] | None:
    """Labels that both selectors select, or None when no node could match both. Each key
    is decided on its own (the requirements on one key never constrain another): a key is
    satisfiable when its absence, a value a requirement names, a value none names, or an
    integer next to a `>`/`<` bound satisfies every requirement on it."""
    by_key: dict[str, list[Requirement]] = {}
    for requirement in (*first, *second):
        by_key.setdefault(requirement.key, []).append(requirement)
    found: dict[str, str] = {}
    for key, requirements in sorted(by_key.items()):
        witness = _witness(requirements)
        if witness is None:
            return None
        if witness is not _ABSENT:
            found[key] = str(witness)
    return found


_ABSENT = object()


def _witness(requirements: list[Requirement]) -> object | None:
    """A value (or `_ABSENT`) of one key that satisfies every requirement on it."""
    named = {value for r in requirements for value in r.values}
    bounds = [
        int(value)
        for r in requirements
        if r.operator in (">", "<")
        for value in r.values[:1]
        if value.lstrip("-").isdigit()
    ]
    spread = len(named) + 1
    numbers = {str(b + step) for b in bounds for step in range(-spread, spread + 1)}
    unnamed = "x" * (max((len(v) for v in named), default=0) + 1)
    for candidate in (_ABSENT, *sorted(named), *sorted(numbers), unnamed):
        labels = {} if candidate is _ABSENT else {"key": str(candidate)}
        if all(Requirement("key", r.operator, r.values).satisfied(labels) for r in requirements):
            return candidate
    return None
