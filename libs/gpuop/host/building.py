"""Building format 2 driver packages (`gpuop.host.manifests`) from a real NVIDIA driver:
Debian's packages of it, or NVIDIA's `.run` installer. `gpuop package build` calls these.

From Debian (`build_from_debian`):

    1. apt, with a configuration of its own under the work directory (its sources list adds
       `contrib non-free non-free-firmware` to bookworm, bookworm-updates and
       bookworm-security, and the driver branch's own suites, trixie for 550:
       `gpuop.host.branches`; the machine's apt configuration is neither read for sources nor
       changed), fetches the module sources of the flavour (`nvidia-kernel-dkms` or
       `nvidia-open-kernel-dkms`), `libnvidia-ml1`, `libcuda1`, `nvidia-smi`,
       `nvidia-persistenced`, `firmware-nvidia-gsp`, and `linux-headers-<kernel>` with the
       packages it depends on (`linux-headers-*-common`, `linux-kbuild-*`), all of the target
       architecture except `linux-kbuild-*`, whose tools run on the build machine
    2. a user-space package that needs a newer glibc than the hosts' (its `Depends: libc6 (>=
       X)`) stops the build with that reason, before anything is compiled
    3. `dpkg-deb -x` unpacks them into a private root; the kernel's headers are built against
       there, never the running kernel's
    4. `make modules` with NVIDIA's Makefile (SYSSRC, SYSOUT, KERNEL_UNAME; for arm64, ARCH and
       Debian's cross compiler), paths of the work directory mapped away
       (`-ffile-prefix-map`), debug info stripped as `make modules_install
       INSTALL_MOD_STRIP=1` would
    5. the modules, user space and GSP firmware go into a reproducible archive: the same
       `.deb`s and compiler give the same sha256

From a `.run` (`extract_run`): NVIDIA's installer is a makeself archive, a shell script
followed by a compressed tar; `extract_run` reads the script's header for the payload's
offset and unpacks the payload without running anything of it.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import lzma
import os
import re
import shlex
import shutil
import subprocess
import tarfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from gpuop.host import branches, compat, manifests, packaging
from gpuop.host.branches import Arch
from gpuop.host.manifests import Flavour, Role

_T = TypeVar("_T")
DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
USERSPACE_PACKAGES = ("libnvidia-ml1", "libcuda1", "nvidia-smi", "firmware-nvidia-gsp")
"""Built from the driver's own source package: taken at the driver's version."""
INDEPENDENT_PACKAGES = ("nvidia-persistenced",)
"""Versioned on their own (535.171.04 for driver 535.261.03): the newest the archive has."""
LIBRARY_DIRS = ("usr/lib/{multiarch}/nvidia/current",)
BINARY_PATHS = ("usr/lib/nvidia/current/nvidia-smi", "usr/bin/nvidia-persistenced")
FIRMWARE_DIRS = ("lib/firmware/nvidia/{version}", "usr/lib/firmware/nvidia/{version}")
RECIPE = "2"
"""The build's own version, for caches of built packages: bump it when what a build makes
of the same inputs changes (other files, flags, layout); each branch adds its own
(`branches.Branch.recipe`)."""
BUILD_TIMEOUT_SECONDS = 3600.0
TOOL_TIMEOUT_SECONDS = 600.0


class BuildError(Exception):
    """A package could not be built; the message says which step and why."""


def _run(
    command: Sequence[str],
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = TOOL_TIMEOUT_SECONDS,
    log: Path | None = None,
) -> str:
    """Run `command`; its stdout, or `BuildError` with the last of its output."""
    environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "HOME": "/"}
    environment.update(env or {})
    if shutil.which(command[0], path=environment["PATH"]) is None:
        raise BuildError(f"{command[0]} is not installed: {_INSTALL_HINTS.get(command[0], '')}")
    try:
        result = subprocess.run(
            list(command),
            cwd=cwd,
            env=environment,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise BuildError(f"{shlex.join(command)} ran past {timeout:.0f} s") from None
    if log is not None:
        log.write_text(result.stdout + result.stderr, encoding="utf-8")
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-20:])
        where = f" (whole output: {log})" if log is not None else ""
        raise BuildError(f"{shlex.join(command)} failed ({result.returncode}){where}:\n{tail}")
    return result.stdout


_INSTALL_HINTS = {
    "apt-get": "build on Debian or Ubuntu with apt",
    "apt-cache": "build on Debian or Ubuntu with apt",
    "dpkg-deb": "apt-get install dpkg",
    "make": "apt-get install make",
    "gcc-12": "apt-get install gcc-12 (the compiler Debian's bookworm kernels are built with)",
    "aarch64-linux-gnu-gcc-12": "apt-get install gcc-12-aarch64-linux-gnu (Debian's cross "
    "compiler for arm64, the one its arm64 kernels are built with)",
    "aarch64-linux-gnu-strip": "apt-get install binutils-aarch64-linux-gnu",
    "strip": "apt-get install binutils",
}


class Apt:
    """apt with a configuration of its own under `directory`: its sources list (`suites`,
    bookworm's by default), package lists of `arches` and cache; the machine's sources and
    state are left alone."""

    def __init__(
        self,
        directory: Path,
        suites: Sequence[branches.Suite] = branches.KERNEL_SUITES,
        arches: Sequence[str] = (branches.BUILD_ARCH,),
    ) -> None:
        self.directory = directory
        self.arches = tuple(dict.fromkeys((branches.BUILD_ARCH, *arches)))
        for sub in ("lists/partial", "cache/archives/partial", "sources.list.d", "preferences.d"):
            (directory / sub).mkdir(parents=True, exist_ok=True)
        lines = [
            f"deb [signed-by={DEBIAN_KEYRING}] {mirror} {suite} {components}"
            for mirror, suite, components in suites
        ]
        (directory / "sources.list").write_text("\n".join(lines) + "\n", encoding="utf-8")

    def options(self) -> list[str]:
        d = self.directory
        arches = [f"APT::Architectures::={arch}" for arch in self.arches]
        return [
            "-o", f"Dir::Etc::sourcelist={d / 'sources.list'}",
            "-o", f"Dir::Etc::sourceparts={d / 'sources.list.d'}",
            "-o", f"Dir::Etc::preferencesparts={d / 'preferences.d'}",
            "-o", f"Dir::State::Lists={d / 'lists'}",
            "-o", f"Dir::Cache={d / 'cache'}",
            "-o", "APT::Sandbox::User=root",
            "-o", f"APT::Architecture={branches.BUILD_ARCH}",
            *(word for option in arches for word in ("-o", option)),
        ]  # fmt: skip

    def update(self) -> None:
        _run(["apt-get", *self.options(), "-q", "update"], timeout=TOOL_TIMEOUT_SECONDS)

    def versions(self, package: str, arch: str = branches.BUILD_ARCH) -> list[str]:
        """Every version of `package` for `arch` the sources offer, newest first."""
        out = _run(["apt-cache", *self.options(), "madison", f"{package}:{arch}"])
        seen: list[str] = []
        for line in out.splitlines():
            parts = [p.strip() for p in line.split("|")]
            if len(parts) >= 2 and parts[0].split(":")[0] == package and parts[1] not in seen:
                seen.append(parts[1])
        return seen

    def version_of(
        self, package: str, upstream: str | None, arch: str = branches.BUILD_ARCH
    ) -> str:
        """The newest Debian version of `package` for `arch` whose upstream part is
        `upstream` (any when None); `BuildError` naming what there is."""
        offered = self.versions(package, arch)
        for version in offered:
            plain = version.split(":", 1)[-1]
            if upstream is None or plain.rsplit("-", 1)[0] == upstream:
                return version
        raise BuildError(
            f"the Debian archive has no {package} {upstream or ''}".rstrip()
            + f" for {arch} (it has: {', '.join(offered) or 'none'})"
        )

    def download(
        self, wanted: Iterable[tuple[str, str]], into: Path, arch: str = branches.BUILD_ARCH
    ) -> dict[str, Path]:
        """`name=version` of each for `arch` into `into` (kept: a file already there is not
        fetched again); the `.deb` of each name."""
        into.mkdir(parents=True, exist_ok=True)
        paths: dict[str, Path] = {}
        missing = []
        for name, version in wanted:
            found = _debs_in(into, name, version, arch)
            if found:
                paths[name] = found[0]
            else:
                missing.append(f"{name}:{arch}={version}")
                paths[name] = into / f"{name}_{version.replace(':', '%3a')}_{arch}.deb"
        if missing:
            _run(["apt-get", *self.options(), "-q", "download", *missing], cwd=into)
        for name, version in wanted:
            if not paths[name].exists():
                found = _debs_in(into, name, version, arch)
                if not found:
                    raise BuildError(f"apt-get download gave no .deb for {name} ({arch})")
                paths[name] = found[0]
        return paths


def _debs_in(into: Path, name: str, version: str, arch: str) -> list[Path]:
    """The `.deb` of `name` at `version` in `into` for `arch` (or for all architectures)."""
    stem = f"{name}_{version.replace(':', '%3a')}"
    return [p for p in (into / f"{stem}_{arch}.deb", into / f"{stem}_all.deb") if p.is_file()]


def newest_debian_kernel(apt: Apt, flavour: str = "amd64", *, suite: str | None = None) -> str:
    """The newest `6.1.0-N-<flavour>` kernel whose headers the archive has; with `suite`
    (`bookworm`: the point release), the newest that suite itself carries, not its updates."""
    out = _run(
        [
            "apt-cache",
            *apt.options(),
            "search",
            "--names-only",
            rf"^linux-headers-6\.1\.0-[0-9]+-{flavour}$",
        ]
    )
    lines = out.splitlines()
    if suite is None:
        return newest_release(lines, flavour)
    while lines:
        release = newest_release(lines, flavour)
        offered = _run(["apt-cache", *apt.options(), "madison", f"linux-headers-{release}"])
        if any(f" {suite}/" in line for line in offered.splitlines()):
            return release
        lines = [line for line in lines if not line.startswith(f"linux-headers-{release} ")]
    raise BuildError(f"Debian's {suite} carries no linux-headers-6.1.0-*-{flavour}")


def newest_release(search_lines: Iterable[str], flavour: str = "amd64") -> str:
    """The newest release among `apt-cache search` lines `linux-headers-6.1.0-N-<flavour> -
    ...`, by its ABI number N; `BuildError` when there is none."""
    pattern = re.compile(rf"^linux-headers-(6\.1\.0-(\d+)-{re.escape(flavour)})\b(?!-)")
    releases = [(int(m[2]), m[1]) for line in search_lines if (m := pattern.match(line))]
    if not releases:
        raise BuildError(f"the Debian archive has no linux-headers-6.1.0-*-{flavour}")
    return max(releases)[1]


def deb_field(deb: Path, name: str) -> str:
    return _run(["dpkg-deb", "-f", str(deb), name]).strip()


def unpack_deb(deb: Path, root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    _run(["dpkg-deb", "-x", str(deb), str(root)])


@dataclass
class DriverTree:
    """What a package is made of, wherever it came from: the module sources to compile and
    the user space and firmware files to carry."""

    version: str
    module_source: Path
    libraries: list[Path] = field(default_factory=list)
    """Files and links (to files beside them) of the driver's libraries."""
    binaries: list[Path] = field(default_factory=list)
    firmware: list[Path] = field(default_factory=list)
    built_from: list[manifests.BuiltFrom] = field(default_factory=list)
    patches: list[str] = field(default_factory=list)
    """The compatibility patches its module sources were built with (`gpuop.host.compat`)."""


@dataclass(frozen=True)
class KernelHeaders:
    release: str
    source: Path
    """SYSSRC: the headers' common tree."""
    output: Path
    """SYSOUT: the release's own tree (its .config, Module.symvers)."""
    arch: Arch = branches.ARCHES["amd64"]
    """The architecture the kernel runs on, which the modules are compiled for."""


def headers_from_debian(
    apt: Apt, release: str, debs: Path, root: Path, arch: Arch = branches.ARCHES["amd64"]
) -> tuple[KernelHeaders, list[manifests.BuiltFrom]]:
    """Fetch and unpack `linux-headers-<release>` (of `arch`) and the packages it needs into
    `root`: its common tree, and `linux-kbuild-*` of the build machine, whose tools run here."""
    name = f"linux-headers-{release}"
    version = apt.version_of(name, None, arch.name)
    (deb,) = apt.download([(name, version)], debs, arch.name).values()
    needed = []
    for part in deb_field(deb, "Depends").split(","):
        match = re.match(
            r"\s*(linux-(?:headers|kbuild)-[^\s(]+)\s*(?:\(\s*[<>=]+\s*([^)\s]+)\s*\))?", part
        )
        if match:
            needed.append((match[1], match[2] or apt.version_of(match[1], None)))
    fetched = {name: deb, **apt.download(needed, debs)}
    for path in fetched.values():
        unpack_deb(path, root)
    output = root / "usr/src" / name
    makefile = output / "Makefile"
    # Debian's Makefile includes the common tree by its absolute /usr/src path
    text = makefile.read_text(encoding="utf-8")
    makefile.write_text(text.replace("/usr/src/", f"{root}/usr/src/"), encoding="utf-8")
    common = [p for p in (root / "usr/src").glob("linux-headers-*-common") if p.is_dir()]
    if not common:
        raise BuildError(f"{name} brought no linux-headers-*-common tree")
    headers = KernelHeaders(release, common[0], output, arch)
    return headers, [_built_from(p) for p in fetched.values()]


def _built_from(deb: Path) -> manifests.BuiltFrom:
    return manifests.BuiltFrom(
        name=deb_field(deb, "Package"),
        version=deb_field(deb, "Version"),
        sha256=packaging.sha256_of(deb),
    )


def tree_from_debian(
    apt: Apt,
    version: str,
    flavour: Flavour,
    debs: Path,
    root: Path,
    arch: Arch = branches.ARCHES["amd64"],
    host_glibc: str = branches.HOST_GLIBC,
) -> DriverTree:
    """Fetch the driver's packages for `arch` (the module sources of its branch's `flavour`,
    `USERSPACE_PACKAGES`, `INDEPENDENT_PACKAGES`), refuse them when their user space needs a
    newer glibc than `host_glibc` (`check_glibc`), unpack them into `root`; what they hold."""
    source_package, source_dir = branches.branch_of(version).module_source(flavour)
    wanted = [
        (name, apt.version_of(name, version, arch.name))
        for name in (source_package, *USERSPACE_PACKAGES)
    ]
    wanted += [(name, apt.version_of(name, None, arch.name)) for name in INDEPENDENT_PACKAGES]
    fetched = apt.download(wanted, debs, arch.name)
    check_glibc(
        version,
        {name: deb_field(fetched[name], "Depends") for name in fetched if name != source_package},
        host_glibc,
    )
    for path in fetched.values():
        unpack_deb(path, root)
    tree = DriverTree(version, root / "usr/src" / source_dir.format(version=version))
    if not (tree.module_source / "Makefile").is_file():
        raise BuildError(f"{source_package} has no {source_dir.format(version=version)}/Makefile")
    for library_dir in LIBRARY_DIRS:
        directory = root / library_dir.format(multiarch=arch.multiarch)
        if not directory.is_dir():
            raise BuildError(f"the {arch.name} user-space packages have no {directory}")
        tree.libraries += sorted(p for p in directory.iterdir() if p.name.startswith("lib"))
    tree.binaries = [root / p for p in BINARY_PATHS if (root / p).exists()]
    for pattern in FIRMWARE_DIRS:
        firmware_dir = root / pattern.format(version=version)
        if firmware_dir.is_dir():
            tree.firmware += sorted(p for p in firmware_dir.iterdir() if p.suffix == ".bin")
    tree.built_from = [_built_from(p) for p in fetched.values()]
    return tree


_LIBC6 = re.compile(r"(?:^|,)\s*libc6\s*\(\s*>=\s*([^)\s]+)\s*\)")


def check_glibc(version: str, depends: dict[str, str], host_glibc: str) -> None:
    """`BuildError` when a package's `Depends` (name: field) asks for a glibc newer than the
    hosts' `host_glibc`: its user space would not start there (`version GLIBC_2.x not
    found`), whatever the modules do."""
    needs = {
        name: match[1]
        for name, field_text in depends.items()
        if (match := _LIBC6.search(field_text))
        and branches.version_tuple(match[1]) > branches.version_tuple(host_glibc)
    }
    if needs:
        newest = max(needs.values(), key=branches.version_tuple)
        raise BuildError(
            f"driver {version}'s user space needs glibc {newest} and the hosts run "
            f"{host_glibc}: "
            + ", ".join(f"{name} Depends libc6 (>= {need})" for name, need in sorted(needs.items()))
            + ". Build a branch whose user space the hosts can run, or give the hosts' glibc "
            "(--host-glibc) when they run a newer one."
        )


@dataclass(frozen=True)
class ModuleSigning:
    """The key the modules are signed with, for hosts in lockdown or Secure Boot: one the
    nodes trust (enrolled as a MOK, or in the kernel's keyring)."""

    key: Path
    """The private key, PEM."""
    certificate: Path
    """Its X.509 certificate, DER or PEM."""
    hash: str = "sha256"


def sign_modules(modules: Iterable[Path], sign_file: Path, signing: ModuleSigning) -> None:
    """Append a signature to each module with the kernel's own `scripts/sign-file` (from
    `linux-kbuild-*`); deterministic (PKCS#1 v1.5), so packages stay reproducible."""
    for path in (signing.key, signing.certificate):
        if not path.is_file():
            raise BuildError(f"module signing: {path}: no such file")
    for module in modules:
        _run(
            [str(sign_file), signing.hash, str(signing.key), str(signing.certificate), str(module)]
        )


def compile_modules(
    tree: DriverTree,
    headers: KernelHeaders,
    work: Path,
    jobs: int,
    signing: ModuleSigning | None = None,
) -> list[Path]:
    """`make modules` of `tree`'s sources (copied under `work`, with the compatibility
    patches the kernel needs: `gpuop.host.compat`, named in `tree.patches`) against `headers`;
    the built `.ko` files, stripped of debug info, and signed when `signing` says with what.
    Paths of `work` are mapped away so the modules do not depend on where they were built. A
    failed compile is one paragraph: the file, the kernel API, what to do (`compat.diagnose`)."""
    build = work / "modules"
    if build.exists():
        shutil.rmtree(build)
    shutil.copytree(tree.module_source, build, symlinks=True)
    tree.patches = compat.apply(build, headers.source)
    prefix_map = f"-ffile-prefix-map={work.resolve()}/=/"
    log = work / "modules.log"
    try:
        _make_modules(build, headers, prefix_map, jobs, log)
    except BuildError:
        text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
        paragraph = compat.diagnose(text, driver=tree.version, kernel=headers.release, log_path=log)
        if paragraph is None:
            raise
        raise BuildError(paragraph) from None
    built = sorted(build.glob("*.ko"))
    if not built:
        raise BuildError(f"make modules built no .ko (see {log})")
    for module in built:
        strip = f"{headers.arch.cross_compile}strip"
        _run([strip, "--strip-debug", "--remove-section=.comment", str(module)])
    if signing is not None:
        sign_modules(built, headers.output / "scripts" / "sign-file", signing)
    return built


def _make_modules(
    build: Path, headers: KernelHeaders, prefix_map: str, jobs: int, log: Path
) -> None:
    _run(
        [
            "make", f"-j{jobs}", "modules",
            f"SYSSRC={headers.source}", f"SYSOUT={headers.output}",
            f"KERNEL_UNAME={headers.release}", f"KCFLAGS={prefix_map}",
            *cross_flags(headers.arch),
        ],
        cwd=build,
        env={"SOURCE_DATE_EPOCH": "0", "KBUILD_BUILD_TIMESTAMP": "1970-01-01",
             "KBUILD_BUILD_USER": "gpuop", "KBUILD_BUILD_HOST": "gpuop"},
        timeout=BUILD_TIMEOUT_SECONDS,
        log=log,
    )  # fmt: skip


def cross_flags(arch: Arch) -> list[str]:
    """make's variables for compiling `arch`'s modules on the build machine: none natively;
    else ARCH, and Debian's cross tools for CC (NVIDIA's Makefile would take the kernel's
    `CONFIG_CC_VERSION_TEXT`, the native `gcc-12`), LD and OBJDUMP."""
    if not arch.cross_compile:
        return []
    if shutil.which(f"{arch.cross_compile}gcc-12") is None:
        raise BuildError(
            f"{arch.cross_compile}gcc-12 is not installed: "
            + _INSTALL_HINTS[f"{arch.cross_compile}gcc-12"]
        )
    tools = arch.cross_compile
    return [
        f"ARCH={arch.name}", f"CROSS_COMPILE={tools}", f"CC={tools}gcc-12",
        f"LD={tools}ld", f"OBJDUMP={tools}objdump",
    ]  # fmt: skip


def package_files(
    tree: DriverTree, modules: Sequence[Path]
) -> tuple[dict[str, packaging.PackageContent], dict[str, str]]:
    """The package's files (archive path: content) and links (archive path: target)."""
    files: dict[str, packaging.PackageContent] = {}
    links: dict[str, str] = {}
    for module in modules:
        files[f"modules/{module.name}"] = packaging.PackageContent(module, Role.MODULE)
    for library in tree.libraries:
        path = f"userspace/lib/{library.name}"
        if library.is_symlink():
            target = os.readlink(library)
            if "/" not in target:
                links[path] = target
        elif library.is_file():
            files[path] = packaging.PackageContent(library, Role.LIBRARY)
    for binary in tree.binaries:
        files[f"userspace/bin/{binary.name}"] = packaging.PackageContent(
            binary.resolve(), Role.BINARY, 0o755
        )
    for firmware in tree.firmware:
        files[f"firmware/{firmware.name}"] = packaging.PackageContent(firmware, Role.FIRMWARE)
    # links to what the package does not carry go: the installer refuses dangling ones
    links = {
        p: t
        for p, t in links.items()
        if f"userspace/lib/{t}" in files or f"userspace/lib/{t}" in links
    }
    return files, links


def build_from_debian(
    *,
    version: str,
    kernel_release: str,
    flavour: Flavour,
    out: Path,
    work: Path,
    debs: Path | None = None,
    jobs: int = 2,
    signing_key: Path | None = None,
    module_signing: ModuleSigning | None = None,
    arch: str | None = None,
    host_glibc: str = branches.HOST_GLIBC,
) -> packaging.BuiltPackage:
    """Build the `flavour` package of driver `version` for `kernel_release` (on `arch`,
    which the kernel release names by default: `6.1.0-57-arm64`) from Debian's packages of
    its branch into the driver source `out` and add it to its index (signed with the minisign
    secret key file `signing_key`, else left unsigned). `work` holds apt's state, the
    unpacked packages and the build (kept for a look after a failure); `debs` keeps the
    `.deb`s between builds (default: under `work`)."""
    target = arch_of(kernel_release, arch)
    branch = _known(lambda: branches.branch_of(version))
    work.mkdir(parents=True, exist_ok=True)
    apt, root = _fresh_apt(work, (*branches.KERNEL_SUITES, *branch.suites), target)
    debs = debs or work / "debs"
    headers, header_debs = headers_from_debian(apt, kernel_release, debs, root, target)
    tree = tree_from_debian(apt, version, flavour, debs, root, target, host_glibc)
    tree.built_from += header_debs
    return assemble(tree, headers, flavour, out, work, jobs, signing_key, module_signing)


def arch_of(kernel_release: str, arch: str | None) -> Arch:
    """The architecture to build for: `arch`, else the one Debian's kernel release names
    (its last part: `6.1.0-57-arm64`), else amd64; `BuildError` when they disagree."""
    named = kernel_release.rsplit("-", 1)[-1]
    if arch is None:
        return branches.ARCHES.get(named, branches.ARCHES[branches.BUILD_ARCH])
    target = _known(lambda: branches.arch_named(arch))
    if named in branches.ARCHES and named != target.name:
        raise BuildError(f"kernel {kernel_release} is an {named} kernel, not {target.name}")
    return target


def _known(find: Callable[[], _T]) -> _T:
    try:
        return find()
    except branches.UnknownTarget as exc:
        raise BuildError(str(exc)) from None


def _fresh_apt(
    work: Path,
    suites: Sequence[branches.Suite] = branches.KERNEL_SUITES,
    arch: Arch = branches.ARCHES["amd64"],
) -> tuple[Apt, Path]:
    """Apt under `work` for `suites` and `arch`, its lists updated, and an empty `work/root`
    to unpack packages in."""
    apt = Apt(work / "apt", suites, (arch.name,))
    apt.update()
    root = work / "root"
    if root.exists():
        shutil.rmtree(root)
    return apt, root


def assemble(
    tree: DriverTree,
    headers: KernelHeaders,
    flavour: Flavour,
    out: Path,
    work: Path,
    jobs: int,
    signing_key: Path | None,
    module_signing: ModuleSigning | None = None,
) -> packaging.BuiltPackage:
    """Compile `tree`'s modules against `headers` (signed with `module_signing` when given),
    write the package into `out` and add it to `out`'s index, signed with `signing_key`."""
    modules = compile_modules(tree, headers, work, jobs, module_signing)
    files, links = package_files(tree, modules)
    built = packaging.write_package_v2(
        out,
        component="gpu",
        version=tree.version,
        flavour=flavour,
        kernel_release=headers.release,
        files=files,
        links=links,
        built_from=sorted(tree.built_from, key=lambda b: b.name),
    )
    packaging.add_to_index(out, built, signing_key)
    return built


# NVIDIA's .run installer --------------------------------------------------------------------

_OFFSET = re.compile(rb'offset=`head -n (\d+) "\$0"')
_FILESIZES = re.compile(rb'filesizes="(\d+)"')
_LABEL = re.compile(rb'label="([^"]*)"')
MAX_HEADER_BYTES = 64 << 10


@dataclass(frozen=True)
class RunArchive:
    """What the header of a makeself `.run` says."""

    label: str
    offset: int
    """Bytes of script before the payload."""
    size: int | None
    """The payload's size, when the header says."""


def read_run_header(path: Path) -> RunArchive:
    """The header of the makeself archive `path`; `BuildError` when it is not one."""
    with path.open("rb") as stream:
        head = stream.read(MAX_HEADER_BYTES)
    if not head.startswith(b"#!"):
        raise BuildError(f"{path.name} is not a .run installer: it does not start with #!")
    match = _OFFSET.search(head)
    if match is None:
        raise BuildError(
            f"{path.name} is not a makeself archive: its script names no offset "
            '(offset=`head -n N "$0" ...`)'
        )
    lines = int(match[1])
    offset = 0
    for _ in range(lines):
        end = head.find(b"\n", offset)
        if end < 0:
            raise BuildError(f"{path.name}: its header is shorter than the {lines} lines it says")
        offset = end + 1
    sizes = _FILESIZES.search(head)
    label = _LABEL.search(head)
    return RunArchive(
        label=label[1].decode(errors="replace") if label else "",
        offset=offset,
        size=int(sizes[1]) if sizes else None,
    )


def extract_run(path: Path, destination: Path) -> RunArchive:
    """Unpack the payload of NVIDIA's `.run` installer `path` into `destination` (created
    here; refused when it exists), running none of its script; the header it read.
    `BuildError` for anything that is not a makeself archive of a tar."""
    header = read_run_header(path)
    if destination.exists():
        raise BuildError(f"{destination} exists; extract into a new directory")
    with path.open("rb") as stream:
        stream.seek(header.offset)
        payload = stream.read() if header.size is None else stream.read(header.size)
    if header.size is not None and len(payload) != header.size:
        raise BuildError(
            f"{path.name} is truncated: its payload has {len(payload)} bytes, the header "
            f"says {header.size}"
        )
    data = _decompress(payload, path.name)
    destination.mkdir(parents=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
            archive.extractall(destination, filter="data")
    except (tarfile.TarError, OSError) as exc:
        shutil.rmtree(destination, ignore_errors=True)
        raise BuildError(f"{path.name}: its payload is not a tar archive: {exc}") from None
    return header


def _decompress(payload: bytes, name: str) -> bytes:
    try:
        if payload.startswith(b"\x1f\x8b"):
            return gzip.decompress(payload)
        if payload.startswith(b"\xfd7zXZ\x00"):
            return lzma.decompress(payload)
        if payload.startswith(b"BZh"):
            return bz2.decompress(payload)
    except (OSError, EOFError, lzma.LZMAError, ValueError) as exc:
        raise BuildError(f"{name}: its payload does not decompress: {exc}") from None
    if len(payload) > 262 and payload[257:262] == b"ustar":
        return payload
    raise BuildError(
        f"{name}: its payload is neither gzip, xz, bzip2 nor a plain tar "
        f"(it starts {payload[:6].hex()})"
    )


def cache_key(*parts: str) -> str:
    """A short digest of a build's inputs, for caches of built packages."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def package_key(version: str, kernel_release: str, flavour: Flavour) -> str:
    """`cache_key` of a package built from Debian: what it is for (the kernel release names
    the architecture), the builder's recipe and its branch's."""
    branch = _known(lambda: branches.branch_of(version))
    recipe = (RECIPE, branch.recipe) if branch.recipe else (RECIPE,)
    return cache_key(version, kernel_release, flavour.value, *recipe)


_RUN_VERSION = re.compile(r"(\d+\.\d+(?:\.\d+)?)")
RUN_LIBRARIES = ("libnvidia-ml.so", "libcuda.so")
RUN_BINARIES = ("nvidia-smi", "nvidia-persistenced")
RUN_MODULE_DIRS = {Flavour.PROPRIETARY: "kernel", Flavour.OPEN: "kernel-open"}


def tree_from_run(extracted: Path, flavour: Flavour, run: Path) -> DriverTree:
    """What an extracted `.run` holds for a package: `kernel/` or `kernel-open/`, the
    versioned libraries (their `.so.1` links are made here, as nvidia-installer makes them),
    nvidia-smi, nvidia-persistenced and `firmware/`; the version from the libraries' names."""
    source = extracted / RUN_MODULE_DIRS[flavour]
    if not (source / "Makefile").is_file():
        raise BuildError(f"{run.name} has no {RUN_MODULE_DIRS[flavour]}/Makefile")
    libraries = sorted(
        p for p in extracted.iterdir() if p.name.startswith(RUN_LIBRARIES) and p.is_file()
    )
    versions = {p.name.rpartition(".so.")[2] for p in libraries}
    if len(versions) != 1:
        raise BuildError(
            f"{run.name}: the driver's version is not clear from its libraries "
            f"({', '.join(p.name for p in libraries) or 'none found'})"
        )
    (version,) = versions
    links_dir = extracted / ".gpuop-links"
    links_dir.mkdir(exist_ok=True)
    links = []
    for library in libraries:
        link = links_dir / (library.name.rpartition(".so.")[0] + ".so.1")
        link.unlink(missing_ok=True)
        link.symlink_to(library.name)
        links.append(link)
    tree = DriverTree(version, source)
    tree.libraries = libraries + links
    tree.binaries = [extracted / b for b in RUN_BINARIES if (extracted / b).is_file()]
    firmware = extracted / "firmware"
    tree.firmware = sorted(firmware.glob("*.bin")) if firmware.is_dir() else []
    tree.built_from = [
        manifests.BuiltFrom(name=run.name, version=version, sha256=packaging.sha256_of(run))
    ]
    return tree


def build_from_run(
    run: Path,
    *,
    kernel_release: str,
    flavour: Flavour,
    out: Path,
    work: Path,
    debs: Path | None = None,
    jobs: int = 2,
    signing_key: Path | None = None,
    module_signing: ModuleSigning | None = None,
    arch: str | None = None,
) -> packaging.BuiltPackage:
    """As `build_from_debian`, from NVIDIA's `.run` installer: its payload is extracted
    (never run) and its modules compiled against Debian's headers for `kernel_release`."""
    target = arch_of(kernel_release, arch)
    work.mkdir(parents=True, exist_ok=True)
    extracted = work / "run"
    if extracted.exists():
        shutil.rmtree(extracted)
    extract_run(run, extracted)
    tree = tree_from_run(extracted, flavour, run)
    apt, root = _fresh_apt(work, arch=target)
    headers, header_debs = headers_from_debian(
        apt, kernel_release, debs or work / "debs", root, target
    )
    tree.built_from += header_debs
    return assemble(tree, headers, flavour, out, work, jobs, signing_key, module_signing)
