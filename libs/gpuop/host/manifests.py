"""What a driver package says it holds: its `manifest.json`, format 1 (module stand-ins, flat)
or format 2 (a real driver: kernel modules, user space and firmware).

Format 2 (`proto/packages/manifest-v2.schema.json` is the same rules as a JSON Schema):

    {"format": "gpuop-package/2",
     "component": "gpu", "version": "535.261.03", "flavour": "open",
     "kernel_release": "6.1.0-57-amd64",
     "files": [{"path": "modules/nvidia.ko", "sha256": "<hex>", "mode": "0644",
                "role": "module"}, ...],
     "links": [{"path": "userspace/lib/libcuda.so.1", "target": "libcuda.so.535.261.03"}],
     "built_from": [{"name": "nvidia-kernel-dkms", "version": "535.261.03-1",
                     "sha256": "<hex of the .deb>"}]}

Every file of the archive is listed once, in the directory its role belongs to:

    role      directory     what
    module    modules/      `<module>.ko`, installed under `lib/modules/<kernel>/updates/gpuop`
    library   userspace/    `userspace/lib/...`: libnvidia-ml, libcuda, ...
    binary    userspace/    `userspace/bin/...`: nvidia-smi, nvidia-persistenced
    config    userspace/    `userspace/etc/...`
    firmware  firmware/     GSP firmware, installed under `lib/firmware/nvidia/<version>/`

`links` are symbolic links the installer makes inside `userspace/`, each to a file or link
beside it (a relative target with no `/`); the archive itself holds only plain files.

Format 1, the stand-in packages of `gpuop.host.packaging`, has no `format` key:
`{"component", "version", "kernel_release", "modules": [names]}` beside flat `<module>.ko`
files. `parse` reads either and raises `ManifestError`, naming the field, for anything else.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import PurePosixPath
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from gpuop.events import documents

FORMAT_V2: Literal["gpuop-package/2"] = "gpuop-package/2"
NAME = "manifest.json"

_SHA256 = r"^[0-9a-f]{64}$"
_MODE = r"^0[0-7]{3}$"
_VERSION = r"^[0-9A-Za-z][0-9A-Za-z.+~-]{0,63}$"
_RELEASE = r"^[0-9A-Za-z][0-9A-Za-z._+~-]{0,255}$"
_PATH = r"^(modules|userspace|firmware)(/(?!\.{1,2}(/|$))[A-Za-z0-9._+@-]+)+$"
_LINK_TARGET = r"^[A-Za-z0-9._+@-]+$"


class Flavour(StrEnum):
    """Which of NVIDIA's two kernel module trees a package's modules were built from."""

    OPEN = "open"
    PROPRIETARY = "proprietary"


class Role(StrEnum):
    """What a file of a package is for, and so where it goes."""

    MODULE = "module"
    LIBRARY = "library"
    BINARY = "binary"
    FIRMWARE = "firmware"
    CONFIG = "config"


DIRECTORY_OF_ROLE = {
    Role.MODULE: "modules",
    Role.LIBRARY: "userspace",
    Role.BINARY: "userspace",
    Role.CONFIG: "userspace",
    Role.FIRMWARE: "firmware",
}


class ManifestError(ValueError):
    """A manifest that is not one; the message names what is wrong."""


class PackageFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", regex_engine="python-re")

    path: Annotated[str, StringConstraints(pattern=_PATH, max_length=1024)]
    sha256: Annotated[str, StringConstraints(pattern=_SHA256)]
    mode: Annotated[str, StringConstraints(pattern=_MODE)]
    """Octal permission bits, `0644` or `0755`; set bits above these are refused."""
    role: Role

    @property
    def mode_bits(self) -> int:
        return int(self.mode, 8)


class PackageLink(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", regex_engine="python-re")

    path: Annotated[str, StringConstraints(pattern=_PATH, max_length=1024)]
    target: Annotated[str, StringConstraints(pattern=_LINK_TARGET, max_length=255)]


class BuiltFrom(BaseModel):
    """One input of the build: a Debian package or NVIDIA's `.run` installer."""

    model_config = ConfigDict(frozen=True, extra="forbid", regex_engine="python-re")

    name: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    version: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    sha256: Annotated[str, StringConstraints(pattern=_SHA256)]


class ManifestV2(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", regex_engine="python-re")

    format: Literal["gpuop-package/2"]
    component: Literal["gpu", "ofed"]
    version: Annotated[str, StringConstraints(pattern=_VERSION)]
    flavour: Flavour
    kernel_release: Annotated[str, StringConstraints(pattern=_RELEASE)]
    files: Annotated[tuple[PackageFile, ...], Field(min_length=1, max_length=10_000)]
    links: Annotated[tuple[PackageLink, ...], Field(max_length=10_000)] = ()
    built_from: Annotated[tuple[BuiltFrom, ...], Field(max_length=256)] = ()

    def of_role(self, role: Role) -> tuple[PackageFile, ...]:
        return tuple(f for f in self.files if f.role is role)

    def modules(self) -> tuple[str, ...]:
        """Module names (`nvidia_uvm`), as the kernel knows them, from the `.ko` file names."""
        return tuple(
            PurePosixPath(f.path).name.removesuffix(".ko").replace("-", "_")
            for f in self.of_role(Role.MODULE)
        )

    def encode(self) -> bytes:
        return (json.dumps(self.model_dump(mode="json"), indent=2) + "\n").encode()


class ManifestV1(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    component: str
    version: str
    kernel_release: str
    modules: tuple[str, ...] = ()


def parse(data: bytes, where: str = NAME) -> ManifestV1 | ManifestV2:
    """The manifest in `data`; `ManifestError` naming `where` and the first faults otherwise.
    A document with `format` must be format 2 and pass every rule; one without is format 1."""
    try:
        document = documents.json_object(data)
    except ValueError as exc:
        raise ManifestError(f"{where} is {exc}") from None
    try:
        if "format" not in document:
            return ManifestV1.model_validate(document)
        if document["format"] != FORMAT_V2:
            raise ManifestError(
                f"{where}: format {document['format']!r} is not one this installer reads "
                f"(it reads {FORMAT_V2!r} and format 1, which has no format key)"
            )
        manifest = ManifestV2.model_validate(document)
    except ValidationError as exc:
        raise ManifestError(f"{where}: {_faults(exc)}") from None
    check_v2(manifest, where)
    return manifest


def check_v2(manifest: ManifestV2, where: str = NAME) -> None:
    """The rules a JSON Schema cannot say well: each role in its directory, modules named
    `.ko`, no path listed twice, links beside a listed file or link."""
    seen: set[str] = set()
    for entry in manifest.files:
        if entry.path in seen:
            raise ManifestError(f"{where}: {entry.path} is listed twice")
        seen.add(entry.path)
        directory = DIRECTORY_OF_ROLE[entry.role]
        if PurePosixPath(entry.path).parts[0] != directory:
            raise ManifestError(
                f"{where}: {entry.path} has role {entry.role.value}, whose files go under "
                f"{directory}/"
            )
        if entry.role is Role.MODULE and not entry.path.endswith(".ko"):
            raise ManifestError(f"{where}: module {entry.path} is not a .ko file")
        if entry.mode_bits & ~0o755:
            raise ManifestError(
                f"{where}: {entry.path} has mode {entry.mode}; a package's files are 0644 "
                "or 0755 at most (no setuid, no group or world write)"
            )
    if not manifest.of_role(Role.MODULE):
        raise ManifestError(f"{where}: lists no kernel module")
    for link in manifest.links:
        if not link.path.startswith("userspace/"):
            raise ManifestError(f"{where}: link {link.path} is not under userspace/")
        if link.path in seen:
            raise ManifestError(f"{where}: {link.path} is listed twice")
        seen.add(link.path)
    for link in manifest.links:
        target = str(PurePosixPath(link.path).parent / link.target)
        if target not in seen:
            raise ManifestError(
                f"{where}: link {link.path} points to {link.target}, which the package does "
                "not hold"
            )


def _faults(exc: ValidationError) -> str:
    faults = []
    for error in exc.errors()[:5]:
        location = ".".join(str(part) for part in error["loc"]) or "(top)"
        faults.append(f"{location}: {error['msg']}")
    more = exc.error_count() - len(faults)
    return "; ".join(faults) + (f" (and {more} more)" if more > 0 else "")
