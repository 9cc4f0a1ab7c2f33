"""Debian kmod's own tools on real kernel modules: `modinfo` to check a package's modules
before anything is unloaded, `depmod -b <host root>` to index them, and whether the host
only loads signed modules.

    check_modules(paths, release, required)   vermagic is `release`'s; signed when required
    signatures_required(root)                 why the host needs signed modules, or None:
                                              lockdown (`sys/kernel/security/lockdown`),
                                              Secure Boot (efivars), `module.sig_enforce`
    depmod(root, release)                     `depmod -b <root> <release>`
    HostRootKernel                            a `KernelOps` that only indexes (depmod -b):
                                              installs into a host root that is not running

The tools are the machine's own (`/usr/sbin/modinfo`, `/usr/sbin/depmod`, apt package
`kmod`); a missing one is `KernelToolMissing`, which says what to install.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

from gpuop.host.errors import DepmodFailed, KernelToolMissing, ModuleLoadFailed
from gpuop.host.modules import LoadedModule
from gpuop.host.roots import HostRoot

LOCKDOWN = "sys/kernel/security/lockdown"
SECURE_BOOT = "sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
SIG_ENFORCE = "sys/module/module/parameters/sig_enforce"
TIMEOUT_SECONDS = 120.0
_SEARCH = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")


class ModuleRefused(Exception):
    """A module the host would refuse to load; `reason` is `kernel-mismatch` or
    `unsigned-module`, as the install failure reports it."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def tool(name: str) -> str:
    """The path of kmod's `name`; `KernelToolMissing` when it is not installed."""
    found = shutil.which(name) or shutil.which(name, path=os.pathsep.join(_SEARCH))
    if found is None:
        raise KernelToolMissing(f"{name} (apt-get install kmod)")
    return found


def modinfo_command(path: Path, root: HostRoot | None = None) -> list[str]:
    """How to run modinfo on `path`: the host's own, chrooted into `root`, when `root` is
    not `/` and has one (a node agent's image carries no kmod: its tools are the host's,
    as `SubprocessKernelOps` runs them) and `path` lies under it; else this machine's."""
    if root is not None and root.path.resolve() != Path("/"):
        base = root.path.resolve()
        inside = path.resolve()
        host_tool = next(
            (f"{d}/modinfo" for d in _SEARCH if root.join(f"{d}/modinfo").exists()), None
        )
        if host_tool is not None and inside.is_relative_to(base):
            return ["chroot", str(base), host_tool, "/" + str(inside.relative_to(base))]
    return [tool("modinfo"), str(path)]


def modinfo(path: Path, root: HostRoot | None = None) -> dict[str, list[str]]:
    """Every field `modinfo` shows for the module file `path`, each with all its values
    (`modinfo_command` says whose modinfo); `ModuleLoadFailed` when modinfo cannot read it
    (not a kernel module)."""
    result = subprocess.run(
        modinfo_command(path, root),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
        check=False,
        env={"LC_ALL": "C", "PATH": os.environ.get("PATH", "")},
    )
    if result.returncode != 0:
        raise ModuleLoadFailed(path.name, (result.stderr or result.stdout).strip())
    fields: dict[str, list[str]] = {}
    key = ""
    for line in result.stdout.splitlines():
        name, colon, value = line.partition(":")
        if colon and name and not name.startswith((" ", "\t")):
            key = name.strip()
            fields.setdefault(key, []).append(value.strip())
        elif key:  # a signature continues on indented lines
            fields[key][-1] += line.strip()
    return fields


def signatures_required(root: HostRoot) -> str | None:
    """Why the host loads only signed modules (lockdown, Secure Boot, `sig_enforce`), or
    None when it loads unsigned ones too."""
    lockdown = root.join(LOCKDOWN)
    if lockdown.is_file():
        text = lockdown.read_text(encoding="utf-8", errors="replace")
        selected = text[text.find("[") + 1 : text.find("]")] if "[" in text else text.strip()
        if selected and selected != "none":
            return f"the kernel is in lockdown ({selected}, {LOCKDOWN})"
    secure_boot = root.join(SECURE_BOOT)
    if secure_boot.is_file():
        data = secure_boot.read_bytes()  # 4 bytes of attributes, then the value
        if len(data) >= 5 and data[4] == 1:
            return f"Secure Boot is on ({SECURE_BOOT.rpartition('/')[2]} is 1)"
    enforce = root.join(SIG_ENFORCE)
    if enforce.is_file() and enforce.read_text(encoding="utf-8").strip() == "Y":
        return f"the kernel enforces module signatures ({SIG_ENFORCE} is Y)"
    return None


def check_modules(
    paths: Iterable[Path],
    kernel_release: str,
    required: str | None,
    root: HostRoot | None = None,
) -> None:
    """Return when the kernel `kernel_release` would take every module in `paths`: each
    one's vermagic starts with that release, and, when `required` says why signatures are
    needed, each is signed. `ModuleRefused` naming the first that is not. `root`: the host
    root the modules are under, whose modinfo is used when it has one."""
    for path in sorted(paths):
        fields = modinfo(path, root)
        vermagic = (fields.get("vermagic") or [""])[0]
        built_for = vermagic.split(" ", 1)[0]
        if built_for != kernel_release:
            raise ModuleRefused(
                "kernel-mismatch",
                f"{path.name} was built for kernel {built_for or '(no vermagic)'}, the node "
                f"runs {kernel_release}: build the package for {kernel_release}",
            )
        if required is not None and not (fields.get("sig_id") or fields.get("signer")):
            raise ModuleRefused(
                "unsigned-module",
                f"{path.name} is not signed and {required}: sign the package's modules with "
                "a key the node trusts (its MOK or built-in keyring)",
            )


def depmod(root: Path, kernel_release: str) -> None:
    """`depmod -b <root> <kernel_release>`: index the modules under `root`'s
    `lib/modules/<kernel_release>`; `DepmodFailed` with depmod's words."""
    try:
        result = subprocess.run(
            [tool("depmod"), "-b", str(root), kernel_release],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_SECONDS,
            check=False,
            env={"LC_ALL": "C", "PATH": os.environ.get("PATH", "")},
        )
    except subprocess.TimeoutExpired:
        raise DepmodFailed(kernel_release, f"ran past {TIMEOUT_SECONDS:.0f} s") from None
    if result.returncode != 0:
        raise DepmodFailed(kernel_release, (result.stderr or result.stdout).strip())


class HostRootKernel:
    """`KernelOps` for a host root that is not the running system (an image being prepared,
    a test's seeded root, a break-glass install): `depmod` indexes it with `depmod -b`;
    nothing can be loaded into it."""

    def __init__(self, root: HostRoot) -> None:
        self.root = root

    async def loaded(self) -> tuple[LoadedModule, ...]:
        return ()

    async def load(self, module: str, options: Mapping[str, str] | None = None) -> None:
        raise ModuleLoadFailed(module, f"{self.root.path} is not a running kernel's root")

    async def unload(self, module: str) -> None:
        return None

    async def depmod(self, kernel_release: str) -> None:
        await asyncio.to_thread(depmod, self.root.path, kernel_release)
