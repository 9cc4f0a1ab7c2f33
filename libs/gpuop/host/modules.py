"""Kernel modules as the host reports them: `proc/modules` (what is loaded, its size, use
count and users) and `sys/module/<name>/` (version, init state, holders).

Both `KernelOps` implementations answer `loaded()` from `loaded_modules`; discovery lists
the managed modules and their versions; the driver-manager checks a module's version after
loading it. `proc/modules` prints `-` for the use count and the users when the kernel cannot
unload modules (the recorded H200 host is such a kernel); those come back as None and `()`.
A module with a `sys/module/<name>` directory but no `initstate` is built into the kernel.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuop.host.errors import HostReadError
from gpuop.host.roots import HostRoot

PROC_MODULES = "proc/modules"
SYS_MODULE = "sys/module"

PERMANENT = "[permanent]"
"""What `proc/modules` lists as a user of a module that has no exit function."""

_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


@dataclass(frozen=True)
class LoadedModule:
    """One line of `proc/modules`."""

    name: str
    """Module name: `nvidia_uvm`."""
    size: int
    """Memory the module takes, in bytes."""
    refcount: int | None
    """Use count: dependent modules plus open handles; None when the kernel prints `-`."""
    used_by: tuple[str, ...]
    """Loaded modules that depend on this one (its holders), in the kernel's order."""
    state: str
    """`Live`, `Loading` or `Unloading`."""
    permanent: bool = False
    """The module can never be unloaded (it has no exit function)."""
    taints: str = ""
    """Taint flags: `O` out of tree, `P` proprietary, `E` unsigned."""


@dataclass(frozen=True)
class ModuleInfo:
    """A module's directory in `sys/module`."""

    name: str
    """Module name."""
    version: str | None
    """`version`: what the module declares (`580.159.04`); None when it declares none."""
    srcversion: str | None
    """`srcversion`: a checksum of the module's source."""
    initstate: str | None
    """`live`, `coming` or `going`; None for a module built into the kernel."""
    refcount: int | None
    """`refcnt`; None when the kernel cannot unload modules or the module is built in."""
    holders: tuple[str, ...]
    """Entries of `holders/`: the modules that depend on this one."""

    @property
    def builtin(self) -> bool:
        """Built into the kernel: present, but never loaded or unloaded."""
        return self.initstate is None


def loaded_modules(root: HostRoot) -> tuple[LoadedModule, ...]:
    """Every module in `proc/modules`, newest first as the kernel lists them; empty when the
    root has no such file."""
    text = root.read_text(PROC_MODULES)
    if text is None:
        return ()
    modules: list[LoadedModule] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            modules.append(parse_proc_modules_line(line))
        except ValueError as error:
            raise HostReadError(root.join(PROC_MODULES), f"line {number}: {error}") from None
    return tuple(modules)


def parse_proc_modules_line(line: str) -> LoadedModule:
    """Parse `name size refcount users state address [(taints)]`; `ValueError` otherwise."""
    fields = line.split()
    if len(fields) not in (6, 7):
        raise ValueError(f"expected 6 or 7 fields, got {len(fields)}: {line!r}")
    name, size, refcount, users, state = fields[:5]
    if not _NAME.match(name):
        raise ValueError(f"not a module name: {name!r}")
    if not size.isdigit():
        raise ValueError(f"size of {name} is not a number: {size!r}")
    if refcount != "-" and not refcount.isdigit():
        raise ValueError(f"use count of {name} is not a number: {refcount!r}")
    taints = fields[6] if len(fields) == 7 else ""
    if taints and not (taints.startswith("(") and taints.endswith(")")):
        raise ValueError(f"taints of {name} are not in parentheses: {taints!r}")
    names = [] if users == "-" else [user for user in users.split(",") if user]
    return LoadedModule(
        name=name,
        size=int(size),
        refcount=None if refcount == "-" else int(refcount),
        used_by=tuple(user for user in names if user != PERMANENT),
        state=state,
        permanent=PERMANENT in names,
        taints=taints.strip("()"),
    )


def module_info(root: HostRoot, name: str) -> ModuleInfo | None:
    """What `sys/module/<name>` says; None when the kernel has no such module."""
    base = f"{SYS_MODULE}/{name}"
    if not root.resolve(base).is_dir():
        return None
    refcount = _text(root, f"{base}/refcnt")
    if refcount is not None and not refcount.lstrip("-").isdigit():
        raise HostReadError(root.join(f"{base}/refcnt"), f"not a number: {refcount!r}")
    return ModuleInfo(
        name=name,
        version=_text(root, f"{base}/version"),
        srcversion=_text(root, f"{base}/srcversion"),
        initstate=_text(root, f"{base}/initstate"),
        refcount=None if refcount is None else int(refcount),
        holders=root.list_dir(f"{base}/holders"),
    )


def module_version(root: HostRoot, name: str) -> str | None:
    """The version a loaded module declares; None when it is not loaded or declares none."""
    return _text(root, f"{SYS_MODULE}/{name}/version")


def _text(root: HostRoot, relative: str) -> str | None:
    text = root.read_text(relative)
    return None if text is None else text.strip()
