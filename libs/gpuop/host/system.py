"""What the node runs and since when: OS release, kernel release, architecture, boot id,
uptime, read from the host root.

Discovery puts these in every inventory and heartbeat (the NFD `kernel-version.*` and
`system-os_release.*` labels come from them; a new boot id confirms a reboot); the
simulated kernel reads the kernel release to find the modules it may load. A missing file
gives None; a file that exists but does not parse raises `HostReadError`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuop.host import nvidia
from gpuop.host.errors import HostReadError
from gpuop.host.roots import HostRoot

OS_RELEASE_FILES = ("etc/os-release", "usr/lib/os-release")
"""Where os-release(5) may be, in the order the specification says to look."""
OSRELEASE = "proc/sys/kernel/osrelease"
PROC_VERSION = "proc/version"
BOOT_ID = "proc/sys/kernel/random/boot_id"
ARCH = "proc/sys/kernel/arch"
UPTIME = "proc/uptime"

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PROC_VERSION = re.compile(r"^Linux version (\S+)")
_BOOT_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@dataclass(frozen=True)
class OsRelease:
    """The host's os-release(5); every field None when the host has no such file."""

    id: str | None = None
    """`ID`: `ubuntu`, `rhel`, `rhcos`."""
    version_id: str | None = None
    """`VERSION_ID`: `24.04`."""
    pretty_name: str | None = None
    """`PRETTY_NAME`: `Ubuntu 24.04.1 LTS`."""
    ostree_version: str | None = None
    """`OSTREE_VERSION` (RHCOS builds on OpenShift)."""
    values: Mapping[str, str] = field(default_factory=dict)
    """Every assignment in the file, unquoted."""


@dataclass(frozen=True)
class HostSystem:
    """Everything `system` reads, in one value."""

    os: OsRelease
    kernel_release: str | None
    machine: str | None
    boot_id: str | None
    uptime_seconds: float | None


def describe(root: HostRoot) -> HostSystem:
    """OS, kernel, architecture, boot id and uptime of the host, read once each."""
    return HostSystem(
        os=os_release(root),
        kernel_release=kernel_release(root),
        machine=machine(root),
        boot_id=boot_id(root),
        uptime_seconds=uptime_seconds(root),
    )


def os_release(root: HostRoot) -> OsRelease:
    """The host's os-release: `etc/os-release`, else `usr/lib/os-release`, else all None."""
    for relative in OS_RELEASE_FILES:
        text = root.read_text(relative)
        if text is not None:
            try:
                values = parse_os_release(text)
            except ValueError as error:
                raise HostReadError(root.join(relative), str(error)) from None
            return OsRelease(
                id=values.get("ID"),
                version_id=values.get("VERSION_ID"),
                pretty_name=values.get("PRETTY_NAME"),
                ostree_version=values.get("OSTREE_VERSION"),
                values=values,
            )
    return OsRelease()


def parse_os_release(text: str) -> dict[str, str]:
    """The `KEY=value` assignments of an os-release file, with shell quoting removed."""
    values: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, equals, raw = stripped.partition("=")
        if not equals or not _KEY.match(key):
            raise ValueError(f"line {number} is not KEY=value: {line!r}")
        try:
            values[key] = " ".join(shlex.split(raw, comments=False, posix=True))
        except ValueError as error:
            raise ValueError(f"line {number}: {error}: {line!r}") from None
    return values


def kernel_release(root: HostRoot) -> str | None:
    """The running kernel's release (`uname -r`): from `proc/sys/kernel/osrelease`, else the
    first words of `proc/version`."""
    release = root.read_text(OSRELEASE)
    if release is not None and release.strip():
        return release.strip()
    version = root.read_text(PROC_VERSION)
    if version is None:
        return None
    match = _PROC_VERSION.match(version)
    if match is None:
        raise HostReadError(root.join(PROC_VERSION), "does not start with 'Linux version '")
    return match.group(1)


def machine(root: HostRoot) -> str | None:
    """The CPU architecture (`uname -m`): from `proc/sys/kernel/arch`, else the architecture
    the loaded NVIDIA module was built for (which is the kernel's), else None."""
    arch = root.read_text(ARCH)
    if arch is not None and arch.strip():
        return arch.strip()
    driver = nvidia.driver_version(root)
    return driver.arch if driver is not None else None


def boot_id(root: HostRoot) -> str | None:
    """The kernel's random id of this boot; a new one means the node rebooted."""
    text = root.read_text(BOOT_ID)
    if text is None:
        return None
    value = text.strip()
    if not _BOOT_ID.match(value):
        raise HostReadError(root.join(BOOT_ID), f"not a boot id: {value!r}")
    return value


def uptime_seconds(root: HostRoot) -> float | None:
    """Seconds since the host booted, from `proc/uptime`."""
    text = root.read_text(UPTIME)
    if text is None:
        return None
    try:
        return float(text.split()[0])
    except (IndexError, ValueError):
        raise HostReadError(root.join(UPTIME), f"not an uptime: {text.strip()!r}") from None
