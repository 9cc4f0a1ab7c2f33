"""Kernel module state as the simulated NVML sees it: loaded or not, which version, who holds it.

`SimNvml` behaves like NVML on a node: `init()` fails with `DriverNotLoaded` while the
`nvidia` module is absent, reports the loaded module's version, and an open session counts
as a user of the module, so a simulated `rmmod nvidia` fails while a service holds a session.
It reaches the kernel only through `ModuleState`:

* `HostRootModules` reads a host root the way the simulated kernel
  (`gpuop_sim.host.SimKernel`) writes it (the layout is `gpuop_sim.host.simstate`'s):
  `proc/modules` (the truth about what is loaded), `sys/module/<m>/version`, and one holder
  file per user, `run/gpuop/sim-kernel/holders/<module>/<holder id>`, holding the owner's
  pid. A hold checks and writes under SimKernel's lock (`flock` on
  `run/gpuop/sim-kernel/lock`), so it cannot slip past a concurrent `rmmod`, and the holder
  file appears by an atomic rename. It interoperates with SimKernel, in this process or
  another; SimKernel drops holds of dead processes and recounts `proc/modules`' use counts
  on its own next change.
  The resets of GPUs (`reset_counts`) are `gpuop_sim.host.simreset`'s counts in the host root.
* `InMemoryModules` is the same in a dict, for unit tests.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from gpuop.nvml.errors import DriverNotLoaded, ModuleInUse
from gpuop_sim.host import simreset, simstate

NVIDIA = "nvidia"
"""The kernel module NVML needs."""

HOLDERS_DIR = Path(simstate.HOLDERS)
"""One file per module holder, named by holder id, holding the owner's pid (the simulated
kernel's layout, `gpuop_sim.host.simstate`, the one place it is written down)."""
DRIVER_RESETS = simreset.DRIVER
"""The count of driver loads among the reset counts: a reset of every GPU."""
NO_GPUS_DIR = Path(simstate.NO_GPUS)
"""A file per loaded module from a defective build that brings up no GPU."""


class ModuleState(Protocol):
    """What the simulated NVML needs to know about, and do to, kernel modules."""

    def is_loaded(self, module: str) -> bool:
        """The module is loaded now."""
        ...

    def version(self, module: str) -> str | None:
        """The loaded module's version (`/sys/module/<m>/version`); `None` when unknown."""
        ...

    def brings_up_gpus(self, module: str) -> bool:
        """False while the loaded module is a defective build that initialised no GPU."""
        ...

    def hold(self, module: str, holder_id: str) -> None:
        """Count `holder_id` as a user of the loaded module; idempotent. Raises
        `errors.DriverNotLoaded` when the module is not loaded, as opening the device files
        of an absent driver fails."""
        ...

    def release(self, module: str, holder_id: str) -> None:
        """Stop counting `holder_id` as a user; idempotent."""
        ...

    def reset_counts(self) -> Mapping[str, int]:
        """How often each GPU was reset (by `reset_key` of its bus id) and the driver loaded
        (`DRIVER_RESETS`); a count that grew since a session's last look is a reset."""
        ...


def reset_key(pci_bus_id: str) -> str:
    """The key of a GPU's reset count: its NVML bus id."""
    return simreset.count_key(pci_bus_id)


class InMemoryModules:
    """Loaded modules and their holders in memory; `unload()` refuses while held, as rmmod."""

    def __init__(self, loaded: Mapping[str, str | None] | None = None) -> None:
        self._versions: dict[str, str | None] = dict(loaded or {})
        self._holders: dict[str, set[str]] = {}
        self._inert: set[str] = set()
        self._resets: dict[str, int] = {}

    def is_loaded(self, module: str) -> bool:
        return module in self._versions

    def version(self, module: str) -> str | None:
        return self._versions.get(module)

    def brings_up_gpus(self, module: str) -> bool:
        return module not in self._inert

    def hold(self, module: str, holder_id: str) -> None:
        if not self.is_loaded(module):
            raise DriverNotLoaded(f"the {module} kernel module is not loaded")
        self._holders.setdefault(module, set()).add(holder_id)

    def release(self, module: str, holder_id: str) -> None:
        self._holders.get(module, set()).discard(holder_id)

    def holders(self, module: str) -> frozenset[str]:
        """Who holds the module now."""
        return frozenset(self._holders.get(module, ()))

    def reset_counts(self) -> Mapping[str, int]:
        return dict(self._resets)

    def reset(self, pci_bus_id: str | None = None) -> None:
        """Count a reset of the GPU at `pci_bus_id`, or with None a driver load."""
        key = DRIVER_RESETS if pci_bus_id is None else reset_key(pci_bus_id)
        self._resets[key] = self._resets.get(key, 0) + 1

    def load(self, module: str, version: str | None = None, *, brings_up_gpus: bool = True) -> None:
        """Load the module (or change the recorded version of a loaded one); `brings_up_gpus`
        False loads a defective build that initialises no GPU. Loading `nvidia` counts a
        driver load, as `SimKernel` does: every GPU comes up from a reset."""
        if module == NVIDIA and module not in self._versions:
            self.reset()
        self._versions[module] = version
        if brings_up_gpus:
            self._inert.discard(module)
        else:
            self._inert.add(module)

    def unload(self, module: str) -> None:
        """Unload the module; raises `ModuleInUse` while anything holds it."""
        if holders := self.holders(module):
            raise ModuleInUse(module, holders)
        self._versions.pop(module, None)


class HostRootModules:
    """Module state read from, and holders written to, a host root directory."""

    def __init__(self, host_root: Path) -> None:
        self.host_root = host_root

    def is_loaded(self, module: str) -> bool:
        listing = self.host_root / "proc" / "modules"
        try:
            text = listing.read_text()
        except FileNotFoundError:
            # No procfs in this root: sysfs alone says what is loaded.
            return (self.host_root / "sys" / "module" / module).is_dir()
        return any(line.split(" ", 1)[0] == module for line in text.splitlines())

    def version(self, module: str) -> str | None:
        try:
            text = (self.host_root / "sys" / "module" / module / "version").read_text()
        except FileNotFoundError:
            return None
        return text.strip() or None

    def brings_up_gpus(self, module: str) -> bool:
        return not (self.host_root / NO_GPUS_DIR / module).exists()

    def hold(self, module: str, holder_id: str) -> None:
        """A holder file for `holder_id`, as an open device node holds the real module. In
        a host root this process cannot write (the chart's node agents mount theirs
        read-only) it holds nothing, once the module is found loaded."""
        path = self._holder(module, holder_id)
        if not _writable(self.host_root):
            if not self.is_loaded(module):
                raise DriverNotLoaded(f"the {module} kernel module is not loaded")
            return
        with self._locked():
            if not self.is_loaded(module):
                raise DriverNotLoaded(f"the {module} kernel module is not loaded")
            path.parent.mkdir(parents=True, exist_ok=True)
            # a dot-named temporary file, which SimKernel does not count as a holder
            descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
            with os.fdopen(descriptor, "w") as stream:
                stream.write(f"{os.getpid()}\n")
            os.chmod(temporary, 0o644)
            os.replace(temporary, path)

    def release(self, module: str, holder_id: str) -> None:
        self._holder(module, holder_id).unlink(missing_ok=True)

    def reset_counts(self) -> Mapping[str, int]:
        return simreset.reset_counts(self.host_root)

    def holders(self, module: str) -> frozenset[str]:
        """Who holds the module now, by holder file."""
        directory = self.host_root / HOLDERS_DIR / module
        if not directory.is_dir():
            return frozenset()
        return frozenset(e.name for e in directory.iterdir() if not e.name.startswith("."))

    def _holder(self, module: str, holder_id: str) -> Path:
        if not simstate.HOLDER_ID.match(holder_id):
            raise ValueError(f"holder id {holder_id!r} is not a short file name")
        return self.host_root / HOLDERS_DIR / module / holder_id

    @contextmanager
    def _locked(self) -> Iterator[None]:
        lock = self.host_root / simstate.LOCK
        lock.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            yield
        finally:
            os.close(descriptor)


def _writable(host_root: Path) -> bool:
    """Whether this process may make the simulation's state under `host_root`: its state
    directory's nearest existing parent is writable and not on a read-only mount."""
    directory = host_root / simstate.LOCK
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent
    return os.access(directory, os.W_OK) and not os.statvfs(directory).f_flag & os.ST_RDONLY
