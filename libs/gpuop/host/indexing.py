"""The simulated kernel's depmod: which installed module files `modprobe` may load.

`write_index` scans `lib/modules/<kernel release>/` under the host root and writes
`modules.dep` in the real format: one line per module, its path relative to that directory,
a colon, then every module it needs (transitively), in the order modprobe loads them from
the end of the line backwards. A module's needs are what it declares: a stand-in's
`depends`, a real module's `.modinfo` (`declared_module`). Under `updates/gpuop/<component>/`
only the component's active version is indexed (see `gpuop.host.packages`; format 1 keeps
its modules at the top of the version's directory, format 2 under `modules/`), and it wins
over a module of the same name elsewhere in the tree, as depmod's default search order
(`updates` first) would have it. `read_index` is how the simulated modprobe finds a module.
Called by `SimKernel.depmod` and so by the stand-in `depmod`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpuop import moduleparams
from gpuop.host import kmod, packages
from gpuop.host.errors import DepmodFailed, HostReadError, ModuleLoadFailed
from gpuop.host.files import write_atomic
from gpuop.host.roots import HostRoot

INDEX = "modules.dep"
MODULES = "modules"
"""Where a format 2 package keeps its modules, under its version's directory."""
_ELF = b"\x7fELF"


@dataclass(frozen=True)
class IndexedModule:
    """One line of `modules.dep`."""

    name: str
    """Module name, from the file name (`-` read as `_`, as the kernel does)."""
    path: str
    """File, relative to `lib/modules/<kernel release>`."""
    dependencies: tuple[str, ...]
    """Files of the modules it needs, to be loaded from the last to the first."""


def module_name(path: str) -> str:
    """The module a `.ko` path holds: `updates/gpuop/gpu/580.159.04/nvidia-drm.ko` holds
    `nvidia_drm`."""
    return path.rpartition("/")[2].removesuffix(packages.MODULE_SUFFIX).replace("-", "_")


def write_index(root: HostRoot, kernel_release: str) -> None:
    """Rebuild `modules.dep` for `kernel_release`; `DepmodFailed` when it cannot."""
    base = packages.modules_dir(root, kernel_release)
    if not base.is_dir():
        raise DepmodFailed(
            kernel_release,
            f"could not open directory /lib/modules/{kernel_release}: No such file or directory",
        )
    files = _indexable_files(root, base, kernel_release)
    needs = {name: _declared_dependencies(base / path) for name, path in files.items()}
    lines = []
    for name, path in sorted(files.items(), key=lambda item: item[1]):
        order = _load_order(name, needs)
        dependencies = [files[dependency] for dependency in reversed(order) if dependency != name]
        lines.append(f"{path}: {' '.join(dependencies)}".rstrip() + "\n")
    write_atomic(base / INDEX, "".join(lines))


def read_index(root: HostRoot, kernel_release: str) -> dict[str, IndexedModule]:
    """The modules depmod indexed for `kernel_release`, by name; empty before any depmod."""
    relative = f"lib/modules/{kernel_release}/{INDEX}"
    text = root.read_text(relative)
    if text is None:
        return {}
    index: dict[str, IndexedModule] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        path, colon, rest = line.partition(":")
        if not colon or not path.strip():
            raise HostReadError(root.join(relative), f"line {number} is not 'PATH: DEPS'")
        name = module_name(path.strip())
        index[name] = IndexedModule(name, path.strip(), tuple(rest.split()))
    return index


def _indexable_files(root: HostRoot, base: Path, kernel_release: str) -> dict[str, str]:
    files: dict[str, str] = {}
    updates = base / packages.UPDATES
    for path in sorted(base.rglob(f"*{packages.MODULE_SUFFIX}")):
        if not path.is_relative_to(updates):
            files[module_name(path.name)] = path.relative_to(base).as_posix()
    if not updates.is_dir():
        return files
    for component in sorted(entry.name for entry in updates.iterdir() if entry.is_dir()):
        version = packages.active_version(root, kernel_release, component)
        if version is None:
            continue
        installed = packages.installed_versions(root, kernel_release, component)
        if version not in installed:
            raise DepmodFailed(
                kernel_release, f"active version {version} of {component} is not installed"
            )
        directory = packages.package_dir(root, kernel_release, component, version)
        # format 1 keeps its modules at the top, format 2 under modules/
        for folder in (directory, directory / MODULES):
            for path in sorted(folder.glob(f"*{packages.MODULE_SUFFIX}")):
                files[module_name(path.name)] = path.relative_to(base).as_posix()
    return files


def declared_module(path: Path) -> packages.ModuleStandin:
    """What the module file `path` declares: a stand-in's own document, or a real module's
    `.modinfo` fields (name, version, `depends`, the kernel release of its vermagic, the
    parameters its `parm:` lines declare) read with kmod's `modinfo`, its size the file's.
    `ValueError` when it is neither."""
    data = path.read_bytes()
    try:
        return packages.ModuleStandin.decode(data)
    except ValueError:
        if not data.startswith(_ELF):
            raise
    try:
        info = kmod.modinfo(path)
    except ModuleLoadFailed as failure:
        raise ValueError(f"{path.name}: {failure}") from None
    vermagic = (info.get("vermagic") or [""])[0].split()
    name = (info.get("name") or [""])[0]
    if not name or not vermagic:
        raise ValueError(f"{path.name}: modinfo shows no name or vermagic")
    depends = (info.get("depends") or [""])[0]
    return packages.ModuleStandin(
        name=name,
        version=(info.get("version") or [""])[0],
        kernel_release=vermagic[0],
        depends=tuple(d.replace("-", "_") for d in depends.split(",") if d),
        size=len(data),
        parameters=tuple(sorted(moduleparams.declared(info.get("parm", [])).items())),
    )


def _declared_dependencies(path: Path) -> tuple[str, ...]:
    # depmod reads a module's needs from its symbols; a stand-in declares them, a real module
    # in its `depends` field. A file that is neither is indexed without needs, and loading it
    # fails, as a corrupt module does.
    try:
        return declared_module(path).depends
    except (OSError, ValueError):
        return ()


def _load_order(name: str, needs: dict[str, tuple[str, ...]]) -> list[str]:
    order: list[str] = []
    visiting: set[str] = set()

    def visit(module: str) -> None:
        if module in order or module in visiting or module not in needs:
            return  # done, a cycle, or a need nothing provides (depmod only warns of those)
        visiting.add(module)
        for needed in needs[module]:
            visit(needed)
        order.append(module)

    visit(name)
    return order
