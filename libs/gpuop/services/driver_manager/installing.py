"""Installing a driver package from a driver source, so that a crash at any line leaves the
previous driver intact and at worst some staging debris that `clean_staging` removes.

Called by `executor.Executor` for `InstallDriver` (and for a rollback to a version that is no
longer installed):

    1. pin the active version: a component without an `active` file gets one naming the
       version that is active now, so the new directory does not become "the newest
       installed" that depmod would index (`gpuop.host.packages`)
    2. admit the command's source, keys and version under the node's own trust anchor
       (`anchors`, from the agent's config), read the source's index and check its minisign
       signature against the keys admitted and its age (`verifying`; an unsigned index only
       where both allow it), pick the build for (component, version, running kernel); the
       command's digest, when it names one, must be the signed index's too
    3. download into `<host root>/var/lib/gpuop/staging/<id>/`, hashing as it writes, and
       compare with the index
    4. unpack into `.staging-<version>-<id>/` next to the final directory, refusing anything
       but plain files with plain names, and check the package's manifest
    5. rename it to `lib/modules/<kernel>/updates/gpuop/<component>/<version>/` (atomic: the
       version is either fully installed or absent), drop the download, run depmod

The active version is left alone: `load` selects the version it loads. A version directory
that already exists counts as installed (this command ran before, or the package was put
there by other means), so a repeated install only runs depmod again.

`stage` (for `StageDriver`, sent before the node is cordoned) runs steps 2 to 4 and the
modules' checks without installing anything, and keeps the verified archive (`staging`);
the install then takes that copy, its digest checked again, instead of steps 2 and 3.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import shutil
import tarfile
import uuid
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from gpuop.clocks import Clock
from gpuop.events import driver as dm
from gpuop.events.driver import InstallFailureReason
from gpuop.host import kmod, manifests, packages, packaging, system
from gpuop.host.errors import HostReadError, KernelError
from gpuop.host.protocol import KernelOps
from gpuop.host.roots import HostRoot
from gpuop.services.driver_manager import anchors, sources, staging
from gpuop.services.driver_manager.config import DriverManagerConfig

log = logging.getLogger(__name__)

STAGING = "var/lib/gpuop/staging"
"""Downloads in progress, under the host root; emptied when the agent starts."""
UNPACK_PREFIX = ".staging-"
"""Unpacked packages waiting for their rename, beside the installed versions."""


class InstallError(Exception):
    """The install failed; the previous installation is untouched."""

    def __init__(
        self, reason: InstallFailureReason, message: str, *, retryable: bool = False
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.retryable = retryable


@dataclass(frozen=True)
class Installed:
    version: str
    sha256: str | None
    """Digest of the archive installed; None for a version found already installed."""
    fresh: bool
    """False when the version directory was already there."""
    flavour: str | None = None
    """The installed modules' flavour, as the package's manifest names it (format 2)."""


class Installer:
    """Installs packages into one host root."""

    def __init__(
        self, root: HostRoot, kernel: KernelOps, config: DriverManagerConfig, clock: Clock
    ) -> None:
        self.root = root
        self.kernel = kernel
        self.config = config
        self.clock = clock

    def remove(self, component: str, version: str) -> bool:
        """Uninstall `version` unless it is the active one: renamed aside first (so it is
        either fully installed or gone; `clean_staging` finishes an interrupted removal),
        then deleted. False when it was not installed or is active."""
        kernel_release = running_kernel(self.root)
        if packages.active_version(self.root, kernel_release, component) == version:
            return False
        directory = packages.package_dir(self.root, kernel_release, component, version)
        if not directory.is_dir():
            return False
        doomed = directory.with_name(f"{UNPACK_PREFIX}removed-{version}-{uuid.uuid4().hex[:8]}")
        directory.rename(doomed)
        _remove(doomed)
        log.info("removed %s %s for %s", component, version, kernel_release)
        return True

    async def install(
        self, component: str, version: str, where: dm.DriverSource, flavour: str | None = None
    ) -> Installed:
        """Install `version` of `component` from `where`, believing its index only once its
        signature verifies with `where`'s keys, and refusing a package whose digest differs
        from the index's entry or from `where.sha256`. A staged copy (`stage`) whose digest
        still verifies is installed without asking the source again. With `flavour`, only a
        package of those kernel modules (`sources.select`); the same version installed with
        the other ones is replaced (a flavour change: the install precedes the unload, and a
        loaded module keeps running from memory)."""
        self._check_version(component, version)
        kernel_release = running_kernel(self.root)
        _pin_active(self.root, kernel_release, component)
        final = packages.package_dir(self.root, kernel_release, component, version)
        replacing = final.is_dir() and not serves(installed_flavour(final), flavour)
        if final.is_dir() and not replacing:
            log.info("%s %s is already installed for %s", component, version, kernel_release)
            await self._depmod(kernel_release)
            return Installed(version, None, fresh=False, flavour=installed_flavour(final))
        if replacing:
            log.info(
                "%s %s is installed for %s with other kernel modules than %s: replacing it",
                component, version, kernel_release, flavour,
            )  # fmt: skip
        staged = self._staged(component, version, kernel_release, where, flavour)
        token = uuid.uuid4().hex[:12]
        download = self.root.join(f"{STAGING}/{component}-{version}-{token}")
        unpacked = final.parent / f"{UNPACK_PREFIX}{version}-{token}"
        try:
            if staged is not None:
                archive, digest = staging.archive_of(self.root, staged), staged.sha256
                flavour = staged.flavour
            else:
                source, entry = await self._entry(
                    component, version, kernel_release, where, flavour
                )
                archive = await self._fetch(source, entry, download)
                digest, flavour = entry.sha256, entry.flavour
            manifest = await self._unpack_checked(
                archive, unpacked, component, version, kernel_release, flavour
            )
            if isinstance(manifest, manifests.ManifestV2):
                _place_v2(self.root, unpacked, manifest)
            if self.config.install_pause_seconds:
                log.warning(
                    "pausing %.1f s before the rename (fault injection)",
                    self.config.install_pause_seconds,
                )
                await self.clock.sleep(self.config.install_pause_seconds)
            if replacing:
                # a crash between the two renames leaves the version uninstalled, never
                # half of each flavour; the aside copy is staging debris (`clean_staging`)
                aside = final.with_name(f"{UNPACK_PREFIX}replaced-{version}-{token}")
                final.rename(aside)
                unpacked.rename(final)
                _remove(aside)
            else:
                unpacked.rename(final)
        except OSError as exc:
            raise _disk_error(exc) from None
        finally:
            shutil.rmtree(download, ignore_errors=True)
            shutil.rmtree(unpacked, ignore_errors=True)
        staging.discard(self.root, component, version, kernel_release)
        await self._depmod(kernel_release)
        return Installed(version, digest, fresh=True, flavour=installed_flavour(final))

    async def stage(
        self, component: str, version: str, where: dm.DriverSource, flavour: str | None = None
    ) -> Installed:
        """Fetch `version` of `component` from `where` and verify it as `install` would,
        unpack it and check that the running kernel takes its modules (vermagic, and
        signatures under lockdown or Secure Boot), then keep the verified archive for the
        install (`staging`); nothing is installed. `InstallError` for every reason the
        install would fail for. A version installed already needs no staging (`fresh`
        False); a staged copy the index still lists is kept as it is."""
        self._check_version(component, version)
        kernel_release = running_kernel(self.root)
        installed = packages.package_dir(self.root, kernel_release, component, version)
        if installed.is_dir() and serves(installed_flavour(installed), flavour):
            log.info("%s %s is already installed for %s", component, version, kernel_release)
            return Installed(version, None, fresh=False)
        source, entry = await self._entry(component, version, kernel_release, where, flavour)
        found = staging.find(self.root, component, version, kernel_release)
        if found is not None and found.sha256 == entry.sha256 and staging.intact(self.root, found):
            log.info("%s %s is staged already for %s", component, version, kernel_release)
            return Installed(version, found.sha256, fresh=False)
        work = self.root.join(f"{STAGING}/{component}-{version}-{uuid.uuid4().hex[:12]}")
        try:
            archive = await self._fetch(source, entry, work)
            await self._unpack_checked(
                archive, work / "unpacked", component, version, kernel_release, entry.flavour
            )
            staged = staging.Staged(
                component=component,
                version=version,
                kernel_release=kernel_release,
                file=archive.name,
                sha256=entry.sha256,
                flavour=entry.flavour,
            )
            await asyncio.to_thread(staging.keep, self.root, archive, staged)
        except OSError as exc:
            raise _disk_error(exc) from None
        finally:
            shutil.rmtree(work, ignore_errors=True)
        log.info(
            "staged %s %s for %s (sha256 %s)", component, version, kernel_release, entry.sha256
        )
        return Installed(version, entry.sha256, fresh=True)

    def _staged(
        self,
        component: str,
        version: str,
        kernel_release: str,
        where: dm.DriverSource,
        flavour: str | None = None,
    ) -> staging.Staged | None:
        """The staged copy the install may take: one whose digest is the command's (when it
        names one), of the command's flavour, and whose archive still has it. A copy that
        fails any is dropped."""
        found = staging.find(self.root, component, version, kernel_release)
        if found is None:
            return None
        if not serves(found.flavour, flavour):
            log.warning(
                "dropping the staged %s %s: its modules are %s, the command asks for %s",
                component, version, found.flavour, flavour,
            )  # fmt: skip
        elif where.sha256 not in (None, found.sha256):
            log.warning(
                "dropping the staged %s %s: sha256 %s, the command expects %s",
                component, version, found.sha256, where.sha256,
            )  # fmt: skip
        elif not staging.intact(self.root, found):
            log.warning(
                "dropping the staged %s %s: its archive no longer has sha256 %s; fetching again",
                component, version, found.sha256,
            )  # fmt: skip
        else:
            return found
        staging.discard(self.root, component, version, kernel_release)
        return None

    async def _entry(
        self,
        component: str,
        version: str,
        kernel_release: str,
        where: dm.DriverSource,
        flavour: str | None = None,
    ) -> tuple[sources.DriverSource, sources.IndexEntry]:
        """The source `where` names and its signed index's entry for the package (of
        `flavour`, when given), checked against the command's digest."""
        try:
            source = self.open_source(where)
            entry = sources.select(
                await source.index(), source.uri, component, version, kernel_release, flavour
            )
        except sources.SourceError as exc:
            raise InstallError(exc.reason, exc.message, retryable=exc.retryable) from None
        if where.sha256 is not None and where.sha256 != entry.sha256:
            raise InstallError(
                InstallFailureReason.VERIFICATION_FAILED,
                f"the source lists {entry.file} with sha256 {entry.sha256}, "
                f"the command expects {where.sha256}",
            )
        return source, entry

    def open_source(self, where: dm.DriverSource) -> sources.DriverSource:
        """The source `where` names, as the node's trust anchor admits it (its keys, its
        CA, its index age); `SourceError(verification-failed)` when the anchor refuses."""
        try:
            admitted = anchors.admit(self.config.trust, where)
        except anchors.AnchorRefusal as exc:
            log.warning("%s", exc)
            raise sources.SourceError(InstallFailureReason.VERIFICATION_FAILED, str(exc)) from None
        max_age = self.config.trust.max_index_age_seconds
        now = self.clock.now().timestamp()
        return sources.open_source(
            admitted,
            connect_timeout=self.config.connect_timeout_seconds,
            read_timeout=self.config.read_timeout_seconds,
            max_bytes=self.config.max_package_bytes,
            signed_after=None if max_age is None else now - max_age,
        )

    def _check_version(self, component: str, version: str) -> None:
        try:
            anchors.check_version(self.config.trust, component, version)
        except anchors.AnchorRefusal as exc:
            log.warning("%s", exc)
            raise InstallError(InstallFailureReason.VERIFICATION_FAILED, str(exc)) from None

    async def _fetch(
        self, source: sources.DriverSource, entry: sources.IndexEntry, download: Path
    ) -> Path:
        """`entry`'s archive, downloaded into `download` (created here) and verified."""
        await asyncio.to_thread(download.mkdir, parents=True)
        name = PurePosixPath(entry.file).name
        try:
            fetched = await source.fetch(entry, download / name)
        except sources.SourceError as exc:
            raise InstallError(exc.reason, exc.message, retryable=exc.retryable) from None
        if fetched.sha256 != entry.sha256:
            raise InstallError(
                InstallFailureReason.VERIFICATION_FAILED,
                f"checksum mismatch: {name} has sha256 {fetched.sha256}, "
                f"the index says {entry.sha256}",
            )
        return fetched.path

    async def _unpack_checked(
        self,
        archive: Path,
        unpacked: Path,
        component: str,
        version: str,
        kernel_release: str,
        flavour: str | None,
    ) -> manifests.ManifestV1 | manifests.ManifestV2 | None:
        """Unpack `archive` into `unpacked` and check its manifest and (format 2) that the
        running kernel takes its modules; the manifest."""
        limit = self.config.max_package_bytes * 4
        await asyncio.to_thread(_unpack, archive, unpacked, limit)
        manifest = _check_manifest(
            unpacked, archive.name, component, version, kernel_release, flavour
        )
        if isinstance(manifest, manifests.ManifestV2):
            await asyncio.to_thread(check_loadable, self.root, unpacked, manifest, kernel_release)
        return manifest

    async def _depmod(self, kernel_release: str) -> None:
        try:
            await self.kernel.depmod(kernel_release)
        except KernelError as exc:
            raise InstallError(
                InstallFailureReason.OTHER, f"installed, but {exc}", retryable=True
            ) from None


def running_kernel(root: HostRoot) -> str:
    """The host's running kernel release; `InstallError` when the host root does not say."""
    try:
        release = system.kernel_release(root)
    except HostReadError as exc:
        raise InstallError(InstallFailureReason.OTHER, str(exc)) from None
    if release is None:
        raise InstallError(
            InstallFailureReason.OTHER, f"{root.path} does not say which kernel runs"
        )
    return release


def installed_flavour(directory: Path) -> str | None:
    """The kernel modules of the package installed in `directory`, as its format-2 manifest
    names them; None for a format-1 package (or none kept), which serves either."""
    path = directory / packaging.MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = manifests.parse(path.read_bytes(), str(path))
    except manifests.ManifestError:
        return None
    return manifest.flavour.value if isinstance(manifest, manifests.ManifestV2) else None


def serves(present: str | None, wanted: str | None) -> bool:
    """Whether a package of flavour `present` (None: format 1, which names none) is what a
    command asking for `wanted` (None: any) may use."""
    return wanted is None or present is None or present == wanted


def clean_staging(root: HostRoot) -> list[Path]:
    """Remove what interrupted installs left behind (downloads, unpacked directories not
    yet renamed into place); the paths removed. Only safe while no install runs, that is
    when the agent starts holding the state lock."""
    removed: list[Path] = []
    staging = root.join(STAGING)
    if staging.is_dir():
        for entry in sorted(staging.iterdir()):
            _remove(entry)
            removed.append(entry)
    for component_dir in sorted(root.join("lib/modules").glob(f"*/{packages.UPDATES}/*")):
        for entry in sorted(component_dir.glob(f"{UNPACK_PREFIX}*")):
            _remove(entry)
            removed.append(entry)
    return removed


def _pin_active(root: HostRoot, kernel_release: str, component: str) -> None:
    marker = packages.component_dir(root, kernel_release, component) / packages.ACTIVE
    if marker.is_file():
        return
    current = packages.active_version(root, kernel_release, component)
    if current is not None:
        packages.select_version(root, kernel_release, component, current)


MAX_MEMBERS = 10_000
"""Files one package may hold: a driver has hundreds; an archive of millions of empty files
would exhaust the host's inodes long before its byte limit."""
MAX_DEPTH = 8
"""Path parts a member's name may have (`userspace/lib/libcuda.so.535.261.03` has three)."""
SPACE_RESERVE_BYTES = 256 << 20
"""Left free on the host's filesystem after unpacking, for everything else on the node."""


def _unpack(archive: Path, destination: Path, limit: int) -> None:
    """Extract the archive into `destination` (created here); `InstallError` for an
    unreadable archive, a member that is not a plain file with a relative name that stays
    inside (format 2 packages have `modules/`, `userspace/` and `firmware/`), more than
    `MAX_MEMBERS` files, more than `limit` bytes, or more than the filesystem can hold
    keeping `SPACE_RESERVE_BYTES` free (checked before each member is written, from the
    sizes the archive declares, so a bomb is refused before it fills the disk)."""
    destination.mkdir(parents=True)
    room = shutil.disk_usage(destination).free - SPACE_RESERVE_BYTES
    total = 0
    try:
        with tarfile.open(archive, mode="r:*") as tar:
            for count, member in enumerate(tar, start=1):
                if count > MAX_MEMBERS:
                    raise InstallError(
                        InstallFailureReason.OTHER,
                        f"refusing {archive.name}: it holds more than {MAX_MEMBERS} files",
                    )
                path = PurePosixPath(member.name)
                if (
                    path.is_absolute()
                    or not path.parts
                    or any(part in ("", ".", "..") for part in path.parts)
                    or len(path.parts) > MAX_DEPTH
                ):
                    raise InstallError(
                        InstallFailureReason.OTHER,
                        f"refusing {archive.name}: member {member.name!r} would be written "
                        "outside the package directory",
                    )
                if not member.isfile():
                    raise InstallError(
                        InstallFailureReason.OTHER,
                        f"refusing {archive.name}: member {member.name!r} is not a plain file",
                    )
                total += member.size
                if total > limit:
                    raise InstallError(
                        InstallFailureReason.OTHER,
                        f"refusing {archive.name}: it unpacks to more than {limit} bytes",
                    )
                if total > room:
                    raise InstallError(
                        InstallFailureReason.NO_SPACE,
                        f"refusing {archive.name}: unpacking it would leave less than "
                        f"{SPACE_RESERVE_BYTES >> 20} MiB free on the host",
                        retryable=True,
                    )
                tar.extract(member, destination, filter="data")
    except (tarfile.TarError, EOFError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise
        raise InstallError(
            InstallFailureReason.OTHER,
            f"package archive {archive.name} is unreadable: {type(exc).__name__}: {exc}",
        ) from None


def _check_manifest(
    directory: Path,
    archive: str,
    component: str,
    version: str,
    kernel_release: str,
    flavour: str | None = None,
) -> manifests.ManifestV1 | manifests.ManifestV2 | None:
    """The unpacked package's manifest, once it says what the index said and (format 2)
    every file is listed with its sha256 and mode; `InstallError` otherwise. None for a
    format 1 package without one."""
    path = directory / packaging.MANIFEST
    manifest: manifests.ManifestV1 | manifests.ManifestV2 | None = None
    if path.is_file():
        try:
            manifest = manifests.parse(path.read_bytes(), f"{archive}: {packaging.MANIFEST}")
        except manifests.ManifestError as exc:
            raise InstallError(InstallFailureReason.OTHER, str(exc)) from None
    if not isinstance(manifest, manifests.ManifestV2):
        _check_flat(directory, archive)
    if manifest is None:
        return None
    said = (manifest.component, manifest.version, manifest.kernel_release)
    if said != (component, version, kernel_release):
        raise InstallError(
            InstallFailureReason.VERIFICATION_FAILED,
            f"{archive} says it holds {' '.join(map(str, said))}, "
            f"not {component} {version} {kernel_release}",
        )
    if isinstance(manifest, manifests.ManifestV2):
        if flavour is not None and manifest.flavour.value != flavour:
            raise InstallError(
                InstallFailureReason.VERIFICATION_FAILED,
                f"{archive} holds the {manifest.flavour.value} modules; the index says {flavour}",
            )
        _check_files(directory, archive, manifest)
    return manifest


def _check_flat(directory: Path, archive: str) -> None:
    nested = sorted(p.name for p in directory.iterdir() if p.is_dir())
    if nested:
        raise InstallError(
            InstallFailureReason.OTHER,
            f"package archive {archive} has directories ({', '.join(nested)}) but no format 2 "
            f"manifest ({manifests.FORMAT_V2!r}) saying what they hold",
        )
    modules = sorted(p.name for p in directory.glob(f"*{packages.MODULE_SUFFIX}"))
    if not modules:
        raise InstallError(
            InstallFailureReason.OTHER, f"package archive {archive} holds no kernel modules"
        )


def _check_files(directory: Path, archive: str, manifest: manifests.ManifestV2) -> None:
    """Every file of a format 2 package is listed, and has its listed sha256 and mode."""
    present = {
        p.relative_to(directory).as_posix()
        for p in directory.rglob("*")
        if not p.is_dir() and p.name != packaging.MANIFEST
    }
    listed = {f.path for f in manifest.files}
    if unlisted := sorted(present - listed):
        raise InstallError(
            InstallFailureReason.VERIFICATION_FAILED,
            f"{archive} holds files its manifest does not list: {', '.join(unlisted[:5])}",
        )
    if missing := sorted(listed - present):
        raise InstallError(
            InstallFailureReason.VERIFICATION_FAILED,
            f"{archive} lacks files its manifest lists: {', '.join(missing[:5])}",
        )
    for entry in manifest.files:
        path = directory / entry.path
        digest = packaging.sha256_of(path)
        if digest != entry.sha256:
            raise InstallError(
                InstallFailureReason.VERIFICATION_FAILED,
                f"{archive}: {entry.path} has sha256 {digest}, its manifest says "
                f"{entry.sha256} (the file was changed after the package was built)",
            )
        mode = path.stat().st_mode & 0o7777
        if mode != entry.mode_bits:
            raise InstallError(
                InstallFailureReason.VERIFICATION_FAILED,
                f"{archive}: {entry.path} has mode {mode:04o}, its manifest says {entry.mode}",
            )
    for link in manifest.links:
        (directory / link.path).symlink_to(link.target)


def check_loadable(
    root: HostRoot, directory: Path, manifest: manifests.ManifestV2, kernel_release: str
) -> None:
    """Before anything is unloaded (and, by the saga, before the node is cordoned): the
    unpacked format 2 package in `directory` has modules the running kernel takes, by
    `modinfo`: vermagic of `kernel_release`, and signed when the host is in lockdown or
    Secure Boot. `InstallError` with reason `kernel-mismatch` or `unsigned-module`."""
    paths = [directory / f.path for f in manifest.of_role(manifests.Role.MODULE)]
    try:
        kmod.check_modules(paths, kernel_release, kmod.signatures_required(root), root)
    except kmod.ModuleRefused as exc:
        raise InstallError(InstallFailureReason(exc.reason), exc.message) from None
    except KernelError as exc:
        raise InstallError(InstallFailureReason.OTHER, f"modinfo: {exc}") from None


USERSPACE = packages.USERSPACE
"""Format 2 user space, under the host root: `<component>/<version>/{lib,bin,etc}`, and the
`current` link naming the version in use (`activate_userspace`)."""
CURRENT = packages.CURRENT
FIRMWARE = "lib/firmware/nvidia"
"""Format 2 firmware, under the host root: `<version>/gsp_*.bin`, where the module looks."""


def userspace_dir(root: HostRoot, component: str, version: str | None = None) -> Path:
    """Where `component`'s user space versions live, or `version`'s."""
    base = root.join(f"{USERSPACE}/{component}")
    return base if version is None else base / version


def _place_v2(root: HostRoot, unpacked: Path, manifest: manifests.ManifestV2) -> None:
    """Move the user space and firmware of an unpacked format 2 package to their places (the
    same filesystem: renames); the modules stay for the version directory's rename."""
    userspace = unpacked / "userspace"
    if userspace.is_dir():
        prefix = userspace_dir(root, manifest.component, manifest.version)
        prefix.parent.mkdir(parents=True, exist_ok=True)
        if prefix.exists():
            doomed = prefix.with_name(f".{UNPACK_PREFIX}{manifest.version}-{uuid.uuid4().hex[:8]}")
            prefix.rename(doomed)
            _remove(doomed)
        userspace.rename(prefix)
    firmware = unpacked / "firmware"
    if firmware.is_dir():
        target = root.join(f"{FIRMWARE}/{manifest.version}")
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            log.info("firmware %s is already in place", target)
        else:
            firmware.rename(target)


def activate_userspace(root: HostRoot, component: str, version: str) -> str | None:
    """Make `version`'s user space the one in use with one atomic rename of the `current`
    link (a new link beside it, renamed over it); the version it named before, for the
    rollback to flip back, or None. `InstallError` when the version is not installed."""
    base = userspace_dir(root, component)
    if not (base / version).is_dir():
        raise InstallError(
            InstallFailureReason.NOT_FOUND,
            f"{component} {version} has no user space installed under {base}",
        )
    current = base / CURRENT
    previous = os.readlink(current) if current.is_symlink() else None
    fresh = base / f".{CURRENT}-{uuid.uuid4().hex[:8]}"
    fresh.symlink_to(version)
    os.replace(fresh, current)
    return previous


def select_userspace(root: HostRoot, component: str, version: str) -> str | None:
    """What `load` calls with the modules' switch: `version`'s user space becomes the one in
    use (`activate_userspace`) when the version has one (format 2); a version without one
    (format 1) leaves no `current` link, so no other version's libraries stay in use beside
    its modules. The version in use before, or None."""
    if userspace_dir(root, component, version).is_dir():
        return activate_userspace(root, component, version)
    current = userspace_dir(root, component) / CURRENT
    previous = os.readlink(current) if current.is_symlink() else None
    current.unlink(missing_ok=True)
    return previous


def restore_userspace(root: HostRoot, component: str, previous: str | None) -> None:
    """Undo `select_userspace`: the `current` link names `previous` again (or none)."""
    if previous is not None and userspace_dir(root, component, previous).is_dir():
        activate_userspace(root, component, previous)
    elif previous is None:
        (userspace_dir(root, component) / CURRENT).unlink(missing_ok=True)


def active_userspace(root: HostRoot, component: str) -> str | None:
    """The version whose user space is in use, or None."""
    current = userspace_dir(root, component) / CURRENT
    return os.readlink(current) if current.is_symlink() else None


def _disk_error(exc: OSError) -> InstallError:
    if exc.errno == errno.ENOSPC:
        return InstallError(
            InstallFailureReason.NO_SPACE, f"the host ran out of disk space: {exc}", retryable=True
        )
    return InstallError(InstallFailureReason.OTHER, f"installing failed: {exc}")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
