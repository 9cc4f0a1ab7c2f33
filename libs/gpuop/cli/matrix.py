"""The fleet's driver matrix: which packages (version, flavour, kernel, architecture) the
nodes need and a driver source lacks, and the `gpuop package build` command for each.

Called by `gpuop package plan` and `gpuop package build --missing` (`gpuop.cli.package`), which
read the fleet as `gpuop upgrade plan` does (`gpuop.cli.upgrade.read`), and by `gpuop upgrade
start`, which refuses a version whose matrix is incomplete before it edits the policy. Each
managed node that does not run its pool's versions yet needs, for each component, the
package of the version its pool asks for, built for the kernel it runs, of the kernel modules
its pool's `kernelModuleType` resolves to (`gpuop.policy.flavours`: `auto` from the node's
inventory when the event log was read, else by the version's branch), for its architecture
(the `kubernetes.io/arch` label, else the inventory's machine, else the kernel release's
Debian suffix). Whether the
source has it is the node's own selection (`gpuop.cli.coverage.missing`, so a format-1
package serves either flavour). Nodes needing the same package are one row.

`auto` resolved without the node's GPUs is a guess: where `decided_only` is asked for (`upgrade
start`, which must not refuse on a guess), such a node needs the version for its kernel in
any flavour; the plan keeps the guess, since it has to name a flavour to build.

The source's index lists no architecture: a package is chosen by its kernel release, which
names the architecture it was built for (Debian's `6.1.0-57-amd64`, `6.1.0-57-arm64`), so
the architecture is shown and decides only whether `gpuop package build` can make it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpuop.cli import coverage, reports, snapshots
from gpuop.cli.errors import CommandFailed
from gpuop.events.driver import Component
from gpuop.host import branches, packaging
from gpuop.policy import GPUClusterPolicySpec, flavours, selectors
from gpuop.saga.upgrade.records import Target, desired_targets
from gpuop.services.driver_manager import facade as driver_manager

ARCH_LABEL = "kubernetes.io/arch"
"""The node's architecture, as the kubelet labels it (`amd64`, `arm64`)."""
DEFAULT_ARCH = "amd64"
KERNEL_ARCHES = ("amd64", "arm64")
"""Debian's kernel flavours, the last part of its kernel releases (`6.1.0-57-arm64`)."""
MACHINES = {"x86_64": "amd64", "aarch64": "arm64"}
"""`uname -m` (the inventory's `machine`) to Debian's and Kubernetes' architecture names."""
BUILDABLE_ARCHES = frozenset(branches.ARCHES)
"""Architectures `gpuop package build --from-debian` builds packages for."""
KERNEL_RELEASE = re.compile(r"[0-9][A-Za-z0-9._+~-]{0,127}")
"""What `uname -r` can say: anything else in an inventory is not a kernel to build for."""


@dataclass(frozen=True)
class Package:
    """One package the fleet needs and the source lacks."""

    component: Component
    version: str
    flavour: str | None
    """The kernel modules (None: any, OFED or an unresolved `auto`)."""
    kernel: str
    arch: str
    source: str
    nodes: tuple[str, ...]
    has: tuple[str, ...] = ()
    """The flavours the source has the version in for this kernel (`()`: none)."""

    def build_command(self) -> str | None:
        """The `gpuop package build` that makes it into its source; None where none can
        (`why_not_buildable`)."""
        if self.why_not_buildable() is not None:
            return None
        words = ["gpuop", "package", "build", "--from-debian", "--version", self.version]
        words += ["--flavour", str(self.flavour), "--kernel", self.kernel]
        words += ["--arch", self.arch] if self.arch != DEFAULT_ARCH else []
        words += ["--out", self.source]
        return shlex.join(words)

    def why_not_buildable(self) -> str | None:
        """Why `gpuop package build` cannot build it, or None."""
        if self.component is not Component.GPU:
            return f"gpuop package build builds GPU drivers only, not {self.component}"
        if self.flavour is None:
            return (
                "kernelModuleType auto, the nodes' GPUs unseen: gpuop package plan --nats "
                "resolves the flavour from their inventories"
            )
        if self.arch not in BUILDABLE_ARCHES:
            return f"gpuop package build builds {', '.join(sorted(BUILDABLE_ARCHES))} only"
        if "://" in self.source and not self.source.startswith("file://"):
            return "the source is a URL: build into its directory, then publish it"
        return None

    def describe(self) -> str:
        """`gpu 535.261.03 open for kernel 6.1.0-57-amd64 (amd64): nodes a, b`."""
        flavour = f" {self.flavour}" if self.flavour else ""
        there = f" (the source has it for this kernel: {', '.join(self.has)})" if self.has else ""
        return (
            f"{self.component} {self.version}{flavour} for kernel {self.kernel} ({self.arch})"
            f"{there}: nodes {', '.join(self.nodes)}"
        )

    def document(self) -> dict[str, object]:
        return {
            "component": str(self.component),
            "version": self.version,
            "flavour": self.flavour,
            "kernel": self.kernel,
            "arch": self.arch,
            "source": self.source,
            "nodes": list(self.nodes),
            "flavoursInSource": list(self.has),
            "command": self.build_command(),
            "notBuildable": self.why_not_buildable(),
        }


def architecture(view: snapshots.NodeView) -> str:
    """The node's architecture: its `kubernetes.io/arch` label, else its inventory's machine
    (`uname -m`), else its kernel release's Debian flavour, else amd64."""
    labelled = view.labels.get(ARCH_LABEL)
    if labelled:
        return labelled
    machine = view.inventory.machine if view.inventory is not None else ""
    if machine in MACHINES:
        return MACHINES[machine]
    suffix = (view.kernel or "").rsplit("-", 1)[-1]
    return suffix if suffix in KERNEL_ARCHES else DEFAULT_ARCH


def wanted(
    snapshot: snapshots.Snapshot,
    spec: GPUClusterPolicySpec,
    *,
    source: str | None = None,
    decided_only: bool = False,
) -> list[coverage.Wanted]:
    """What each managed node not yet running its versions is to install, with its kernel,
    for the GPU driver in the kernel modules its pool resolves to (see the module docstring);
    `source`: every target's source replaced by it (the source being filled)."""
    found = []
    for view in reports.managed(snapshot):
        if reports.state_of(view, spec) is reports.S.UPGRADE_DONE:
            continue
        pool = reports.pool_of(view, spec)
        try:
            gpu, _ = spec.driver.components_of(pool)
            flavour = flavours.resolve(gpu.kernel_module_type, view.inventory, gpu.version)
            guessed = gpu.kernel_module_type == "auto" and view.inventory is None
            chosen = None if decided_only and guessed else flavour.flavour
            targets = desired_targets(spec, pool, chosen)
        except KeyError:
            continue
        running = snapshots.running_versions(view)
        for component, target in targets.items():
            if running.get(component) == target.version:
                continue
            if source is not None:
                target = target.model_copy(update={"source": source})
            found.append(coverage.Wanted(view.name, view.kernel, component, target))
    return found


def lacking(checked: coverage.Coverage, snapshot: snapshots.Snapshot) -> tuple[Package, ...]:
    """The gaps of `checked`, one row per package, with the architecture of its nodes."""
    rows: dict[tuple[Component, str, str | None, str, str, str], list[coverage.Gap]] = {}
    for gap in checked.gaps:
        view = snapshot.nodes.get(gap.node)
        arch = architecture(view) if view is not None else DEFAULT_ARCH
        key = (gap.component, gap.version, gap.flavour, gap.kernel, arch, gap.source)
        rows.setdefault(key, []).append(gap)
    return tuple(
        Package(
            component=component,
            version=version,
            flavour=flavour,
            kernel=kernel,
            arch=arch,
            source=source,
            nodes=tuple(sorted(g.node for g in gaps)),
            has=gaps[0].has,
        )
        for (component, version, flavour, kernel, arch, source), gaps in sorted(
            rows.items(), key=lambda item: tuple(str(part) for part in item[0])
        )
    )


def describe(packages: Iterable[Package]) -> list[str]:
    """Each package and, indented, the command that builds it (or why none does)."""
    lines = []
    for package in packages:
        lines.append(package.describe())
        command = package.build_command()
        why = package.why_not_buildable()
        lines.append(f"    {command}" if command else f"    not buildable: {why}")
    return lines


def selected_by(snapshot: snapshots.Snapshot, spec: GPUClusterPolicySpec) -> snapshots.Snapshot:
    """The snapshot with each node's `selected` as `spec`'s `nodeSelector` has it (the policy
    `upgrade start` is about to write, not the one read)."""
    selector = spec.upgrade_policy.node_selector
    nodes: Mapping[str, snapshots.NodeView] = {
        name: dataclasses.replace(view, selected=selectors.matches(selector, view.labels))
        for name, view in snapshot.nodes.items()
    }
    return dataclasses.replace(snapshot, nodes=dict(nodes))


@dataclass(frozen=True)
class Plan:
    """What `gpuop package plan` found."""

    source: str
    packages: tuple[Package, ...]
    """The packages the fleet needs and the source lacks."""
    needed: int
    """Packages the fleet needs in all (those the source has included)."""
    unknown_kernels: tuple[str, ...] = ()
    """Nodes whose kernel nobody reported: not planned for."""

    def document(self) -> dict[str, object]:
        return {
            "source": self.source,
            "needed": self.needed,
            "missing": [package.document() for package in self.packages],
            "unknownKernels": list(self.unknown_kernels),
        }

    def lines(self) -> list[str]:
        if self.packages:
            head = (
                f"driver source {self.source} lacks {len(self.packages)} of the "
                f"{self.needed} package(s) the fleet needs:"
            )
        else:
            head = f"driver source {self.source} has all {self.needed} package(s) the fleet needs"
        lines = [head, *(f"  {line}" for line in describe(self.packages))]
        if self.unknown_kernels:
            lines.append(f"  kernel not known, not planned: {', '.join(self.unknown_kernels)}")
        return lines


async def plan(snapshot: snapshots.Snapshot, source: str) -> Plan:
    """The packages the fleet of `snapshot` needs from `source` (a directory or URL) and
    `source` lacks. `CommandFailed` in one line for a policy to plan with missing, a node whose
    inventory names no kernel release, a source whose index cannot be read; a directory
    without an index yet is an empty source."""
    policy = snapshot.policy
    if policy is None or policy.spec is None:
        why = policy.invalid if policy else "the event log holds no PolicyApplied"
        raise CommandFailed(f"no valid GPUClusterPolicy to plan with: {why}")
    spec = policy.spec
    items = wanted(snapshot, spec, source=source)
    for item in items:
        if item.kernel is not None and not KERNEL_RELEASE.fullmatch(item.kernel):
            raise CommandFailed(
                f"node {item.node}'s inventory names kernel {item.kernel!r}, not a kernel "
                "release: fix its discovery (or its status.nodeInfo) before planning"
            )
    index = await _read_index(source, Target.of(spec.driver.gpu))
    checked = coverage.missing(items, {source: index})
    rows = {(i.component, i.target.version, i.target.flavour, i.kernel) for i in items if i.kernel}
    return Plan(source, lacking(checked, snapshot), len(rows), checked.unknown_kernels)


async def _read_index(source: str, trust: Target) -> driver_manager.SourceIndex:
    """The index of `source`, with the policy's keys but unsigned allowed: the plan asks what
    the source holds, whether the nodes will trust it is `gpuop upgrade start`'s check."""
    if "://" not in source or source.startswith("file://"):
        local = Path(source.removeprefix("file://"))
        if not await asyncio.to_thread(local.is_dir):
            raise CommandFailed(f"driver source {source}: no such directory (mkdir it first)")
        if not await asyncio.to_thread((local / packaging.INDEX).exists):
            return driver_manager.SourceIndex()
    target = trust.model_copy(update={"source": source, "allow_unsigned": True})
    indexes, unchecked, refused = await coverage.read_indexes({source: target})
    if source in indexes:
        return indexes[source]
    why = unchecked.get(source, "").removeprefix("not checked: ") or refused.get(source, "")
    raise CommandFailed(f"driver source {source}: cannot read its index: {why}")
