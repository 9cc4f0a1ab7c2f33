"""Kernel module parameters, the rules the policy, the driver-manager and the simulated
kernel share: what a module declares (`modinfo`'s `parm:` lines), what value fits a declared
type (as the kernel parses it: `kstrtouint`, `kstrtobool`), and the words `modprobe` takes.

    declared(parm_lines)       {name: type} from modinfo's `parm:` values
    value_problem(value, type) why the kernel would refuse `value` for `type`, or None
    words(options)             ("name=value", ...) for `modprobe <module> ...`
    parsed(words)              the inverse, as a stand-in modprobe reads its arguments

A module given a parameter it does not declare loads all the same (the kernel logs
"unknown parameter ignored"): so a misspelt name must be caught before the load, by the
policy's check against what the package declares; a value the type refuses fails the load
("Invalid argument").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

Options = Mapping[str, Mapping[str, str]]
"""Module name to `{parameter: value as modprobe takes it}`."""

_INTEGER_TYPES = {"byte", "short", "ushort", "int", "uint", "long", "ulong", "ullong", "hexint"}
_UNSIGNED = {"byte", "ushort", "uint", "ulong", "ullong", "hexint"}
_BOOL_TYPES = {"bool", "invbool"}
_BOOL_WORDS = {"y", "n", "1", "0"}
_ARRAY = "array of "


def declared(parm_lines: Iterable[str]) -> dict[str, str]:
    """The parameters `modinfo` lists, name to type: `NAME:TYPE` (no description) or
    `NAME:DESCRIPTION (TYPE)`; a parameter without a type is `charp`, which takes any text."""
    found: dict[str, str] = {}
    for line in parm_lines:
        name, _, rest = line.strip().partition(":")
        if not name:
            continue
        rest = rest.strip()
        if rest.endswith(")") and "(" in rest:
            kind = rest[rest.rfind("(") + 1 : -1].strip()
        elif " " not in rest and rest:
            kind = rest
        else:
            kind = "charp"
        found[name] = kind
    return found


def value_problem(value: int | str, kind: str) -> str | None:
    """Why the kernel would refuse `value` for a parameter of modinfo's type `kind`; None when
    it takes it (text types, and types this does not know, take anything)."""
    kind = kind.strip()
    if kind.startswith(_ARRAY):
        element = kind.removeprefix(_ARRAY).strip()
        items = value.split(",") if isinstance(value, str) else [value]
        for item in items:
            wrong = value_problem(item, element)
            if wrong:
                return f"{wrong} (in the {kind} {value!r})"
        return None
    if kind in _BOOL_TYPES:
        if str(value).lower() in _BOOL_WORDS:
            return None
        return f"is a {kind}: Y or N (or 1 or 0), not {value!r}"
    if kind in _INTEGER_TYPES:
        number = _integer(value)
        if number is None:
            return f"is an {kind}: an integer, not {value!r}"
        if kind in _UNSIGNED and number < 0:
            return f"is an {kind}: at least 0, not {value!r}"
    return None


def words(options: Mapping[str, str]) -> tuple[str, ...]:
    """`name=value` for each parameter, sorted by name."""
    return tuple(f"{name}={value}" for name, value in sorted(options.items()))


def parsed(arguments: Iterable[str]) -> dict[str, str]:
    """`name=value` words back to a mapping; a bare `name` is `Y`, as the kernel reads a
    bool given without a value."""
    found: dict[str, str] = {}
    for word in arguments:
        name, equals, value = word.partition("=")
        found[name] = value if equals else "Y"
    return found


def _integer(value: int | str) -> int | None:
    if isinstance(value, int):
        return value
    try:
        return int(value, 0)
    except ValueError:
        return None
