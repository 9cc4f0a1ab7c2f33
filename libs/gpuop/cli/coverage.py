"""Whether the policy's driver sources have a package for every node's kernel: the check
`gpuop upgrade plan` runs before it forecasts anything.

A driver package is built for one kernel release (`index.json` lists each with its
`kernel_release`), and a node installs the one built for the kernel it runs. A rollout to a
version whose source lacks some node's kernel would cordon and drain that node, then fail it
at the install; the plan refuses it instead, naming the nodes and their kernels. The GPU
driver's package must also be of the kernel modules the node is to run (its target's
flavour: the policy's `kernelModuleType`, `auto` resolved per node by `gpuop.policy.flavours`),
chosen as the node chooses (`driver_manager.select`: a format-1 package serves either); a kernel
with builds of the other modules only is named with the flavours the source has for it.

`missing` is pure: the nodes (with the kernel each runs, `status.nodeInfo.kernelVersion` or
discovery's inventory), the components and versions they are to run, and the sources'
indexes. `read_indexes` reads each source named in the policy once, through the
driver-manager's own source code (`driver_manager.open_source`), so the index is trusted exactly
as a node trusts it (the policy's keys, `allowUnsigned`). A source this machine cannot
reach (a directory that exists only on the nodes, a URL behind their network) is reported
as not checked, not as a refusal. A component without a source (the package must already be
on the host) is not checked.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpuop.events import driver as dm
from gpuop.events.driver import Component, InstallFailureReason
from gpuop.saga.upgrade.records import Target
from gpuop.services.driver_manager import facade as driver_manager

CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 30.0
MAX_INDEX_BYTES = 64 << 20
"""Only the index is read, never a package."""


@dataclass(frozen=True)
class Wanted:
    """What one node is to run: a component's target, for the kernel the node runs."""

    node: str
    kernel: str | None
    """None: unknown, so not checked."""
    component: Component
    target: Target


@dataclass(frozen=True)
class Gap:
    """A node whose kernel has no package of its target in the source."""

    node: str
    kernel: str
    component: Component
    version: str
    source: str
    flavour: str | None = None
    """The kernel modules the node is to run (the target's), None: any."""
    has: tuple[str, ...] = ()
    """The flavours the source has the version in for the node's kernel (`()`: none)."""


@dataclass(frozen=True)
class Coverage:
    """What the check found."""

    gaps: tuple[Gap, ...] = ()
    unchecked: Mapping[str, str] = field(default_factory=dict)
    """Source -> why it was not checked (unreachable from here)."""
    unknown_kernels: tuple[str, ...] = ()
    """Nodes whose kernel nobody reported."""
    refused: Mapping[str, str] = field(default_factory=dict)
    """Source -> why its index is unusable (untrusted, not an index): every node fails."""

    @property
    def blocking(self) -> bool:
        """The rollout would fail nodes at their install: the plan refuses it."""
        return bool(self.gaps or self.refused)

    def describe(self) -> list[str]:
        """The refusal (or the notes) in lines, each gap with its node and kernel."""
        lines = []
        by_source: dict[tuple[str, Component, str, str | None, tuple[str, ...]], list[Gap]] = {}
        for gap in self.gaps:
            key = (gap.source, gap.component, gap.version, gap.flavour, gap.has)
            by_source.setdefault(key, []).append(gap)
        for (source, component, version, flavour, has), gaps in by_source.items():
            kernels = sorted({g.kernel for g in gaps})
            # a kernel with builds of other modules only: say which modules are there
            wanted = f"{component} {version} {flavour}" if has else f"{component} {version}"
            there = f" (it has for it: {', '.join(has)})" if has else ""
            lines.append(
                f"driver source {source} has no {wanted} package for kernel "
                f"{', '.join(kernels)}{there}: nodes "
                + ", ".join(f"{g.node} ({g.kernel})" for g in sorted(gaps, key=lambda g: g.node))
            )
        lines += [f"driver source {s}: {why}" for s, why in sorted(self.refused.items())]
        return lines

    def document(self) -> dict[str, object]:
        return {
            "missingPackages": [
                {
                    "node": g.node,
                    "kernel": g.kernel,
                    "component": str(g.component),
                    "version": g.version,
                    "source": g.source,
                    "flavour": g.flavour,
                    "flavoursInSource": list(g.has),
                }
                for g in self.gaps
            ],
            "refusedSources": dict(self.refused),
            "uncheckedSources": dict(self.unchecked),
            "unknownKernels": list(self.unknown_kernels),
        }


def missing(
    wanted: Iterable[Wanted],
    indexes: Mapping[str, driver_manager.SourceIndex],
    unchecked: Mapping[str, str] | None = None,
    refused: Mapping[str, str] | None = None,
) -> Coverage:
    """The nodes of `wanted` whose kernel has no package of their target (of its flavour,
    when it names one) in its source's index (`indexes`, by source URI; a source absent
    from it is not checked), by the driver-manager's own selection (`driver_manager.select`)."""
    gaps = []
    unknown = set()
    for item in wanted:
        source = item.target.source
        if source is None or source not in indexes:
            continue
        if item.kernel is None:
            unknown.add(item.node)
            continue
        version, flavour = item.target.version, item.target.flavour
        index = indexes[source]
        try:
            # the node's own choice (a format-1 package serves either flavour)
            driver_manager.select(index, source, item.component, version, item.kernel, flavour)
        except driver_manager.SourceError:
            has = driver_manager.flavours_for(index, item.component, version, item.kernel)
            gap = Gap(item.node, item.kernel, item.component, version, source, flavour, has)
            gaps.append(gap)
    return Coverage(
        gaps=tuple(sorted(gaps, key=lambda g: (g.node, g.component))),
        unchecked=dict(unchecked or {}),
        unknown_kernels=tuple(sorted(unknown)),
        refused=dict(refused or {}),
    )


async def check(wanted: Iterable[Wanted]) -> Coverage:
    """`missing`, with each source the wanted targets name read once (`read_indexes`)."""
    items = list(wanted)
    targets = {i.target.source: i.target for i in items if i.target.source is not None}
    indexes, unchecked, refused = await read_indexes(targets)
    return missing(items, indexes, unchecked, refused)


async def read_indexes(
    targets: Mapping[str, Target],
) -> tuple[dict[str, driver_manager.SourceIndex], dict[str, str], dict[str, str]]:
    """Each source's index, trusted with its target's keys; the sources not reachable from
    here, and those whose index a node would refuse, each with why."""
    indexes: dict[str, driver_manager.SourceIndex] = {}
    unchecked: dict[str, str] = {}
    refused: dict[str, str] = {}
    for uri, target in targets.items():
        trust = dm.DriverSource(
            uri=uri,
            public_keys=target.public_keys,
            allow_unsigned=target.allow_unsigned,
            ca_bundle=target.ca_bundle,
        )
        try:
            source = driver_manager.open_source(
                trust,
                connect_timeout=CONNECT_TIMEOUT,
                read_timeout=READ_TIMEOUT,
                max_bytes=MAX_INDEX_BYTES,
            )
            indexes[uri] = await source.index()
        except driver_manager.SourceError as error:
            if error.reason is InstallFailureReason.SOURCE_UNREACHABLE:
                unchecked[uri] = f"not checked: {error}"
            else:
                refused[uri] = str(error)
    return indexes, unchecked, refused
