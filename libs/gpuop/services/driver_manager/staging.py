"""Packages staged on the host before the node is cordoned, kept for the install that follows.

`installing.Installer.stage` (for `StageDriver`, which the saga sends before it cordons the
node) fetches a package, verifies its digest against the signed index, unpacks it and checks
that the running kernel takes its modules, then keeps the verified archive here with a record
of what it is:

    <host root>/var/lib/gpuop/staged/<component>/<version>/<kernel release>/
        <archive>        the package as the source served it
        staged.json      component, version, kernel, archive name, sha256, flavour

`Installer.install` (for `InstallDriver`, once the node is drained) installs from the staged
copy when its archive still has the recorded digest (and the command's, when it names one),
without asking the source again; a staged copy that does not verify is dropped and the
package fetched anew. The install drops the copy it used. Unlike the downloads under
`installing.STAGING`, a staged copy survives an agent restart: a driver-manager restarted
between the stage and the install still finds it.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from gpuop.events.fields import Sha256, Version
from gpuop.host import packaging
from gpuop.host.roots import HostRoot

log = logging.getLogger(__name__)

STAGED = "var/lib/gpuop/staged"
"""Staged packages, under the host root."""
RECORD = "staged.json"
"""What a staged directory holds, beside its archive."""


class Staged(BaseModel):
    """One staged package."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    component: str
    version: Version
    kernel_release: str
    file: str
    """The archive's file name inside the staged directory."""
    sha256: Sha256
    """The archive's digest, as the signed index listed it when it was staged."""
    flavour: str | None = None
    """Format 2: the module tree the index said the package holds."""


def directory(root: HostRoot, component: str, version: str, kernel_release: str) -> Path:
    """Where `version` of `component` for `kernel_release` is staged."""
    return root.join(f"{STAGED}/{component}/{version}/{kernel_release}")


def archive_of(root: HostRoot, staged: Staged) -> Path:
    """The staged archive's path."""
    return directory(root, staged.component, staged.version, staged.kernel_release) / staged.file


def find(root: HostRoot, component: str, version: str, kernel_release: str) -> Staged | None:
    """The staged copy of `version` for `kernel_release`, or None (none, or its record is
    unreadable: a copy nobody can vouch for is no copy)."""
    record = directory(root, component, version, kernel_release) / RECORD
    try:
        staged = Staged.model_validate_json(record.read_bytes())
    except (OSError, ValidationError):
        return None
    said = (staged.component, staged.version, staged.kernel_release)
    if said != (component, version, kernel_release) or "/" in staged.file:
        return None
    return staged


def intact(root: HostRoot, staged: Staged) -> bool:
    """The staged archive still has the digest it was staged with."""
    try:
        return packaging.sha256_of(archive_of(root, staged)) == staged.sha256
    except OSError:
        return False


def keep(root: HostRoot, archive: Path, staged: Staged) -> Staged:
    """Move the verified `archive` into its staged directory with its record, replacing any
    earlier copy of that version and dropping the other versions of the component staged
    for that kernel (a newer stage supersedes them). The directory appears whole or not at
    all: it is built beside its place and renamed into it."""
    final = directory(root, staged.component, staged.version, staged.kernel_release)
    final.parent.mkdir(parents=True, exist_ok=True)
    building = final.with_name(f".{final.name}-{uuid.uuid4().hex[:8]}")
    building.mkdir()
    try:
        shutil.move(archive, building / staged.file)
        (building / RECORD).write_text(staged.model_dump_json())
        if final.exists():
            _remove(final)
        os.rename(building, final)
    finally:
        _remove(building)
    component_dir = root.join(f"{STAGED}/{staged.component}")
    for other in component_dir.glob(f"*/{staged.kernel_release}"):
        if other.parent.name != staged.version:
            log.info("dropping %s, superseded by %s", other, staged.version)
            discard(root, staged.component, other.parent.name, staged.kernel_release)
    return staged


def discard(root: HostRoot, component: str, version: str, kernel_release: str) -> None:
    """Remove the staged copy of `version` for `kernel_release`, if any."""
    found = directory(root, component, version, kernel_release)
    _remove(found)
    for parent in (found.parent, found.parent.parent):
        try:
            parent.rmdir()  # only when empty
        except OSError:
            break


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink(missing_ok=True)
