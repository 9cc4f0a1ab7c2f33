"""Driver package archives made of module stand-ins, and a driver source directory of them.

Tests and the demo build their driver source with `build_driver_source`; the driver-manager
checks the index's signature, downloads from it, checks the sha256, and unpacks an archive into
`lib/modules/<kernel release>/updates/gpuop/<component>/<version>/` (see
`gpuop.host.packages`). An archive is a gzip-compressed tar, byte-for-byte reproducible, of

    manifest.json       {"component", "version", "kernel_release", "modules": [names]}
    <module>.ko         one `ModuleStandin` per module of the component

and `index.json` in the source directory lists every archive:

    {"packages": [{"component": "gpu", "version": "580.159.04",
                   "kernel_release": "6.18.44-fc-v657-gpu",
                   "sha256": "<hex digest of the archive>",
                   "file": "gpu-580.159.04-6.18.44-fc-v657-gpu.tar.gz"}, ...]}

signed by `index.json.minisig` beside it (minisign's format, `gpuop.host.signing`). Admins
sign a mirror they built with `sign_driver_source(directory, key)` (or `minisign -S -m
index.json`, which makes the same file) and list the public key in the policy's
`publicKeys`; `write_key_pair` makes a key pair in minisign's files (the secret key
unencrypted, what `minisign -G -W` writes), and `sign_driver_source` takes one from
`minisign -G -W` as well.
"""

from __future__ import annotations

import getpass
import gzip
import hashlib
import io
import json
import os
import sys
import tarfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from pydantic import ValidationError

from gpuop.host import indexing, manifests, packages, signing
from gpuop.host.files import write_atomic

MANIFEST = "manifest.json"
INDEX = "index.json"


@dataclass(frozen=True)
class BuiltPackage:
    """An archive `build_package` wrote."""

    component: str
    version: str
    kernel_release: str
    path: Path
    """The archive."""
    sha256: str
    """Hex SHA-256 of the archive's bytes."""
    flavour: str | None = None
    """Format 2: `open` or `proprietary`."""
    parameters: Mapping[str, Mapping[str, str]] | None = None
    """The parameters its modules declare, module to `{name: modinfo type}`; None: not read."""

    def index_entry(self) -> dict[str, object]:
        """This package's entry in a driver source's `index.json` (format 2 packages add
        `flavour`; packages whose modules declare parameters, `parameters`, which
        `gpuop upgrade start` checks the policy's `kernelModuleParameters` against)."""
        entry: dict[str, object] = {
            "component": self.component,
            "version": self.version,
            "kernel_release": self.kernel_release,
            "sha256": self.sha256,
            "file": self.path.name,
        }
        if self.flavour is not None:
            entry["flavour"] = self.flavour
        if self.parameters:
            entry["parameters"] = {m: dict(p) for m, p in sorted(self.parameters.items())}
        return entry


def archive_name(component: str, version: str, kernel_release: str) -> str:
    """`<component>-<version>-<kernel release>.tar.gz`."""
    return f"{component}-{version}-{kernel_release}.tar.gz"


def build_package(
    directory: Path, component: str, version: str, kernel_release: str, *, defective: bool = False
) -> BuiltPackage:
    """Write the archive of `component` at `version` for `kernel_release` into `directory`;
    `defective`: its modules load but bring up no GPU, so the driver fails validation."""
    standins = packages.standins_for(component, version, kernel_release, defective=defective)
    manifest = {
        "component": component,
        "version": version,
        "kernel_release": kernel_release,
        "modules": [standin.name for standin in standins],
    }
    members = [(MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())]
    members += [(f"{s.name}{packages.MODULE_SUFFIX}", s.encode()) for s in standins]
    data = _reproducible_tar_gz(members)
    path = directory / archive_name(component, version, kernel_release)
    write_atomic(path, data)
    declared = {s.name: dict(s.parameters) for s in standins if s.parameters}
    digest = hashlib.sha256(data).hexdigest()
    return BuiltPackage(component, version, kernel_release, path, digest, parameters=declared)


def archive_name_v2(component: str, version: str, flavour: str, kernel_release: str) -> str:
    """`<component>-<version>-<flavour>-<kernel release>.tar.gz`."""
    return f"{component}-{version}-{flavour}-{kernel_release}.tar.gz"


@dataclass(frozen=True)
class PackageContent:
    """One file for `write_package_v2`: its bytes (or the file holding them), role and mode."""

    content: bytes | Path
    role: manifests.Role
    mode: int = 0o644


def write_package_v2(
    directory: Path,
    *,
    component: str,
    version: str,
    flavour: manifests.Flavour,
    kernel_release: str,
    files: Mapping[str, PackageContent],
    links: Mapping[str, str] | None = None,
    built_from: Iterable[manifests.BuiltFrom] = (),
) -> BuiltPackage:
    """Write a format 2 package (`gpuop.host.manifests`) of `files`, keyed by their path in
    the archive (`modules/nvidia.ko`), with `links` (path: target) made by the installer;
    the archive is reproducible (`write_reproducible_tar_gz`, members sorted by name), so the
    same inputs give the same sha256. `manifests.ManifestError` for a manifest the installer
    would refuse."""
    listed = tuple(
        manifests.PackageFile(
            path=path,
            sha256=_sha256(item.content),
            mode=f"0{item.mode & 0o7777:03o}",
            role=item.role,
        )
        for path, item in sorted(files.items())
    )
    try:
        manifest = manifests.ManifestV2(
            format=manifests.FORMAT_V2,
            component=component,  # type: ignore[arg-type]  # checked by the model
            version=version,
            flavour=flavour,
            kernel_release=kernel_release,
            files=listed,
            links=tuple(
                manifests.PackageLink(path=path, target=target)
                for path, target in sorted((links or {}).items())
            ),
            built_from=tuple(built_from),
        )
    except ValidationError as exc:
        raise manifests.ManifestError(f"the package's manifest would be invalid: {exc}") from None
    manifests.check_v2(manifest, "the package's manifest")
    members = [Member(MANIFEST, 0o644, manifest.encode())]
    members += [Member(p, item.mode & 0o7777, item.content) for p, item in sorted(files.items())]
    path = directory / archive_name_v2(component, version, flavour.value, kernel_release)
    directory.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    with partial.open("wb") as stream:
        write_reproducible_tar_gz(stream, members, compresslevel=6)
    partial.replace(path)
    return BuiltPackage(
        component,
        version,
        kernel_release,
        path,
        sha256_of(path),
        flavour.value,
        parameters=_declared_by(files),
    )


def _declared_by(files: Mapping[str, PackageContent]) -> dict[str, dict[str, str]]:
    """The parameters each module among `files` declares: a stand-in's own list, a real
    module's `parm:` lines (kmod's modinfo); a module neither reads is left out."""
    declared: dict[str, dict[str, str]] = {}
    for item in files.values():
        if item.role is not manifests.Role.MODULE:
            continue
        try:
            if isinstance(item.content, Path):
                module = indexing.declared_module(item.content)
            else:
                module = packages.ModuleStandin.decode(item.content)
        except (OSError, ValueError):
            continue
        if module.parameters:
            declared[module.name] = dict(module.parameters)
    return declared


def add_to_index(
    directory: Path, package: BuiltPackage, key: signing.SecretKey | Path | None
) -> dict[str, object]:
    """Add `package` (an archive in `directory`) to `directory`'s `index.json`, replacing an
    entry for the same archive or the same component, version, kernel and flavour, and sign
    the index with `key`; without a key the old signature, no longer true, is removed (the
    agents then refuse the source unless the policy says `allowUnsigned`). The new index."""
    index_path = directory / INDEX
    entries: list[dict[str, Any]] = []
    if index_path.exists():
        try:
            document = json.loads(index_path.read_text(encoding="utf-8"))
            entries = list(document["packages"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{index_path} is not a driver source index: {exc}") from None
    new = package.index_entry()

    def same(entry: dict[str, Any]) -> bool:
        keys = ("component", "version", "kernel_release")
        return entry.get("file") == new["file"] or (
            all(entry.get(k) == new[k] for k in keys) and entry.get("flavour") == new.get("flavour")
        )

    entries = [entry for entry in entries if not same(entry)] + [new]
    entries.sort(
        key=lambda e: (
            e.get("component", ""),
            e.get("kernel_release", ""),
            packages.version_key(e.get("version", "")),
            e.get("flavour", ""),
        )
    )
    index: dict[str, object] = {"packages": entries}
    write_atomic(index_path, json.dumps(index, indent=2) + "\n")
    if key is not None:
        sign_driver_source(directory, key)
    else:
        (directory / (INDEX + signing.SUFFIX)).unlink(missing_ok=True)
    return index


def build_driver_source(
    directory: Path,
    releases: Iterable[tuple[str, str, str]],
    *,
    signing_key: signing.SecretKey | None = None,
) -> tuple[BuiltPackage, ...]:
    """Build one archive per `(component, version, kernel release)` into `directory` and
    write its `index.json`, signed with `signing_key` when given (unsigned, the agent
    refuses it unless the policy says `allowUnsigned`); returns the packages in index
    order."""
    directory.mkdir(parents=True, exist_ok=True)
    built = tuple(build_package(directory, *release) for release in releases)
    index = {"packages": [package.index_entry() for package in built]}
    write_atomic(directory / INDEX, json.dumps(index, indent=2) + "\n")
    if signing_key is not None:
        sign_driver_source(directory, signing_key)
    return built


def sign_driver_source(
    directory: Path, key: signing.SecretKey | Path, *, trusted_comment: str | None = None
) -> signing.Signature:
    """Sign `directory`'s `index.json` with `key` (a key, or a minisign secret key file,
    `read_secret_key`) into `index.json.minisig`, as `minisign -S -m index.json` would: prehashed,
    trusted comment `timestamp:<now>\tfile:index.json\thashed` unless given. Sign again
    after every change of the index."""
    if isinstance(key, Path):
        key = read_secret_key(key)
    index = directory / INDEX
    comment = trusted_comment or f"timestamp:{int(time.time())}\tfile:{INDEX}\thashed"
    signature = signing.sign(index.read_bytes(), key, comment)
    write_atomic(directory / (INDEX + signing.SUFFIX), signature.file_text())
    return signature


def read_secret_key(path: Path) -> signing.SecretKey:
    """The key of a minisign secret key file; an encrypted one is opened with the password in
    `$GPUOP_SIGN_KEY_PASSWORD`, else one asked on the terminal (without either it is refused,
    saying how to give one)."""
    text = path.read_text(encoding="utf-8")
    password = None
    if signing.encrypted(text):
        password = os.environ.get(signing.PASSWORD_VARIABLE)
        if password is None and sys.stdin.isatty():
            password = getpass.getpass(f"password of the secret key {path}: ")
    return signing.SecretKey.from_file_text(text, password)


def write_key_pair(secret_file: Path, public_file: Path) -> signing.SecretKey:
    """A new signing key: its unencrypted secret key file (mode 0600; refused when either
    file exists) and its `minisign.pub`; the public key's `RW...` line goes into the
    policy's `publicKeys`."""
    key = signing.SecretKey.generate()
    if public_file.exists():
        raise FileExistsError(f"{public_file} exists; refusing to replace a key")
    secret_file.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as stream:
        stream.write(key.file_text())
    write_atomic(public_file, key.public_key.file_text())
    return key


def _sha256(content: bytes | Path) -> str:
    return sha256_of(content) if isinstance(content, Path) else hashlib.sha256(content).hexdigest()


def sha256_of(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _reproducible_tar_gz(members: list[tuple[str, bytes]]) -> bytes:
    raw = io.BytesIO()
    write_reproducible_tar_gz(raw, [Member(name, 0o644, content) for name, content in members])
    return raw.getvalue()


@dataclass(frozen=True)
class Member:
    """One file of an archive: its name in the archive, its permission bits, and its bytes
    or the file holding them."""

    name: str
    mode: int
    content: bytes | Path


def write_reproducible_tar_gz(
    stream: BinaryIO, members: Iterable[Member], *, compresslevel: int = 9
) -> None:
    """A gzip-compressed tar of `members`, in their order, into `stream`: the same bytes for
    the same members whoever writes them, wherever and whenever: owner 0:0 with no names,
    mtime 0, PAX format without timestamps of its own, gzip header without a name or time.
    Only plain files: directories are implied by the names."""
    with (
        gzip.GzipFile(
            fileobj=stream, mode="wb", mtime=0, filename="", compresslevel=compresslevel
        ) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as archive,
    ):
        for member in members:
            info = tarfile.TarInfo(member.name)
            info.mode = member.mode
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if isinstance(member.content, Path):
                info.size = member.content.stat().st_size
                with member.content.open("rb") as content:
                    archive.addfile(info, content)
            else:
                info.size = len(member.content)
                archive.addfile(info, io.BytesIO(member.content))
