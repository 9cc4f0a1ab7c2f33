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
        source = sources.open_source(
            where,
            connect_timeout=installer.config.connect_timeout_seconds,
            read_timeout=installer.config.read_timeout_seconds,
            max_bytes=installer.config.max_package_bytes,
        )
        index = await source.index()
    except sources.SourceError as exc:
        return _reported(component, version, Prestaged(missing=dict.fromkeys(kernels, exc.message)))
    ready, missing = [], {}
    for kernel in kernels:
        final = packages.package_dir(root, kernel, component, version)
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
    return _reported(component, version, Prestaged(tuple(ready), missing))


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
