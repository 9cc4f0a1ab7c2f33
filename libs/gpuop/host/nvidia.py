"""The NVIDIA kernel driver's own report in procfs: `proc/driver/nvidia/version` and
`proc/driver/nvidia/gpus/<address>/information`.

Discovery reads the loaded driver version from here (it is there even when NVML is not);
the driver-manager checks it after a load. The directory exists only while the `nvidia`
module is loaded. The simulated kernel writes these files in the same format when it loads
`nvidia`, using `with_version` and `with_firmware` below.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuop.host.errors import HostReadError
from gpuop.host.roots import HostRoot

VERSION_FILE = "proc/driver/nvidia/version"
GPUS_DIR = "proc/driver/nvidia/gpus"

# Open modules:  "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release
#                 Build  (nixbld@)  "
# Proprietary:   "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 ..."
_NVRM = re.compile(
    r"^NVRM version: NVIDIA UNIX (?P<open>Open )?(?:(?P<arch_before>[\w-]+) )?Kernel Module"
    r"(?: for (?P<arch_after>[\w-]+))?\s+(?P<version>\d+\.\d+(?:\.\d+)?)(?P<build>.*)$"
)
_GCC = re.compile(r"^GCC version:\s+(?P<gcc>.*?)\s*$")


@dataclass(frozen=True)
class NvidiaDriverVersion:
    """The loaded NVIDIA kernel driver, from `proc/driver/nvidia/version`."""

    version: str
    """Driver version: `580.159.04`."""
    open_kernel_module: bool
    """Whether the open-source kernel modules are loaded (the only kind Hopper and later run)."""
    arch: str | None
    """Architecture the module was built for: `x86_64`, `aarch64`."""
    build: str
    """The rest of the line: `Release Build  (nixbld@)`, or a build date."""
    gcc_version: str | None
    """Compiler that built the module: `gcc version 15.3.0 (GCC)`."""

    @property
    def parts(self) -> tuple[str, ...]:
        """Major, minor and (when present) revision as strings; `04` keeps its zero."""
        return tuple(self.version.split("."))


@dataclass(frozen=True)
class GpuInformation:
    """One GPU as the NVIDIA driver lists it in `proc/driver/nvidia/gpus/<address>/information`."""

    address: str
    """PCI address, the directory's name: `0000:00:06.0`."""
    model: str | None
    """Product name: `NVIDIA H200`."""
    uuid: str | None
    """GPU UUID: `GPU-20bce083-dbf9-2d4f-3c35-c858915accc5`."""
    irq: int | None
    """Interrupt line."""
    video_bios: str | None
    """VBIOS version: `96.00.a5.00.1a`."""
    bus_type: str | None
    """`PCIe`, or `SXM` on some boards."""
    device_minor: int | None
    """Minor number of `/dev/nvidia<minor>`."""
    firmware: str | None
    """GSP firmware version (the driver's version); None when it says `N/A`."""
    excluded: bool | None
    """Whether the driver excluded the GPU (for example after a fatal error)."""


def driver_version(root: HostRoot) -> NvidiaDriverVersion | None:
    """The loaded NVIDIA driver; None when `nvidia` is not loaded (no version file)."""
    text = root.read_text(VERSION_FILE)
    if text is None:
        return None
    try:
        return parse_version(text)
    except ValueError as error:
        raise HostReadError(root.join(VERSION_FILE), str(error)) from None


def parse_version(text: str) -> NvidiaDriverVersion:
    """Parse the text of `proc/driver/nvidia/version`; `ValueError` when it has no NVRM line."""
    nvrm: re.Match[str] | None = None
    gcc: re.Match[str] | None = None
    for line in text.splitlines():
        nvrm = nvrm or _NVRM.match(line)
        gcc = gcc or _GCC.match(line)
    if nvrm is None:
        raise ValueError("no 'NVRM version: NVIDIA UNIX ... Kernel Module <version>' line")
    return NvidiaDriverVersion(
        version=nvrm["version"],
        open_kernel_module=nvrm["open"] is not None,
        arch=nvrm["arch_after"] or nvrm["arch_before"],
        build=nvrm["build"].strip(),
        gcc_version=gcc["gcc"] if gcc else None,
    )


def with_version(text: str, version: str) -> str:
    """The same version file text, naming driver `version` instead."""
    lines = text.splitlines(keepends=True)
    for index, line in enumerate(lines):
        match = _NVRM.match(line.rstrip("\n"))
        if match:
            start, end = match.span("version")
            lines[index] = line[:start] + version + line[end:]
            return "".join(lines)
    raise ValueError("no 'NVRM version' line to rewrite")


def gpus(root: HostRoot) -> tuple[GpuInformation, ...]:
    """Every GPU the loaded driver lists, by address; empty when it is not loaded."""
    found = (gpu_information(root, address) for address in root.list_dir(GPUS_DIR))
    return tuple(gpu for gpu in found if gpu is not None)


def gpu_information(root: HostRoot, address: str) -> GpuInformation | None:
    """The driver's information on the GPU at `address`; None when it lists no such GPU."""
    relative = f"{GPUS_DIR}/{address}/information"
    text = root.read_text(relative)
    if text is None:
        return None
    try:
        return parse_information(address, text)
    except ValueError as error:
        raise HostReadError(root.join(relative), str(error)) from None


def parse_information(address: str, text: str) -> GpuInformation:
    """Parse an `information` file's `Key: value` lines; `ValueError` on a line without `:`."""
    values: dict[str, str] = {}
    for line_number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        key, colon, value = line.partition(":")
        if not colon:
            raise ValueError(f"line {line_number} is not 'Key: value': {line!r}")
        values[key.strip()] = value.strip()

    def number(key: str) -> int | None:
        raw = values.get(key)
        if raw is None:
            return None
        if not raw.isdigit():
            raise ValueError(f"{key} is not a number: {raw!r}")
        return int(raw)

    firmware = values.get("GPU Firmware")
    excluded = values.get("GPU Excluded")
    return GpuInformation(
        address=address,
        model=values.get("Model"),
        uuid=values.get("GPU UUID"),
        irq=number("IRQ"),
        video_bios=values.get("Video BIOS"),
        bus_type=values.get("Bus Type"),
        device_minor=number("Device Minor"),
        firmware=None if firmware in (None, "N/A") else firmware,
        excluded=None if excluded is None else excluded.lower() == "yes",
    )


def with_firmware(text: str, version: str) -> str:
    """The same `information` text with its `GPU Firmware` value set to `version`."""
    lines = text.splitlines(keepends=True)
    for index, line in enumerate(lines):
        key, colon, value = line.partition(":")
        if colon and key.strip() == "GPU Firmware" and value.strip() not in ("", "N/A"):
            start = len(key) + 1 + (len(value) - len(value.lstrip()))
            end = start + len(value.strip())
            lines[index] = line[:start] + version + line[end:]
    return "".join(lines)
