"""What `gpuop.host.building` builds: the driver branches it takes from Debian's archive and
the architectures it compiles for, each a row of data the builder reads.

Branches (the first part of a driver version):

    535   Debian bookworm (its point release, updates and security: 535.261.03, and
          535.309.01 proprietary in bookworm-security)
    550   Debian trixie (550.163.01, both flavours: `nvidia-open-kernel-dkms` is in contrib)

Every branch is compiled against bookworm's 6.1 kernel headers (`KERNEL_SUITES`), the
kernels the fleet runs; a branch from a newer release brings user space built against that
release's glibc, so the builder reads each user-space package's `Depends: libc6 (>= X)` and
refuses a branch whose X is above the host's glibc (`HOST_GLIBC`, bookworm's 2.36: trixie's
550 packages ask for 2.34, so they fit).

Architectures: `amd64` natively, `arm64` (Grace Hopper, Grace Blackwell) with Debian's cross
compiler `aarch64-linux-gnu-gcc-12`, the arm64 kernel headers (their `linux-kbuild` tools
taken for the build machine, amd64) and the arm64 user-space packages.

To add a branch: one `Branch` row (its suites, and a recipe string to bump when what its
build makes changes); to add an architecture: one `Arch` row.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuop.host.manifests import Flavour

DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_SECURITY = "http://deb.debian.org/debian-security"
ALL_COMPONENTS = "main contrib non-free non-free-firmware"
NON_FREE_COMPONENTS = "contrib non-free non-free-firmware"

Suite = tuple[str, str, str]
"""(mirror, suite, components) of one apt source line."""

KERNEL_SUITES: tuple[Suite, ...] = (
    (DEBIAN_MIRROR, "bookworm", ALL_COMPONENTS),
    (DEBIAN_MIRROR, "bookworm-updates", ALL_COMPONENTS),
    (DEBIAN_SECURITY, "bookworm-security", ALL_COMPONENTS),
)
"""Where the kernel headers (and the 535 branch) come from: Debian bookworm."""
HOST_GLIBC = "2.36"
"""The glibc of the hosts the packages are for: bookworm's, whose kernels they are built for."""


@dataclass(frozen=True)
class Branch:
    """One driver branch: where Debian keeps its packages, and its recipe."""

    name: str
    """The version's first part: `535`."""
    suites: tuple[Suite, ...]
    """The apt sources its driver packages come from (beside `KERNEL_SUITES`)."""
    recipe: str = ""
    """Its own recipe version, added to the builder's (`building.RECIPE`) in the cache keys
    of its packages when not empty: bump it when what only its build makes changes."""
    module_sources: tuple[tuple[Flavour, str, str], ...] = (
        (Flavour.PROPRIETARY, "nvidia-kernel-dkms", "nvidia-current-{version}"),
        (Flavour.OPEN, "nvidia-open-kernel-dkms", "nvidia-current-open-{version}"),
    )
    """Per flavour: the Debian package of the module sources and its directory in usr/src."""

    def module_source(self, flavour: Flavour) -> tuple[str, str]:
        (found,) = [(p, d) for f, p, d in self.module_sources if f is flavour]
        return found


BRANCHES = {
    "535": Branch("535", ()),
    "550": Branch("550", ((DEBIAN_MIRROR, "trixie", NON_FREE_COMPONENTS),), recipe="550-1"),
}


@dataclass(frozen=True)
class Arch:
    """One architecture packages are built for."""

    name: str
    """Debian's and Kubernetes' name: `arm64`."""
    machine: str
    """`uname -m`: `aarch64`."""
    multiarch: str
    """Debian's library directory triplet: `aarch64-linux-gnu`."""
    cross_compile: str
    """The cross tools' prefix on an amd64 machine (`aarch64-linux-gnu-`); "" when native."""
    elf_machine: str
    """What `readelf -h` says of its modules' Machine."""

    @property
    def library_dir(self) -> str:
        """Where Debian's libraries and a container's linker look: `/usr/lib/<triplet>`."""
        return f"/usr/lib/{self.multiarch}"


BUILD_ARCH = "amd64"
"""The machine packages are built on (its kernel build tools, `linux-kbuild-*`, run there)."""
ARCHES = {
    "amd64": Arch("amd64", "x86_64", "x86_64-linux-gnu", "", "Advanced Micro Devices X86-64"),
    "arm64": Arch("arm64", "aarch64", "aarch64-linux-gnu", "aarch64-linux-gnu-", "AArch64"),
}
ARCH_OF_MACHINE = {a.machine: a.name for a in ARCHES.values()}


class UnknownTarget(ValueError):
    """A branch or architecture the builder has no row for; the message lists those it has."""


def branch_of(version: str) -> Branch:
    """The branch of driver `version` (`550.163.01`: 550)."""
    name = version.split(".", 1)[0]
    if name not in BRANCHES:
        raise UnknownTarget(
            f"no recipe for driver branch {name} ({version}): the builder knows "
            f"{', '.join(sorted(BRANCHES))} (gpuop.host.branches.BRANCHES)"
        )
    return BRANCHES[name]


def arch_named(name: str) -> Arch:
    if name not in ARCHES:
        raise UnknownTarget(
            f"no architecture {name}: the builder knows {', '.join(sorted(ARCHES))}"
        )
    return ARCHES[name]


def version_tuple(version: str) -> tuple[int, ...]:
    """`2.36` as (2, 36), for comparing glibc versions (a Debian revision is ignored)."""
    plain = version.split(":", 1)[-1].split("-", 1)[0]
    parts = []
    for part in plain.split("."):
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)
