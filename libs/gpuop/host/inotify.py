"""Linux inotify for asyncio: a watch on one directory that says when its entries change.

The device plugin's `registering.Registrar` waits on one for the kubelet's device-plugin
directory, where a restarting kubelet deletes the plugins' sockets and creates a new
`kubelet.sock`, instead of looking there several times a second; discovery's node role
watches the CDI spec and container runtime configuration directories (`CONTENT`) to scan as
soon as a spec or a drop-in changes. The kernel queues the
events on a file descriptor the event loop reads (`loop.add_reader`), so a directory
where nothing happens costs no wake-up at all.

Bound through ctypes on the C library (`inotify_init1`, `inotify_add_watch`, in glibc and
musl alike), as upstream's Go plugin uses the syscalls: no dependency. `DirectoryWatch`
raises `WatchUnavailable` where it cannot be set (no inotify, the per-user limit on
instances or watches reached, the directory missing); callers then poll. The kernel drops a
watch whose directory is deleted, moved or unmounted: the watch is then `gone`, and only a
new one, on whatever directory now has that path, tells of changes again.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import os
import struct
from pathlib import Path

from gpuop.host.errors import HostError
from gpuop.lifecycles import Closing

IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_UNMOUNT = 0x00002000
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

WATCHED = (
    IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF
)
"""An entry created, deleted, renamed in or out, or its attributes changed (a socket
re-created in place shows as its change time); and the directory itself deleted or moved."""
CONTENT = WATCHED | IN_CLOSE_WRITE
"""`WATCHED`, and a file written in place and closed: for a directory of configuration files
that an editor or a tool may rewrite without a rename."""
LOST = IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT | IN_IGNORED
"""What ends a watch: the kernel sends `IN_IGNORED` after each of the others."""

_EVENT = struct.Struct("iIII")
"""`struct inotify_event` up to its name: watch descriptor, mask, cookie, name length."""
_READ_SIZE = 64 * 1024
"""Bytes asked per read: a few hundred events at once (each is 16 bytes and its name)."""


class WatchUnavailable(HostError):
    """The directory cannot be watched now; look at it by polling instead."""


class DirectoryWatch(Closing):
    """Sets `changed` whenever an entry of `directory` changes; see the module docstring.

    Create it inside a running event loop, and `close()` it (or use it as a context
    manager): it holds a file descriptor and the loop's reader on it.
    """

    def __init__(self, directory: Path, events: int = WATCHED) -> None:
        loop = asyncio.get_running_loop()
        self.directory = directory
        self.changed = asyncio.Event()
        """Set when something happened in the directory; the caller clears it before it
        looks, so a change during the look sets it again."""
        self.gone = False
        """The kernel dropped the watch (the directory went); nothing sets `changed` again."""
        descriptor = _init()
        try:
            _add_watch(descriptor, directory, events)
            loop.add_reader(descriptor, self._read)
        except BaseException:
            os.close(descriptor)
            raise
        self._loop: asyncio.AbstractEventLoop | None = loop
        self._descriptor = descriptor

    def close(self) -> None:
        """Stop watching and close the descriptor; safe to call twice."""
        loop, self._loop = self._loop, None
        if loop is None:
            return
        if not loop.is_closed():
            loop.remove_reader(self._descriptor)
        os.close(self._descriptor)

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self._descriptor, _READ_SIZE)
            except (BlockingIOError, InterruptedError):
                break
            if not data:
                break
            if any(mask & LOST for mask in _masks(data)):
                self.gone = True
        # An overflowed queue (`IN_Q_OVERFLOW`) lost events: a look finds what they were.
        self.changed.set()


def _masks(data: bytes) -> list[int]:
    masks = []
    offset = 0
    while offset + _EVENT.size <= len(data):
        _, mask, _, length = _EVENT.unpack_from(data, offset)
        masks.append(mask)
        offset += _EVENT.size + length
    return masks


@functools.cache
def _libc() -> ctypes.CDLL:
    # The process's own symbols include the C library's: no path to look up.
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    except AttributeError:
        raise WatchUnavailable("this C library has no inotify") from None
    libc.inotify_init1.restype = ctypes.c_int
    libc.inotify_add_watch.restype = ctypes.c_int
    return libc


def _init() -> int:
    descriptor: int = _libc().inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
    if descriptor < 0:
        raise WatchUnavailable(f"inotify refused: {os.strerror(ctypes.get_errno())}")
    return descriptor


def _add_watch(descriptor: int, directory: Path, events: int) -> None:
    if _libc().inotify_add_watch(descriptor, os.fsencode(directory), events | IN_ONLYDIR) < 0:
        reason = os.strerror(ctypes.get_errno())
        raise WatchUnavailable(f"cannot watch {directory}: {reason}")
