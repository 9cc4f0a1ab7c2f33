"""Pre-staging: the package being installed, installed as well for every other kernel the
host has under `lib/modules/<release>`, so that a node rebooting into one (the kernel a
pending update will boot) comes up with its driver instead of without one.

Called by `executor.Executor` after an `InstallDriver` for the running kernel succeeded.
Each other kernel gets the version the source built for it, fetched and checked as the
install checks a package (digest, manifest, and vermagic against that kernel's release),
renamed into `lib/modules/<release>/updates/gpuop/<component>/<version>/`, made the active
version there (what depmod indexes and modprobe loads at the next boot), and indexed by
`depmod` for that kernel. Only the modules: the user space and firmware of the version are
the running kernel's install's, shared by every kernel.

A kernel the source has no package for, or whose package fails a check, is reported
(`Prestaged.missing`, carried in `DriverInstalled.kernels_without_package` and logged),
never fatal: the install for the running kernel stands. A node that boots such a kernel
comes up without a driver, and the orchestrator reinstalls it (reason `kernel-drift`).

The version active on each kernel before is recorded (`recorded`, into the component's
`prestaged` in the driver state), and a rollback undoes pre-staging with it (`restore`,
called by `executor.Executor` once the running kernel runs the version rolled back to), so
a reboot into another kernel does not boot the version that was rolled back.
"""

from __future__ import annotations

import logging
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from gpuop.events import driver as dm
from gpuop.host import packages
from gpuop.host.errors import KernelError
from gpuop.host.roots import HostRoot
from gpuop.services.driver_manager import sources
from gpuop.services.driver_manager.installing import (
    STAGING,
    UNPACK_PREFIX,
    Installer,
    InstallError,
    running_kernel,
)
from gpuop.services.driver_manager.state import PrestagedKernel

log = logging.getLogger(__name__)

MODULES = "lib/modules"
SHARED_PARTS = ("userspace", "firmware")
"""Parts of a format 2 package the running kernel's install placed already."""


@dataclass(frozen=True)
class Prestaged:
    """What pre-staging did, per other kernel."""

    ready: tuple[str, ...] = ()
    """Kernels that now have the version installed and active."""
    missing: dict[str, str] = field(default_factory=dict)
    """Kernel -> why it has no package of the version (none in the source, a failed check)."""
    prior: dict[str, str | None] = field(default_factory=dict)
    """Kernel in `ready` -> the version active there before (None: none), for `restore`."""


def other_kernels(root: HostRoot, running: str) -> list[str]:
    """The kernels installed on the host besides `running`: the directories under
    `lib/modules` that hold a kernel's modules (`kernel/`) or an index (`modules.dep`)."""
    base = root.join(MODULES)
    if not base.is_dir():
        return []
    return sorted(
        path.name
        for path in base.iterdir()
        if path.name != running
        and path.is_dir()
        and ((path / "kernel").is_dir() or (path / "modules.dep").is_file())
    )


async def prestage(
    installer: Installer,
    component: str,
    version: str,
    where: dm.DriverSource,
    flavour: str | None = None,
) -> Prestaged:
    """Install `version` of `component` from `where` for every other kernel of the host
    (see the module docstring); what was done, kernel by kernel."""
    root = installer.root
    kernels = other_kernels(root, running_kernel(root))
    if not kernels:
        return Prestaged()
    try:
        source = installer.open_source(where)
        index = await source.index()
    except sources.SourceError as exc:
        return _reported(component, version, Prestaged(missing=dict.fromkeys(kernels, exc.message)))
    ready, missing, prior = [], {}, {}
    for kernel in kernels:
        final = packages.package_dir(root, kernel, component, version)
        before = packages.active_version(root, kernel, component)
        try:
            if not final.is_dir():
                entry = sources.select(index, source.uri, component, version, kernel, flavour)
                await _install_for(installer, source, entry, final, kernel)
            packages.select_version(root, kernel, component, version)
            await installer.kernel.depmod(kernel)
        except sources.SourceError as exc:
            missing[kernel] = exc.message
            continue
        except InstallError as exc:
            missing[kernel] = exc.message
            continue
        except (OSError, KernelError) as exc:  # never fails the install that stands
            missing[kernel] = str(exc)
            continue
        ready.append(kernel)
        prior[kernel] = before
    return _reported(component, version, Prestaged(tuple(ready), missing, prior))


def recorded(
    done: Prestaged, version: str, earlier: dict[str, PrestagedKernel]
) -> dict[str, PrestagedKernel]:
    """The component record's `prestaged` after pre-staging `version` did `done`: a kernel
    that already had the version keeps what an earlier install of it recorded (a repeated
    install must not make the version its own prior), one that had it by other means gets
    nothing to undo."""
    kept = dict(earlier)
    for kernel in done.ready:
        before = done.prior.get(kernel)
        if kernel in kept and kept[kernel].version == version:
            continue
        if before == version:
            kept.pop(kernel, None)
            continue
        kept[kernel] = PrestagedKernel(version=version, prior=before)
    return kept


@dataclass(frozen=True)
class Restored:
    """What a rollback did to the kernels pre-staging had touched."""

    restored: tuple[str, ...] = ()
    """Kernels that boot the version they had before pre-staging again (or none)."""
    not_restored: dict[str, str] = field(default_factory=dict)
    """Kernel -> why its version from before could not be made active again."""
    kept: dict[str, PrestagedKernel] = field(default_factory=dict)
    """The record's entries the rollback left (those of the version rolled back to)."""


async def restore(
    installer: Installer, component: str, target: str, staged: dict[str, PrestagedKernel]
) -> Restored:
    """Undo pre-staging on the host's other kernels as a rollback to `target` undoes the
    install on the running one: each kernel pre-staging gave another version than `target`
    gets the version active before again, or, when it had none or that version is gone from
    disk, no active version; the version pre-staged is removed and `depmod` indexes the
    kernel again. A kernel whose active version is no longer the one pre-staged was changed
    since by other means and is left alone. Never raises for one kernel: a kernel that
    cannot be restored is reported (`Restored.not_restored`)."""
    root = installer.root
    restored, not_restored, kept = [], {}, {}
    for kernel, entry in sorted(staged.items()):
        if entry.version == target:
            kept[kernel] = entry
            continue
        if packages.active_version(root, kernel, component) != entry.version:
            log.info(
                "kernel %s no longer has the pre-staged %s %s active: left as it is",
                kernel, component, entry.version,
            )  # fmt: skip
            continue
        prior = entry.prior
        try:
            if prior is not None and packages.package_dir(root, kernel, component, prior).is_dir():
                packages.select_version(root, kernel, component, prior)
            else:
                if prior is not None:
                    not_restored[kernel] = f"{component} {prior}, active before, is gone from disk"
                    prior = None
                (packages.component_dir(root, kernel, component) / packages.ACTIVE).unlink(
                    missing_ok=True
                )
            _remove_version(root, kernel, component, entry.version)
            await installer.kernel.depmod(kernel)
        except (OSError, KernelError) as exc:  # the running kernel's rollback stands
            not_restored[kernel] = str(exc)
            continue
        if kernel in not_restored:
            continue
        restored.append(kernel)
        log.info(
            "kernel %s boots %s %s again instead of the pre-staged %s",
            kernel, component, prior or "no version", entry.version,
        )  # fmt: skip
    for kernel, why in sorted(not_restored.items()):
        log.warning(
            "kernel %s: could not make the %s it had before pre-staging active again: %s "
            "(a reboot into it comes up without a driver until reinstalled)",
            kernel, component, why,
        )  # fmt: skip
    return Restored(tuple(restored), not_restored, kept)


def _remove_version(root: HostRoot, kernel: str, component: str, version: str) -> None:
    """Uninstall `version` for `kernel` as `Installer.remove` does for the running one:
    renamed aside first, then deleted."""
    directory = packages.package_dir(root, kernel, component, version)
    if not directory.is_dir():
        return
    doomed = directory.with_name(f"{UNPACK_PREFIX}removed-{version}-{uuid.uuid4().hex[:8]}")
    directory.rename(doomed)
    shutil.rmtree(doomed, ignore_errors=True)


async def _install_for(
    installer: Installer,
    source: sources.DriverSource,
    entry: sources.IndexEntry,
    final: Path,
    kernel: str,
) -> None:
    """Fetch, verify and check `entry` for `kernel`, then rename its modules into `final`."""
    token = uuid.uuid4().hex[:12]
    download = installer.root.join(f"{STAGING}/{entry.component}-{entry.version}-{kernel}-{token}")
    unpacked = final.parent / f"{UNPACK_PREFIX}{entry.version}-{token}"
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        # the installer's own fetch and checks: digest, manifest, vermagic for `kernel`
        archive = await installer._fetch(source, entry, download)
        await installer._unpack_checked(
            archive, unpacked, entry.component, entry.version, kernel, entry.flavour
        )
        for part in SHARED_PARTS:
            shutil.rmtree(unpacked / part, ignore_errors=True)
        unpacked.rename(final)
    finally:
        shutil.rmtree(download, ignore_errors=True)
        shutil.rmtree(unpacked, ignore_errors=True)


def _reported(component: str, version: str, done: Prestaged) -> Prestaged:
    for kernel in done.ready:
        log.info("pre-staged %s %s for kernel %s", component, version, kernel)
    for kernel, why in sorted(done.missing.items()):
        log.warning(
            "no %s %s for kernel %s, which the node may boot next: %s (it would come up "
            "without a driver until reinstalled)",
            component, version, kernel, why,
        )  # fmt: skip
    return done
