"""The host root: where a node agent finds the host's `/sys`, `/proc`, `/etc` and `/lib`.

In a pod the host's `/` is mounted at `/host`; in tests and the demo it is a directory made
from the recorded H200 host (`gpuop_sim.recordings`, `h200/hostroot`). Every reader in `gpuop.host`
takes a `HostRoot` and reads through it, so none of them ever touches the container's own
files by mistake: symbolic links are followed as the host would follow them, an absolute
target starting again at the host root.

The recorded fixture could not keep symbolic links; it lists them in `SYMLINKS.txt` at its
root (`sys/bus/pci/devices/0000:00:06.0/driver -> ../../../bus/pci/drivers/nvidia`).
`link_target` answers from a real link first and from that list second.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from gpuop.host.errors import HostReadError

RECORDED_LINKS = "SYMLINKS.txt"
"""The list of links a recorded host root could not keep, one `PATH -> TARGET` a line."""

_MAX_LINK_HOPS = 40  # the kernel's own limit (ELOOP)


@dataclass(frozen=True)
class HostRoot:
    """A directory that stands for the host's `/`."""

    path: Path
    """`/host` in a pod; a temporary directory in tests."""

    def join(self, relative: str) -> Path:
        """The path of `relative` (with or without a leading `/`) under the root, as is."""
        return self.path / relative.lstrip("/")

    def resolve(self, relative: str) -> Path:
        """The path of `relative` with every symbolic link followed inside the root.

        An absolute link target starts again at the host root, so a host whose
        `/etc/os-release` links to `/usr/lib/os-release` is read from its own `/usr`.
        """
        pending = deque(PurePosixPath(relative.lstrip("/")).parts)
        current: list[str] = []
        hops = 0
        while pending:
            part = pending.popleft()
            if part == "..":
                if current:
                    current.pop()
                continue
            candidate = self.path.joinpath(*current, part)
            if not candidate.is_symlink():
                current.append(part)
                continue
            hops += 1
            if hops > _MAX_LINK_HOPS:
                raise HostReadError(candidate, "too many levels of symbolic links")
            target = PurePosixPath(os.readlink(candidate))
            if target.is_absolute():
                current = []
                pending.extendleft(reversed(target.parts[1:]))
            else:
                pending.extendleft(reversed(target.parts))
        return self.path.joinpath(*current)

    def read_text(self, relative: str) -> str | None:
        """The text of a file under the root; None when it does not exist.

        Raises `HostReadError` naming the file when it exists but cannot be read as text.
        """
        path = self.resolve(relative)
        try:
            return path.read_text(encoding="utf-8")
        except (FileNotFoundError, NotADirectoryError):
            return None
        except IsADirectoryError:
            raise HostReadError(path, "is a directory, not a file") from None
        except UnicodeDecodeError:
            raise HostReadError(path, "is not UTF-8 text") from None
        except OSError as error:
            raise HostReadError(path, error.strerror or str(error)) from error

    def exists(self, relative: str) -> bool:
        """Whether `relative` exists under the root (after following links)."""
        return self.resolve(relative).exists()

    def list_dir(self, relative: str) -> tuple[str, ...]:
        """The sorted entry names of a directory under the root; empty when it is missing."""
        path = self.resolve(relative)
        try:
            return tuple(sorted(os.listdir(path)))
        except FileNotFoundError:
            return ()
        except NotADirectoryError:
            raise HostReadError(path, "is not a directory") from None
        except OSError as error:
            raise HostReadError(path, error.strerror or str(error)) from error

    def link_target(self, relative: str) -> str | None:
        """Where the symbolic link `relative` points, as written; None when it is no link.

        A real link answers first; otherwise the root's `SYMLINKS.txt`, if any, is asked.
        """
        relative = relative.strip("/")
        parent, _, name = relative.rpartition("/")
        path = self.resolve(parent) / name if parent else self.path / name
        if path.is_symlink():
            return os.readlink(path)
        return self.recorded_links().get(relative)

    def recorded_links(self) -> dict[str, str]:
        """The links listed in the root's `SYMLINKS.txt`, by path; empty without one."""
        text = self.read_text(RECORDED_LINKS)
        if text is None:
            return {}
        links: dict[str, str] = {}
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            source, arrow, target = line.partition(" -> ")
            if not arrow or not source.strip() or not target.strip():
                raise HostReadError(
                    self.join(RECORDED_LINKS), f"line {number} is not 'PATH -> TARGET': {line!r}"
                )
            links[source.strip().strip("/")] = target.strip()
        return links
