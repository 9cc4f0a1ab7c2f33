"""Kernel compatibility for NVIDIA's module sources: the small patches a build applies where
NVIDIA's own conftest cannot tell a kernel's API apart, and what a failed build says.

NVIDIA's `conftest.sh` probes the kernel headers for each API its modules use and picks a
code path per answer. A distribution kernel that backports an API change without a new
version number, where the driver release predates the change, passes every probe and then
fails to compile. Each `Patch` here names the kernel API, the probe on the headers that tells
the changed API (so it is applied only to kernels that have it), and the one edit of the
driver's source that fits it; `apply` runs every patch whose probe and source both match, and
says which it applied.

    pci-resize-resource-exclude-bars
        Debian's 6.1 kernels since 6.1.0-53 (bookworm security updates) carry the upstream
        change that gave `pci_resize_resource()` a fourth argument, `exclude_bars` (a mask of
        BARs the kernel must leave alone while it moves bridge windows). The 535 open
        modules call it with three (`nvidia/nv-pci.c`, BAR1 resizing), and their conftest has
        no probe for it (535's conftest tests only `pci_rebar_get_possible_sizes`). The patch
        passes 0: no BAR excluded, which is what the three-argument call did (NVIDIA releases
        BAR1 and BAR3 itself before the call), and what in-tree drivers pass.

`diagnose` turns a failed `make modules` into one paragraph: the first compiler error's file
and line, the kernel function it names, and what to do; the whole log stays where the build
wrote it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Patch:
    """One source edit for one kernel API change."""

    name: str
    header: str
    """The header, relative to the kernel headers' common tree, that declares the API."""
    probe: re.Pattern[str]
    """Matches the header's text when the kernel has the changed API."""
    source: str
    """The driver source file, relative to the module tree, that calls the API."""
    call: re.Pattern[str]
    """Matches the call written for the old API (every match is rewritten)."""
    replacement: str
    """`re.sub` replacement of a call."""

    def applies(self, module_tree: Path, kernel_headers: Path) -> bool:
        header, source = kernel_headers / self.header, module_tree / self.source
        if not header.is_file() or not source.is_file():
            return False
        return bool(self.probe.search(_text(header)) and self.call.search(_text(source)))

    def apply(self, module_tree: Path) -> None:
        path = module_tree / self.source
        text = self.call.sub(self.replacement, _text(path))
        path.write_text(text, encoding="utf-8", errors="surrogateescape")


PATCHES = (
    Patch(
        name="pci-resize-resource-exclude-bars",
        header="include/linux/pci.h",
        probe=re.compile(r"pci_resize_resource\([^)]*\bexclude_bars\s*\)", re.S),
        source="nvidia/nv-pci.c",
        call=re.compile(r"pci_resize_resource\((\s*[^,()]+,\s*[^,()]+,\s*[^,()]+)\)"),
        replacement=r"pci_resize_resource(\1, 0)",
    ),
)


def apply(module_tree: Path, kernel_headers: Path) -> list[str]:
    """Apply, in `module_tree` (a copy: it is edited), every patch the kernel whose headers'
    common tree is `kernel_headers` needs; their names."""
    applied = []
    for patch in PATCHES:
        if patch.applies(module_tree, kernel_headers):
            patch.apply(module_tree)
            applied.append(patch.name)
    return applied


_ERROR = re.compile(r"^(?P<file>[^\s:]+\.[ch]):(?P<line>\d+):(?:\d+:)? error: (?P<what>.+)$", re.M)
_FUNCTION = re.compile("['`\u2018](?P<name>[A-Za-z_][A-Za-z0-9_]*)['`\u2019]")
"""A name the compiler quotes: ASCII quotes under LC_ALL=C, typographic ones otherwise."""


def diagnose(log: str, *, driver: str, kernel: str, log_path: Path) -> str | None:
    """One paragraph on a failed module build: where it first failed, the kernel function
    involved, what to do; None when the log holds no compiler error (then its tail says)."""
    error = _ERROR.search(log)
    if error is None:
        return None
    where = f"{error['file'].removeprefix('./')}:{error['line']}"
    function = _FUNCTION.search(error["what"])
    api = f" the kernel API `{function['name']}()`" if function else " a kernel API"
    return (
        f"NVIDIA's {driver} modules do not compile against kernel {kernel}: {where}: "
        f"{error['what'].strip()}. The source uses{api} as an older kernel declared it, and "
        "NVIDIA's conftest did not tell the difference. Build for a kernel the driver "
        "supports, use a newer driver branch, or add a compatibility patch "
        f"(`gpuop.host.compat.PATCHES`). Whole log: {log_path}"
    )


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="surrogateescape")
