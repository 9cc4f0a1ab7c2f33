"""Image layers written reproducibly: a directory tree as a tar whose bytes depend on nothing
but the tree's names, contents, modes and link targets, gzipped with no name and mtime 0.

    write_layer(tree, path, epoch) -> Layer    the tar of `tree`, gzipped to `path`
    Layer                                      its digest (the gzip's), diff id (the tar's), size

Entries are sorted, owned by uid and gid 0 with no owner names, stamped with `epoch`
(SOURCE_DATE_EPOCH), hard links written as regular files; sockets and devices are refused.
Called by the image builds in `tests.support.images.build`.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path

from gpuop.host.packaging import sha256_of

MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"


@dataclass(frozen=True)
class Layer:
    """A gzipped layer on disk: `digest` and `size` of the gzip, `diff_id` of the tar in it."""

    path: Path
    digest: str
    diff_id: str
    size: int


class _Hashing(io.RawIOBase):
    """A write-only stream that hashes and counts what passes through to `sink`."""

    def __init__(self, sink: io.RawIOBase | io.BufferedIOBase | gzip.GzipFile) -> None:
        self.sink = sink
        self.sha256 = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.sha256.update(data)
        self.size += len(data)
        self.sink.write(data)
        return len(data)


def entries(tree: Path) -> list[Path]:
    """Every path under `tree`, parents before children, siblings by name (bytes order)."""
    found: list[Path] = []

    def walk(directory: Path) -> None:
        for child in sorted(directory.iterdir(), key=lambda p: os.fsencode(p.name)):
            found.append(child)
            if child.is_dir() and not child.is_symlink():
                walk(child)

    walk(tree)
    return found


def tar_info(tree: Path, path: Path, epoch: int) -> tarfile.TarInfo:
    """The header of `path`, normalised: only its kind, permission bits and link target kept."""
    status = path.lstat()
    info = tarfile.TarInfo(path.relative_to(tree).as_posix())
    info.mtime = epoch
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = stat.S_IMODE(status.st_mode)
    if stat.S_ISLNK(status.st_mode):
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(path)
        info.mode = 0o777
    elif stat.S_ISDIR(status.st_mode):
        info.type = tarfile.DIRTYPE
    elif stat.S_ISREG(status.st_mode):
        info.type = tarfile.REGTYPE
        info.size = status.st_size
    else:
        raise ValueError(f"{path}: only files, directories and symlinks go into a layer")
    return info


def write_tar(tree: Path, stream: io.RawIOBase, epoch: int) -> None:
    """The tar of everything under `tree` (not `tree` itself) onto `stream`."""
    with tarfile.open(fileobj=stream, mode="w|", format=tarfile.PAX_FORMAT) as archive:
        for path in entries(tree):
            info = tar_info(tree, path, epoch)
            if info.isreg():
                with path.open("rb") as content:
                    archive.addfile(info, content)
            else:
                archive.addfile(info)


def write_layer(tree: Path, path: Path, epoch: int) -> Layer:
    """Write `tree` as a gzipped layer to `path` (replaced whole, never left half written)."""
    partial = path.with_name(path.name + ".partial")
    try:
        with partial.open("wb") as raw:
            compressed = _Hashing(raw)
            with gzip.GzipFile(
                filename="", mode="wb", fileobj=compressed, mtime=0, compresslevel=6
            ) as zipped:
                uncompressed = _Hashing(zipped)
                write_tar(tree, uncompressed, epoch)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(path)
    return Layer(
        path=path,
        digest=f"sha256:{compressed.sha256.hexdigest()}",
        diff_id=f"sha256:{uncompressed.sha256.hexdigest()}",
        size=compressed.size,
    )


def file_digest(path: Path) -> str:
    """`sha256:<hex>` of a file's content."""
    return f"sha256:{sha256_of(path)}"
