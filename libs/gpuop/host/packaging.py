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

import gzip
import hashlib
import io
import json
import os
import tarfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpuop.host import packages, signing
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

    def index_entry(self) -> dict[str, str]:
        """This package's entry in a driver source's `index.json`."""
        return {
            "component": self.component,
            "version": self.version,
            "kernel_release": self.kernel_release,
            "sha256": self.sha256,
            "file": self.path.name,
        }


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
    return BuiltPackage(component, version, kernel_release, path, hashlib.sha256(data).hexdigest())


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
    """Sign `directory`'s `index.json` with `key` (a key, or an unencrypted minisign secret
    key file) into `index.json.minisig`, as `minisign -S -m index.json` would: prehashed,
    trusted comment `timestamp:<now>\tfile:index.json\thashed` unless given. Sign again
    after every change of the index."""
    if isinstance(key, Path):
        key = signing.SecretKey.from_file_text(key.read_text(encoding="utf-8"))
    index = directory / INDEX
    comment = trusted_comment or f"timestamp:{int(time.time())}\tfile:{INDEX}\thashed"
    signature = signing.sign(index.read_bytes(), key, comment)
    write_atomic(directory / (INDEX + signing.SUFFIX), signature.file_text())
    return signature


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


def sha256_of(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _reproducible_tar_gz(members: list[tuple[str, bytes]]) -> bytes:
    raw = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as compressed,
        tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as archive,
    ):
        for name, content in members:
            info = tarfile.TarInfo(name)
            info.size = len(content)
            info.mode = 0o644
            info.mtime = 0
            archive.addfile(info, io.BytesIO(content))
    return raw.getvalue()
