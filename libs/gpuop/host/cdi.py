"""CDI specs for the NVIDIA driver gpuop installed: what a container asking for a GPU by its
CDI name is given, device nodes and the driver's user space alike.

Called by the driver-manager after every load and rollback (kind `nvidia.com/gpu`, named as
`nvidia-ctk cdi generate` names them), by the device plugin whenever it reads the node's GPUs
(the kind of its `cdi` device list strategy), and by `gpuop cdi generate`. The callers name
the GPUs (NVML, through `gpuop.inventory.cdispecs`, or the device plugin's inventory); this
module reads the files from the format 2 manifest of the driver whose user space is in use
(`opt/gpuop/gpu/current`, switched with the modules by the driver-manager's load):

    manifest            host path                                container path
    userspace/lib/X     /opt/gpuop/gpu/<version>/lib/X           /usr/lib/<triplet>/X
    userspace/bin/X     /opt/gpuop/gpu/<version>/bin/X           /usr/bin/X
    userspace/etc/X     /opt/gpuop/gpu/<version>/etc/X           /etc/X
    firmware/X          /lib/firmware/nvidia/<version>/X         the same

each a read-only bind mount (`ro`, `nosuid`, `nodev`, `bind`), at the paths upstream's
generated spec uses for a Debian-style host. The manifest's links (`libcuda.so.1`,
`libnvidia-ml.so.1`, ...) are mounts too: a bind mount's source is resolved on the host, so
the container finds the file under its soname, where upstream's spec runs a
`create-symlinks` hook.

The linker: no hook, no environment. Upstream adds `createContainer` hooks that run
`nvidia-cdi-hook` (create-symlinks, update-ldcache) from the NVIDIA Container Toolkit; gpuop
installs no such binary on the host, and a hook whose path is missing fails every container
that asks for a GPU. `LD_LIBRARY_PATH` would replace the image's own (CDI's env edits
overwrite a variable of the same name: CUDA and NGC images set theirs). The libraries go to
`/usr/lib/x86_64-linux-gnu`, which glibc of Debian and Ubuntu images searches after
`ld.so.cache` without being told (`/usr/lib/aarch64-linux-gnu` on an arm64 host: the
triplet is the host's, `library_dir`); images whose linker does not (RHEL family:
`/usr/lib64`) need a hook of gpuop's own, which is not written yet.

Spec-wide edits carry `NVIDIA_VISIBLE_DEVICES=void` (the legacy runtime hook injects nothing
a second time), the control device nodes and the mounts; each device carries its device
nodes. A device node the host root has is written with its type and numbers (`node_edit`),
so the runtime makes it in the container without looking at its own `/dev` (the CDI
specification allows a fully specified node; the runtime stats the path only for what is
left out); one the host root lacks is named by its path only, as upstream's spec does.
Version 0.5.0, the lowest that covers these fields and digit-leading names
(SPEC.md). `write` replaces the file atomically and keeps what it replaced as
`<file>.previous` (so does `retire`, which removes it); `restore_previous` puts that back
byte for byte.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from gpuop.host import branches, manifests, packages, system
from gpuop.host.errors import HostError, HostReadError
from gpuop.host.files import write_atomic
from gpuop.host.roots import HostRoot

KIND = "nvidia.com/gpu"
"""The kind `nvidia-ctk cdi generate` writes, and so the names users and tools know."""
SPEC_VERSION = "0.5.0"
"""The lowest CDI version covering every field used (and names that begin with a digit)."""
SPEC_DIR = "var/run/cdi"
"""Generated specs, under the host root: the higher-priority directory, tmpfs on most hosts."""
SPEC_FILE = "nvidia.com-gpu.json"
PREVIOUS_SUFFIX = ".previous"
"""The spec a `write` replaced, beside it."""
COMPONENT = "gpu"
LIBRARY_DIR = branches.ARCHES["amd64"].library_dir
"""Where the libraries go in the container of an x86_64 host: Debian's multiarch directory,
which upstream's spec uses on such hosts, and which the images' linker searches by default;
`library_dir` gives other architectures'."""
BINARY_DIR = "/usr/bin"
MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "bind")
CONTROL_DEVICES = (
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
)
"""Device nodes every GPU container needs besides its GPUs', given when the host has them."""
ALL = "all"
"""The device that is every GPU (`nvidia.com/gpu=all`)."""

_CAPABILITY_MINOR = re.compile(r"^DeviceFileMinor:\s*(\d+)\s*$", re.MULTILINE)
_VERSION = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+~-]{0,63}$")
_VERSION_IN_PATH = re.compile(r"^/opt/gpuop/gpu/([^/]+)/")


class CdiError(HostError):
    """No spec can be made for the host root: no driver installed there, or its manifest is
    missing or malformed; the message says which and where."""


class NoDevices(CdiError):
    """No GPU to describe: a spec must define at least one device."""


@dataclass(frozen=True)
class Device:
    """One CDI device: the names it answers to and the device nodes it gives."""

    names: tuple[str, ...]
    device_nodes: tuple[str, ...]


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str


@dataclass(frozen=True)
class DriverFiles:
    """The installed driver's files a container gets, in the manifest's order."""

    version: str
    mounts: tuple[Mount, ...]


def spec_path(root: HostRoot, name: str = SPEC_FILE) -> Path:
    return root.join(f"{SPEC_DIR}/{name}")


def driver_files(root: HostRoot) -> DriverFiles:
    """The files of the driver whose user space is in use, from its package's manifest;
    `CdiError` when the host root has none or its manifest is not a driver's."""
    userspace = f"{packages.USERSPACE}/{COMPONENT}"
    try:
        version = root.link_target(f"{userspace}/{packages.CURRENT}")
    except HostReadError as exc:
        raise CdiError(str(exc)) from None
    if version is not None and not _VERSION.match(version):
        raise CdiError(
            f"{root.join(userspace)}/{packages.CURRENT} points to {version!r}, not to a "
            "version beside it"
        )
    if version is None:
        raise CdiError(
            f"{root.join(userspace)}/{packages.CURRENT} does not exist: no NVIDIA driver user "
            "space installed by gpuop is in use on this host (install and load a driver "
            "package of format 2 first)"
        )
    try:
        kernel_release = system.kernel_release(root)
    except HostReadError as exc:
        raise CdiError(str(exc)) from None
    if kernel_release is None:
        raise CdiError(f"{root.path} does not say which kernel runs")
    path = packages.package_dir(root, kernel_release, COMPONENT, version) / "manifest.json"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CdiError(
            f"{path} does not exist: driver {version}'s user space is in use, but no package "
            f"of it is installed for the running kernel {kernel_release}"
        ) from None
    except OSError as exc:
        raise CdiError(f"{path}: {exc}") from None
    try:
        manifest = manifests.parse(data, str(path))
    except manifests.ManifestError as exc:
        raise CdiError(str(exc)) from None
    if not isinstance(manifest, manifests.ManifestV2):
        raise CdiError(f"{path} is a format 1 manifest, which lists no user space")
    if manifest.version != version:
        raise CdiError(f"{path} describes {manifest.version}, not {version}")
    try:
        machine = system.machine(root)
    except HostReadError as exc:
        raise CdiError(str(exc)) from None
    return files_of(manifest, library_dir(machine))


def library_dir(machine: str | None) -> str:
    """Where the libraries go in the containers of a host whose CPU is `machine` (`uname -m`):
    the Debian multiarch directory of its architecture (`/usr/lib/aarch64-linux-gnu`),
    `<machine>-linux-gnu` for one gpuop builds no packages for, x86_64's when unknown."""
    if machine is None:
        return LIBRARY_DIR
    known = [a for a in branches.ARCHES.values() if a.machine == machine]
    return known[0].library_dir if known else f"/usr/lib/{machine}-linux-gnu"


def files_of(manifest: manifests.ManifestV2, libraries: str = LIBRARY_DIR) -> DriverFiles:
    """The mounts of a format 2 manifest's libraries (into `libraries` in the container),
    links, binaries, configs and firmware."""
    userspace = f"/{packages.USERSPACE}/{manifest.component}/{manifest.version}"
    firmware = f"/lib/firmware/nvidia/{manifest.version}"
    mounts: list[Mount] = []
    entries: list[tuple[str, manifests.Role | None]] = [(f.path, f.role) for f in manifest.files]
    entries += [(link.path, None) for link in manifest.links]
    for path, role in entries:
        parts = PurePosixPath(path).parts
        if role is manifests.Role.MODULE:
            continue
        if role is manifests.Role.FIRMWARE:
            inside = "/".join(parts[1:])
            mounts.append(Mount(f"{firmware}/{inside}", f"{firmware}/{inside}"))
            continue
        top, rest = parts[1], "/".join(parts[2:])
        where = {"lib": libraries, "bin": BINARY_DIR, "etc": "/etc"}.get(top)
        if where is None or not rest:
            continue  # nothing a container runs: no place for it
        mounts.append(Mount(f"{userspace}/{top}/{rest}", f"{where}/{rest}"))
    return DriverFiles(manifest.version, tuple(mounts))


def mig_capability_nodes(
    root: HostRoot, minor: int, gpu_instance: int, compute: int
) -> tuple[str, ...]:
    """`/dev/nvidia-caps/nvidia-cap<n>` of a MIG device's GPU and compute instance, as the
    driver lists them under `/proc/driver/nvidia/capabilities`; none where it does not."""
    base = f"proc/driver/nvidia/capabilities/gpu{minor}/mig/gi{gpu_instance}"
    nodes = []
    for access in (f"{base}/access", f"{base}/ci{compute}/access"):
        try:
            match = _CAPABILITY_MINOR.search(root.read_text(access) or "")
        except HostReadError:
            match = None
        if match:
            nodes.append(f"/dev/nvidia-caps/nvidia-cap{match.group(1)}")
    return tuple(nodes)


def node_edit(node: str, root: HostRoot | None = None) -> dict[str, Any]:
    """A `deviceNodes` entry for `node` (`/dev/...`): with `type`, `major` and `minor` when
    `root` has it as a character device."""
    edit: dict[str, Any] = {"path": node}
    if root is None:
        return edit
    try:
        found = root.join(node.lstrip("/")).lstat()
    except OSError:
        return edit
    if stat.S_ISCHR(found.st_mode):
        edit.update(type="c", major=os.major(found.st_rdev), minor=os.minor(found.st_rdev))
    return edit


def control_nodes(root: HostRoot) -> tuple[str, ...]:
    """The `CONTROL_DEVICES` the host has."""
    return tuple(node for node in CONTROL_DEVICES if root.join(node).exists())


def with_all(devices: Sequence[Device]) -> tuple[Device, ...]:
    """`devices` and the `all` device giving every device node of them."""
    if not devices:
        return ()
    nodes = dict.fromkeys(node for device in devices for node in device.device_nodes)
    return (*devices, Device((ALL,), tuple(nodes)))


def spec(
    devices: Iterable[Device],
    driver: DriverFiles,
    control: Sequence[str],
    kind: str = KIND,
    root: HostRoot | None = None,
) -> dict[str, Any]:
    """The spec document, its device nodes numbered from `root` where it has them
    (`node_edit`); `CdiError` when there is no device (a spec must define one)."""
    entries = [
        {
            "name": name,
            "containerEdits": {
                "deviceNodes": [node_edit(node, root) for node in device.device_nodes]
            },
        }
        for device in devices
        for name in device.names
    ]
    if not entries:
        raise NoDevices("no GPU to describe: a CDI spec must define at least one device")
    return {
        "cdiVersion": SPEC_VERSION,
        "kind": kind,
        "devices": entries,
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [node_edit(node, root) for node in control],
            "mounts": [
                {
                    "hostPath": mount.host_path,
                    "containerPath": mount.container_path,
                    "options": list(MOUNT_OPTIONS),
                }
                for mount in driver.mounts
            ],
        },
    }


def encode(document: dict[str, Any]) -> bytes:
    return (json.dumps(document, indent=2) + "\n").encode()


def device_names(path: Path) -> dict[str, str]:
    """The fully qualified name (`nvidia.com/gpu=<name>`) of every device of the spec at
    `path`, by device name; empty where there is none or it does not parse, since a runtime
    would not resolve its names either."""
    try:
        document = json.loads(path.read_bytes())
        kind = document["kind"]
        names = [device["name"] for device in document["devices"]]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return {str(name): f"{kind}={name}" for name in names}


def driver_version_of(data: bytes) -> str | None:
    """The driver version whose user space a spec written here mounts; None when it mounts
    none or does not parse."""
    try:
        document = json.loads(data)
        mounts = document["containerEdits"]["mounts"]
    except (ValueError, KeyError, TypeError):
        return None
    for mount in mounts if isinstance(mounts, list) else ():
        match = _VERSION_IN_PATH.match(str(mount.get("hostPath", "")))
        if match:
            return match.group(1)
    return None


def write(path: Path, data: bytes) -> bool:
    """Replace the spec at `path` with `data` atomically, keeping the one it replaces as
    `<path>.previous` (also atomically, before the replacement); False when it was `data`."""
    try:
        present = path.read_bytes()
    except FileNotFoundError:
        present = None
    if present == data:
        return False
    if present is not None:
        write_atomic(previous_path(path), present)
    write_atomic(path, data)
    return True


def retire(path: Path) -> None:
    """Remove the spec at `path`, keeping it as `<path>.previous` (one rename)."""
    with contextlib.suppress(FileNotFoundError):
        os.replace(path, previous_path(path))


def previous_path(path: Path) -> Path:
    # not .json: runtimes load only *.json and *.yaml, so the old spec is never read as one
    return path.with_name(path.name + PREVIOUS_SUFFIX)


def restore_previous(path: Path, version: str | None = None) -> bool:
    """Put the spec `write` replaced back, byte for byte, when there is one (and it mounts
    `version`'s user space, when given); False otherwise. The previous copy is kept."""
    previous = previous_path(path)
    try:
        data = previous.read_bytes()
    except FileNotFoundError:
        return False
    if version is not None and driver_version_of(data) != version:
        return False
    write_atomic(path, data)
    return True
