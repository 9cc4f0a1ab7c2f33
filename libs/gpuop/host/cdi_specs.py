"""The CDI specs a container runtime on the node would load, read back for discovery.

Discovery's inventory names every spec of kind `nvidia.com/gpu` (the kind the driver-manager
writes, as `nvidia-ctk cdi generate` does) with its `cdiVersion` and device count, and every
spec file it could not read, so a node is labelled CDI-ready only while a runtime can really
hand out GPUs by CDI name. Called by `gpuop.inventory.scanning` on every scan; this module
only reads.

Where runtimes look (CDI's `pkg/cdi/spec-dirs.go`): `/etc/cdi` (static, lower priority) and
`/var/run/cdi` (generated, higher priority), `*.json` and `*.yaml` files only, no
subdirectories. The checks are the few a runtime's loader fails a spec on and that decide
whether it offers devices at all: a mapping with a semver `cdiVersion`, a
`<vendor>/<class>` kind, at least one device, each with a valid name and `containerEdits`, no
name twice. The CDI project's own validator is stricter (unknown fields, edits per version);
the driver-manager's tests run it on what gpuop writes. A malformed file is reported with the
reason and never stops the scan: runtimes, too, skip a bad spec and load the others.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from gpuop.host.errors import HostReadError
from gpuop.host.roots import HostRoot

SPEC_DIRECTORIES = ("etc/cdi", "var/run/cdi")
"""Where runtimes read specs, lower priority first (a generated spec in `/var/run/cdi` wins)."""
SPEC_SUFFIXES = (".json", ".yaml")
"""The file names runtimes load; `.yml` and the rest are ignored, as by CDI's own cache."""
NVIDIA_GPU_KIND = "nvidia.com/gpu"
"""The kind of NVIDIA's GPU specs: devices `nvidia.com/gpu=0`, `=GPU-<uuid>`, `=all`."""
MAX_SPEC_BYTES = 8 * 2**20
"""A spec larger than this is reported, not parsed: a real one with every library is ~100 KiB."""

_SEMVER = re.compile(r"^v?(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$")
_KIND = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?/[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


@dataclass(frozen=True)
class SpecFile:
    """One spec file found in a spec directory."""

    path: str
    """Where the host has it: `/var/run/cdi/nvidia.com-gpu.yaml`."""
    kind: str | None
    """Its `kind`; None when the file is malformed before a kind could be read."""
    cdi_version: str | None = None
    """Its `cdiVersion`, as written (`0.5.0`)."""
    device_names: tuple[str, ...] = ()
    """The names of its devices, in file order; empty when malformed."""
    error: str | None = None
    """Why a runtime would refuse it; None for a valid spec."""

    @property
    def valid(self) -> bool:
        """Whether a runtime would load its devices."""
        return self.error is None


def read_specs(root: HostRoot, kind: str = NVIDIA_GPU_KIND) -> tuple[SpecFile, ...]:
    """Every spec file of `kind`, and every malformed spec file whose kind is unknown, in
    both spec directories (lower priority first, then by name). Specs of other kinds are
    left out; nothing here raises for a bad file."""
    found = []
    for directory in SPEC_DIRECTORIES:
        try:
            names = root.list_dir(directory)
        except HostReadError:
            continue  # a file where a directory belongs: no spec directory, for runtimes too
        for name in names:
            if not name.endswith(SPEC_SUFFIXES) or root.resolve(f"{directory}/{name}").is_dir():
                continue
            spec = read_spec(root, f"{directory}/{name}")
            if spec.kind is None or spec.kind == kind:
                found.append(spec)
    return tuple(found)


def read_spec(root: HostRoot, relative: str) -> SpecFile:
    """The spec file at `relative` under the root, checked; see `SpecFile.error`."""
    path = "/" + relative.lstrip("/")
    try:
        document = _load(root, relative)
    except _Malformed as error:
        return SpecFile(path=path, kind=None, error=str(error))
    if not isinstance(document, Mapping):
        return SpecFile(path=path, kind=None, error="the spec is not a mapping")
    kind = document.get("kind")
    if not isinstance(kind, str) or not _KIND.match(kind):
        return SpecFile(path=path, kind=None, error=f"kind {kind!r} is not <vendor>/<class>")
    version = document.get("cdiVersion")
    if not isinstance(version, str) or not _SEMVER.match(version):
        return SpecFile(path=path, kind=kind, error=f"cdiVersion {version!r} is not semver")
    names, problem = _device_names(document)
    return SpecFile(path=path, kind=kind, cdi_version=version, device_names=names, error=problem)


def _device_names(document: Mapping[str, Any]) -> tuple[tuple[str, ...], str | None]:
    devices = document.get("devices")
    if not isinstance(devices, list) or not devices:
        return (), "the spec defines no devices"
    names: list[str] = []
    for number, device in enumerate(devices):
        if not isinstance(device, Mapping):
            return (), f"device {number} is not a mapping"
        name = device.get("name")
        if not isinstance(name, str) or not _DEVICE_NAME.match(name):
            return (), f"device {number} has no valid name: {name!r}"
        if name in names:
            return (), f"device {name!r} is defined twice"
        if not isinstance(device.get("containerEdits"), Mapping):
            return (), f"device {name!r} has no containerEdits"
        names.append(name)
    edits = document.get("containerEdits")
    if edits is not None and not isinstance(edits, Mapping):
        return (), "the spec's containerEdits is not a mapping"
    return tuple(names), None


class _Malformed(Exception):
    """The file cannot be read as a JSON or YAML document."""


def _load(root: HostRoot, relative: str) -> Any:
    try:
        size = root.resolve(relative).stat().st_size
    except OSError as error:
        raise _Malformed(error.strerror or str(error)) from None
    if size > MAX_SPEC_BYTES:
        raise _Malformed(f"{size} bytes, more than the {MAX_SPEC_BYTES} a spec may have")
    try:
        text = root.read_text(relative)
    except HostReadError as error:
        raise _Malformed(error.reason) from None
    if text is None:
        raise _Malformed("vanished while being read")
    try:
        if relative.endswith(".json"):
            return json.loads(text)
        return yaml.safe_load(text)
    except json.JSONDecodeError as error:
        raise _Malformed(f"not JSON: {error}") from None
    except yaml.YAMLError as error:
        raise _Malformed(f"not YAML: {_first_line(str(error))}") from None


def _first_line(text: str) -> str:
    return " ".join(text.split())[:300]
