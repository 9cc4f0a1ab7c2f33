"""`driver.gpu.kernelModuleParameters`: the parameters NVIDIA's kernel modules are loaded
with, per module, as upstream GPU Operator's `kernelModuleConfig` file carries them, but
structured:

    kernelModuleParameters:
      nvidia: {NVreg_EnableGpuFirmware: 0, NVreg_RegistryDwords: "RMUseSwI2c=0x01"}
      nvidia_uvm: {uvm_disable_hmm: "Y"}

The default `driver.gpu` and each pool's `gpu` carry their own (a pool's `gpu` set without
them loads the modules with none). Reading the policy checks the shape only: one of the five
modules, a parameter name the kernel could declare, an integer or a text with no blank or
quote in it (modprobe would split it); a `bool` is `Y` or `N`, as sysfs shows it.

Whether the module declares the parameter, and with which type, is `check_declared` against
the `parm:` entries of the package's modules (`modinfo`), as the driver source's index lists
them: `gpuop upgrade start` refuses a misspelt name there, naming the nearest declared ones,
before any node is drained for a load that would fail.

`options` turns them into the `name=value` words `modprobe` takes, which the driver-manager
commands carry and the node's state records.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, Field, StrictInt
from pydantic_core import PydanticCustomError

from gpuop import moduleparams
from gpuop.policy.fields import Section

MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm", "nvidia_peermem")
"""The modules of the GPU driver that take parameters from the policy."""

PARAMETER_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"
"""A module parameter's name: a C identifier, as `module_param` declares it."""
VALUE_PATTERN = r"^[^\s\"'\\]{1,1024}$"
"""A text value: no blank, quote or backslash, which modprobe's option parsing would change."""
MAX_PARAMETERS = 64
"""The most parameters one module may be given."""

_NAME = re.compile(PARAMETER_PATTERN)
_VALUE = re.compile(VALUE_PATTERN)


def _check_parameters(given: Mapping[str, int | str]) -> Mapping[str, int | str]:
    # The CRD's schema cannot constrain a map's keys: the names are checked here alone.
    for name, value in given.items():
        if not _NAME.match(name):
            raise PydanticCustomError(
                "module_parameter",
                "{name!r} must be a parameter name such as NVreg_EnableGpuFirmware",
                {"name": name},
            )
        if isinstance(value, str) and not _VALUE.match(value):
            raise PydanticCustomError(
                "module_parameter",
                "{name}: must be an integer, or text of 1 to 1024 characters without blanks, "
                "quotes or backslashes",
                {"name": name},
            )
    return given


Value = Annotated[StrictInt | str, Field(json_schema_extra={"x-kubernetes-int-or-string": True})]
Parameters = Annotated[
    Mapping[str, Value], Field(max_length=MAX_PARAMETERS), AfterValidator(_check_parameters)
]
"""One module's parameters: name to an integer or text (`Y`/`N` for a `bool`, as sysfs shows
it, `0x1` for hex, `a=1;b=2` for `NVreg_RegistryDwords`)."""


def _module(name: str) -> Any:
    return Field(default=None, alias=name, description=f"The parameters of `{name}`.")


class ModuleParameters(Section):
    """Parameters by module; each module's name is its own field, as `modprobe` spells it."""

    nvidia: Parameters | None = _module("nvidia")
    nvidia_uvm: Parameters | None = _module("nvidia_uvm")
    nvidia_modeset: Parameters | None = _module("nvidia_modeset")
    nvidia_drm: Parameters | None = _module("nvidia_drm")
    nvidia_peermem: Parameters | None = _module("nvidia_peermem")

    def by_module(self) -> dict[str, Mapping[str, int | str]]:
        """Module name to its parameters, leaving out modules given none."""
        return {m: given for m in MODULES if (given := getattr(self, m))}


_NEAREST = 3


def options(parameters: ModuleParameters | None) -> dict[str, dict[str, str]]:
    """`parameters` as modprobe's words: an integer its decimal digits, text as it is.
    Modules and parameters sorted, so two equal policies give equal commands."""
    if parameters is None:
        return {}
    return {
        module: {name: str(value) for name, value in sorted(given.items())}
        for module, given in sorted(parameters.by_module().items())
    }


def check_declared(
    parameters: ModuleParameters | None, declared: Mapping[str, Mapping[str, str]]
) -> list[str]:
    """What is wrong with `parameters` for a package whose modules declare `declared`
    (module to `{parameter: modinfo type}`, `int`, `charp`, `array of uint`, ...): one line
    per module the package lacks, parameter it does not declare (with the nearest it does),
    or value of the wrong type. Empty when the package takes them all."""
    problems: list[str] = []
    wanted = parameters.by_module() if parameters is not None else {}
    for module, given in sorted(wanted.items()):
        if module not in declared:
            having = ", ".join(sorted(declared)) or "none"
            problems.append(f"{module}: the package has no such module (its modules: {having})")
            continue
        known = declared[module]
        for name, value in sorted(given.items()):
            if name not in known:
                problems.append(f"{module}: no parameter {name}; {_nearest(name, known)}")
                continue
            wrong = moduleparams.value_problem(value, known[name])
            if wrong:
                problems.append(f"{module}.{name}: {wrong}")
    return problems


def _nearest(name: str, known: Mapping[str, str]) -> str:
    lower = {k.lower(): k for k in known}  # a name misspelt in case only is the nearest
    close = [lower[k] for k in difflib.get_close_matches(name.lower(), lower, _NEAREST, 0.6)]
    if not close:  # case only, or far off: show those sharing its prefix
        prefix = name.split("_", 1)[0].lower() + "_"
        close = sorted(k for k in known if k.lower().startswith(prefix))[:_NEAREST]
    if close:
        return "did you mean " + " or ".join(close) + f"? ({len(known)} declared)"
    return f"it declares {', '.join(sorted(known)[:8]) or 'none'}"
