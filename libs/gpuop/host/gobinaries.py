"""The version a Go program was released as, read from its binary without running it.

Used by `runtime_handlers` for a container runtime installed without a package manager (a
release tarball, a cloud image): discovery runs in a container, where the host's binary may
not even start. Go 1.18 and later embed the build information (`go version -m` prints it) in
a blob that starts with the magic `\\xff Go buildinf:` on a 16-byte boundary, its two strings
(the Go version and the module information) inline after a 32-byte header. The module
information lists the main module (`mod <path> <version>`) and the build settings, among them
`-ldflags` where the build did not use `-trimpath`. Release builds set their version with
`-X <module>/version.Version=<version>` (containerd does), which wins over the main module's
version; `(devel)`, the main module of a build from a checkout without a tag, says nothing.

Older binaries (a pointer-based header) and stripped or non-Go files give None. The answer is
cached by the file's identity and change time: a runtime's binary is tens of megabytes, and
discovery scans every minute.
"""

from __future__ import annotations

import functools
import mmap
import os
import re
from pathlib import Path

MAGIC = b"\xff Go buildinf:"
HEADER_BYTES = 32
FLAG_INLINE_STRINGS = 0x2
SENTINEL_BYTES = 16
"""The module information is wrapped in 16 bytes of sentinel on each side."""
MAX_INFO_BYTES = 2**20

_LDFLAGS_VERSION = re.compile(r"-X[= ]?\S*/version\.Version=([0-9A-Za-z][0-9A-Za-z.+_~-]*)")
_MAIN_MODULE = re.compile(r"^mod\t\S+\t(\S+)", re.MULTILINE)


def reported_version(path: Path) -> str | None:
    """The version the Go binary at `path` was built as; None when it does not say."""
    try:
        status = path.stat()
    except OSError:
        return None
    return _cached_version(path, status.st_ino, status.st_size, status.st_mtime_ns)


def version_in(info: str) -> str | None:
    """The version in a binary's module information text (as `go version -m` lists it)."""
    flags = _LDFLAGS_VERSION.search(info.replace('\\"', '"'))
    if flags is not None:
        return flags.group(1)
    main = _MAIN_MODULE.search(info)
    if main is not None and main.group(1) != "(devel)":
        return main.group(1)
    return None


def module_info(data: bytes | mmap.mmap) -> str | None:
    """The module information text of a Go binary's contents; None without one."""
    offset = data.find(MAGIC)
    while offset >= 0 and offset % 16:
        offset = data.find(MAGIC, offset + 1)
    if offset < 0 or len(data) < offset + HEADER_BYTES:
        return None
    if not data[offset + 15] & FLAG_INLINE_STRINGS:
        return None  # Go before 1.18: the strings are behind pointers
    position = offset + HEADER_BYTES
    _, position = _inline_string(data, position)  # the Go version
    info, _ = _inline_string(data, position)
    if len(info) < 2 * SENTINEL_BYTES + 1:
        return None
    return info[SENTINEL_BYTES:-SENTINEL_BYTES].decode("utf-8", "replace")


@functools.lru_cache(maxsize=16)
def _cached_version(path: Path, inode: int, size: int, mtime_ns: int) -> str | None:
    del inode, size, mtime_ns  # the cache key: another file at the path is read again
    try:
        with open(path, "rb") as stream:
            if os.fstat(stream.fileno()).st_size == 0:
                return None
            with mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ) as data:
                info = module_info(data)
    except (OSError, ValueError):
        return None
    return version_in(info) if info is not None else None


def _inline_string(data: bytes | mmap.mmap, position: int) -> tuple[bytes, int]:
    length, shift = 0, 0
    while position < len(data) and shift < 64:
        byte = data[position]
        position += 1
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    length = min(length, MAX_INFO_BYTES)
    return bytes(data[position : position + length]), position + length
