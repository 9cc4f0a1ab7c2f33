"""Whether a driver source offers the version `gpuop upgrade start` asks for: read before
the policy is edited, so a version no source has is refused at the terminal instead of
failing every node of the rollout.

`require` reads the index of the source the policy will name (the `--source` given, else the
policy's own), through the driver-manager's source code (`coverage.read_indexes`: trusted
with the policy's keys, as a node trusts it), and raises `CommandFailed` naming the versions
the source has, or why a node would refuse its index (a signature none of the policy's keys
made). There is no override: a version the source lacks can only fail nodes. A source this
machine cannot reach (a directory only the nodes mount, a URL behind their network) is not
checked, and said so (`gpuop upgrade plan` does the same): the nodes still stage the
package before they are cordoned, so a version missing there fails each node uncordoned,
its workloads running. A component without a source (the package must already be on the
nodes) is not checked.

The GPU driver's version must also come in the kernel modules the policy's
`kernelModuleType` names (a format-1 package serves either, as a node's selection has it:
`driver_manager.select`); with `auto`, which each node resolves from its own GPUs, the flavour the
version's branch recommends is checked and a source without it is noted, not refused.

The policy's `kernelModuleParameters` must be ones the version's modules declare, with values
their types take (`declared_for`, from what the index lists of each package's modules): the
kernel would ignore a misspelt name at the load, silently, so it is refused here, naming the
nearest declared names.
"""

from __future__ import annotations

import re

from gpuop.cli import coverage
from gpuop.cli.errors import CommandFailed
from gpuop.events.driver import Component
from gpuop.policy import parameters
from gpuop.policy.parameters import ModuleParameters
from gpuop.saga.upgrade.records import Target
from gpuop.services.driver_manager import facade as driver_manager

UNCHANGED = "the policy is unchanged"


def offered(index: driver_manager.SourceIndex, component: Component) -> list[str]:
    """The versions of `component` the index lists, for any kernel, oldest first."""
    found = {e.version for e in index.packages if e.component == component}
    return sorted(found, key=_version_key)


def _version_key(version: str) -> tuple[tuple[int, int | str], ...]:
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"[.\-]", version))


async def require(
    component: Component,
    target: Target,
    *,
    flavour_decided: bool = True,
    module_parameters: ModuleParameters | None = None,
) -> str | None:
    """`CommandFailed` unless `target.source` offers `target.version` of `component`, of
    `target.flavour` when it names one (for some kernel: which kernel each node needs is
    `gpuop upgrade plan`'s check), whose modules declare every one of `module_parameters`
    (the policy's `kernelModuleParameters`) with a type its value fits; a note when the
    source could not be read from here (not checked), when it lacks the flavour but
    `flavour_decided` is False (the policy's `auto`, resolved without the nodes' GPUs: a
    node's may pick the other), or when its index does not list what the modules declare,
    else None."""
    uri = target.source
    if uri is None:
        return None
    indexes, unchecked, refused = await coverage.read_indexes({uri: target})
    if uri in unchecked:
        return f"driver source {uri} {unchecked[uri]}; each node checks it before its cordon"
    if uri in refused:
        raise CommandFailed(f"driver source {uri}: {refused[uri]}; {UNCHANGED}")
    versions = offered(indexes[uri], component)
    if target.version not in versions:
        has = ", ".join(versions) if versions else f"no {component} package at all"
        raise CommandFailed(
            f"driver source {uri} has no {component} {target.version} package "
            f"(it has: {has}); {UNCHANGED}"
        )
    if target.flavour is None or in_flavour(indexes[uri], uri, component, target):
        return declared_for(indexes[uri], uri, component, target, module_parameters)
    flavoured = ", ".join(flavours_offered(indexes[uri], component, target.version))
    lacking = (
        f"driver source {uri} has no {component} {target.version} package of the "
        f"{target.flavour} kernel modules for any kernel (it has: {flavoured})"
    )
    if flavour_decided:
        raise CommandFailed(f"{lacking}; {UNCHANGED}")
    return (
        f"{lacking}, which kernelModuleType auto picks for {target.version} on GPUs it "
        "cannot see from here; gpuop upgrade plan checks each node's"
    )


def declared_for(
    index: driver_manager.SourceIndex,
    uri: str,
    component: Component,
    target: Target,
    module_parameters: ModuleParameters | None,
) -> str | None:
    """`CommandFailed` naming each of `module_parameters` that a package of `target`'s
    version (and flavour) does not declare, with the nearest names it does, or whose value
    its type refuses: the kernel would ignore a misspelt one at the load, silently. A note
    when no such package lists what its modules declare (built before they were listed)."""
    if not module_parameters or not module_parameters.by_module():
        return None
    entries = [
        e
        for e in index.packages
        if e.component == component
        and e.version == target.version
        and (target.flavour is None or e.flavour in (None, target.flavour))
    ]
    listed = [e for e in entries if e.parameters is not None]
    if not listed:
        return (
            f"driver source {uri}'s index does not list the parameters its {component} "
            f"{target.version} modules declare: kernelModuleParameters not checked"
        )
    problems = sorted(
        {
            p
            for e in listed
            for p in parameters.check_declared(module_parameters, e.parameters or {})
        }
    )
    if problems:
        raise CommandFailed(
            f"kernelModuleParameters: the {component} {target.version} modules of {uri} "
            f"would not take them ({UNCHANGED}):\n  " + "\n  ".join(problems)
        )
    return None


def in_flavour(
    index: driver_manager.SourceIndex, uri: str, component: Component, target: Target
) -> bool:
    """Whether a node of some kernel the index has `target.version` for would find a package
    of `target.flavour` there, by the node's own selection (`driver_manager.select`)."""
    kernels = {e.kernel_release for e in index.packages if e.component == component}
    for kernel in sorted(kernels):
        try:
            driver_manager.select(index, uri, component, target.version, kernel, target.flavour)
        except driver_manager.SourceError:
            continue
        return True
    return False


def flavours_offered(
    index: driver_manager.SourceIndex, component: Component, version: str
) -> list[str]:
    """The flavours `version` of `component` comes in, over every kernel the index lists."""
    kernels = {e.kernel_release for e in index.packages if e.component == component}
    found = {
        f
        for kernel in kernels
        for f in driver_manager.flavours_for(index, component, version, kernel)
    }
    return sorted(found)
