"""Installed driver packages on a host, and the module stand-ins the simulated kernel loads.

Layout (the driver-manager installs into it; depmod and the simulated kernel read it):

    lib/modules/<kernel release>/
        updates/gpuop/<component>/            component: `gpu` or `ofed`
            <version>/<module>.ko             one directory per installed version
            <version>/manifest.json           what the package said it holds (optional)
            .<anything>                       ignored: staging directories of installs
            active                            the version depmod makes loadable, one line
        modules.dep                           depmod's index (see `gpuop.host.indexing`)

The active version is the one named in `active` (the driver-manager writes it when it loads
a version, a rollback included, and pins the running one before an install, so a new
directory never becomes active by being the newest) and, without that file, the newest
installed version. Versions
compare numerically part by part: `580.159.04` < `580.159.10` < `590.1`.

A module stand-in is a `<module>.ko` file holding one JSON object, `ModuleStandin`: name,
version, the kernel release it was built for and the modules it needs. The simulated
kernel refuses anything else as the real one refuses a module built for another kernel
("Exec format error").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from gpuop.host import components, parameters
from gpuop.host.files import write_atomic
from gpuop.host.roots import HostRoot

UPDATES = "updates/gpuop"
"""Where, under `lib/modules/<kernel release>`, gpuop installs its packages."""
ACTIVE = "active"
"""The file in a component's directory naming its active version."""
MODULE_SUFFIX = ".ko"
USERSPACE = "opt/gpuop"
"""Format 2 user space, under the host root: `<component>/<version>/{lib,bin,etc}`, and the
`current` link naming the version in use (the driver-manager's `installing`)."""
CURRENT = "current"
STANDIN_FORMAT = "gpuop-module-standin/1"
"""The `format` of a module stand-in."""

_SIZES = {
    "nvidia": 14299136,
    "nvidia_uvm": 1830912,
    "nvidia_modeset": 1654784,
    "nvidia_drm": 135168,
    "nvidia_peermem": 16384,
    "mlx5_core": 2727936,
    "ib_core": 552960,
    "mlx5_ib": 487424,
}  # nvidia and nvidia_uvm as the recorded H200 host shows them; the rest plausible
_VERSION_PART = re.compile(r"[.\-+~]")


@dataclass(frozen=True)
class ModuleStandin:
    """What a `<module>.ko` stand-in declares."""

    name: str
    """Module name: `nvidia`."""
    version: str
    """Version the module reports in `sys/module/<name>/version`."""
    kernel_release: str
    """Kernel release the module was built for; it loads only into that kernel."""
    depends: tuple[str, ...] = ()
    """Modules that must be loaded first."""
    size: int = 65536
    """Size `proc/modules` shows."""
    brings_up_gpus: bool = True
    """False stands in for a defective build that loads but initialises no GPU (built, say,
    without the firmware the node's GPUs need): the simulated NVML then sees no devices, so
    the driver fails validation. Written to the file only when False."""
    parameters: tuple[tuple[str, str], ...] = ()
    """The parameters it declares, name and type as modinfo's `parm:` shows them
    (`("NVreg_EnableGpuFirmware", "uint")`); the simulated kernel ignores any other, as the
    real one does, and refuses a value its type does not take."""

    def encode(self) -> bytes:
        """The stand-in's file content."""
        document = {
            "format": STANDIN_FORMAT,
            "name": self.name,
            "version": self.version,
            "kernel_release": self.kernel_release,
            "depends": list(self.depends),
            "size": self.size,
        }
        if not self.brings_up_gpus:
            document["brings_up_gpus"] = False
        if self.parameters:
            document["parameters"] = dict(self.parameters)
        return (json.dumps(document, indent=2) + "\n").encode()

    @classmethod
    def decode(cls, data: bytes) -> ModuleStandin:
        """Read a stand-in; `ValueError` when `data` is not one."""
        try:
            document = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ValueError("not a gpuop module stand-in") from None
        if not isinstance(document, dict) or document.get("format") != STANDIN_FORMAT:
            raise ValueError("not a gpuop module stand-in")
        try:
            depends = document.get("depends", [])
            if not isinstance(depends, list) or not all(isinstance(d, str) for d in depends):
                raise TypeError("depends")
            declared = document.get("parameters", {})
            if not isinstance(declared, dict) or not all(
                isinstance(v, str) for v in declared.values()
            ):
                raise TypeError("parameters")
            standin = cls(
                name=str(document["name"]),
                version=str(document["version"]),
                kernel_release=str(document["kernel_release"]),
                depends=tuple(depends),
                size=int(document.get("size", 65536)),
                brings_up_gpus=document.get("brings_up_gpus", True) is not False,
                parameters=tuple(sorted(declared.items())),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"module stand-in field {error} is missing or wrong") from None
        return standin


def standins_for(
    component: str, version: str, kernel_release: str, *, defective: bool = False
) -> tuple[ModuleStandin, ...]:
    """The stand-ins of every module of `component`, at `version`, for `kernel_release`;
    `defective`: modules that load but bring up no GPU (`ModuleStandin.brings_up_gpus`)."""
    return tuple(
        ModuleStandin(
            name=module,
            version=version,
            kernel_release=kernel_release,
            depends=components.dependencies(module),
            size=_SIZES.get(module, 65536),
            brings_up_gpus=not defective,
            parameters=tuple(sorted(parameters.STANDIN_DECLARED.get(module, {}).items())),
        )
        for module in components.modules_of(component)
    )


def modules_dir(root: HostRoot, kernel_release: str) -> Path:
    """`lib/modules/<kernel release>` under the host root."""
    return root.join(f"lib/modules/{kernel_release}")


def component_dir(root: HostRoot, kernel_release: str, component: str) -> Path:
    """Where every installed version of `component` lives."""
    return modules_dir(root, kernel_release) / UPDATES / component


def package_dir(root: HostRoot, kernel_release: str, component: str, version: str) -> Path:
    """Where `version` of `component` is (or would be) installed."""
    return component_dir(root, kernel_release, component) / version


def version_key(version: str) -> tuple[tuple[int, int, str], ...]:
    """Sort key comparing versions part by part, numbers numerically."""
    return tuple(
        (0, int(part), "") if part.isdigit() else (1, 0, part)
        for part in _VERSION_PART.split(version)
    )


def installed_versions(root: HostRoot, kernel_release: str, component: str) -> tuple[str, ...]:
    """The installed versions of `component` for `kernel_release`, oldest first."""
    directory = component_dir(root, kernel_release, component)
    if not directory.is_dir():
        return ()
    versions = [
        entry.name
        for entry in directory.iterdir()
        if entry.is_dir() and not entry.name.startswith(".")
    ]
    return tuple(sorted(versions, key=version_key))


def active_version(root: HostRoot, kernel_release: str, component: str) -> str | None:
    """The version named in the component's `active` file, else the newest installed one;
    None when nothing is installed. The named version may not be installed: depmod says so."""
    selected = component_dir(root, kernel_release, component) / ACTIVE
    if selected.is_file():
        name = selected.read_text().strip()
        if name:
            return name
    versions = installed_versions(root, kernel_release, component)
    return versions[-1] if versions else None


def select_version(root: HostRoot, kernel_release: str, component: str, version: str) -> None:
    """Make `version` the component's active version at the next depmod."""
    write_atomic(component_dir(root, kernel_release, component) / ACTIVE, version + "\n")


def install_standins(root: HostRoot, component: str, version: str, kernel_release: str) -> Path:
    """Write stand-ins of `component`'s modules straight into the installed layout, as an
    unpacked package would leave them; for seeding host roots and tests (the driver-manager
    installs from package archives instead). Returns the package directory."""
    directory = package_dir(root, kernel_release, component, version)
    directory.mkdir(parents=True, exist_ok=True)
    for standin in standins_for(component, version, kernel_release):
        write_atomic(directory / f"{standin.name}{MODULE_SUFFIX}", standin.encode())
    return directory
