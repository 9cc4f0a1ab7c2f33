"""Label and field selectors, as list and watch requests and PodDisruptionBudgets use them.

``LabelSelector.parse`` reads the ``labelSelector`` query parameter (``k=v``, ``k==v``,
``k!=v``, ``k``, ``!k``, ``k in (a,b)``, ``k notin (a,b)``, ``k>n``, ``k<n``, comma-separated
conjunctions); ``LabelSelector.from_spec`` reads a ``metav1.LabelSelector`` object
(``matchLabels``, ``matchExpressions``). ``FieldSelector.parse`` reads ``fieldSelector``
with ``=``, ``==`` and ``!=`` over the fields each resource supports. Called by the HTTP
layer for list/watch, by the PDB controller and by eviction.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gpuop_sim.apiserver import errors

Obj = dict[str, Any]

_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_EXISTS = re.compile(rf"^(?P<key>{_KEY})$")
_NOT_EXISTS = re.compile(rf"^!\s*(?P<key>{_KEY})$")
_SET = re.compile(rf"^(?P<key>{_KEY})\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$")
_EQUALITY = re.compile(rf"^(?P<key>{_KEY})\s*(?P<op>==|!=|=)\s*(?P<value>{_VALUE})$")
_ORDER = re.compile(rf"^(?P<key>{_KEY})\s*(?P<op>[<>])\s*(?P<value>-?\d+)$")
_SET_VALUE = re.compile(rf"^{_VALUE}$")


@dataclass(frozen=True)
class Requirement:
    """One term of a label selector."""

    key: str
    operator: str
    """``In``, ``NotIn``, ``Exists``, ``DoesNotExist``, ``Gt`` or ``Lt``."""
    values: frozenset[str] = frozenset()

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key, "")
        if self.operator == "In":
            return present and value in self.values
        if self.operator == "NotIn":
            return not present or value not in self.values
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        if not present:
            return False
        try:
            number = int(value)
        except ValueError:
            return False
        bound = int(next(iter(self.values)))
        return number > bound if self.operator == "Gt" else number < bound


def _split_terms(text: str) -> list[str]:
    """Split on commas that are not inside ``( )``."""
    terms: list[str] = []
    depth = 0
    current = ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append(current.strip())
            current = ""
        else:
            current += char
    terms.append(current.strip())
    return terms


@dataclass(frozen=True)
class LabelSelector:
    """A conjunction of requirements; the empty selector matches everything."""

    requirements: tuple[Requirement, ...] = ()

    @staticmethod
    def parse(text: str) -> LabelSelector:
        if not text.strip():
            return LabelSelector()
        return LabelSelector(tuple(_parse_term(term) for term in _split_terms(text)))

    @staticmethod
    def from_spec(spec: Obj | None) -> LabelSelector | None:
        """A ``metav1.LabelSelector``; None when nil or empty, which callers such as the
        disruption controller treat as matching nothing."""
        if not spec or not (spec.get("matchLabels") or spec.get("matchExpressions")):
            return None
        requirements = [
            Requirement(key, "In", frozenset({value}))
            for key, value in sorted((spec.get("matchLabels") or {}).items())
        ]
        for expression in spec.get("matchExpressions") or []:
            requirements.append(
                Requirement(
                    expression["key"],
                    expression["operator"],
                    frozenset(expression.get("values") or ()),
                )
            )
        return LabelSelector(tuple(requirements))

    def matches(self, obj: Obj) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(requirement.matches(labels) for requirement in self.requirements)


def _parse_term(term: str) -> Requirement:
    if match := _NOT_EXISTS.match(term):
        return Requirement(match["key"], "DoesNotExist")
    if match := _EXISTS.match(term):
        return Requirement(match["key"], "Exists")
    if match := _SET.match(term):
        values = [value.strip() for value in match["values"].split(",")]
        if not all(_SET_VALUE.match(value) for value in values):
            raise errors.bad_request(f"unable to parse requirement: invalid values in {term!r}")
        return Requirement(
            match["key"], "In" if match["op"] == "in" else "NotIn", frozenset(values)
        )
    if match := _EQUALITY.match(term):
        operator = "NotIn" if match["op"] == "!=" else "In"
        return Requirement(match["key"], operator, frozenset({match["value"]}))
    if match := _ORDER.match(term):
        return Requirement(
            match["key"], "Gt" if match["op"] == ">" else "Lt", frozenset({match["value"]})
        )
    raise errors.bad_request(f"unable to parse requirement: {term!r}")


BASE_FIELD_LABELS = ("metadata.name", "metadata.namespace")

# Fields whose Go type is bool: an unset value reads as "false", as fields.Set has it.
_BOOLEAN_FIELDS = frozenset({"spec.unschedulable"})


def field_value(obj: Obj, label: str) -> str:
    """The string a field selector compares against, as the API server derives it."""
    value: Any = obj
    for part in label.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "false" if label in _BOOLEAN_FIELDS else ""
    return str(value)


@dataclass(frozen=True)
class FieldTerm:
    label: str
    equal: bool
    value: str


@dataclass(frozen=True)
class FieldSelector:
    """A conjunction of ``field=value`` / ``field!=value`` terms."""

    terms: tuple[FieldTerm, ...] = ()

    @staticmethod
    def parse(text: str, supported: tuple[str, ...]) -> FieldSelector:
        if not text.strip():
            return FieldSelector()
        terms: list[FieldTerm] = []
        for term in text.split(","):
            match = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|!=|=)\s*(.*?)\s*$", term)
            if match is None:
                raise errors.bad_request(f"invalid selector: '{text}'; can't understand '{term}'")
            label, operator, value = match.groups()
            if label not in BASE_FIELD_LABELS and label not in supported:
                raise errors.bad_request(f"field label not supported: {label}")
            terms.append(FieldTerm(label, operator != "!=", value))
        return FieldSelector(tuple(terms))

    def matches(self, obj: Obj) -> bool:
        return all(
            (field_value(obj, term.label) == term.value) == term.equal for term in self.terms
        )
