"""Host roots with a format 2 driver's user space laid out as the driver-manager's installer
leaves it (`opt/gpuop/gpu/<version>/`, the `current` link, the package's `manifest.json` in
its version directory), for the CDI spec's tests; and the CDI project's validator."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from gpuop.host import manifests, packages, system
from gpuop.host.roots import HostRoot

REPOSITORY = Path(__file__).resolve().parents[2]
TOOLS = Path(os.environ.get("GPUOP_CLUSTER_TOOLS", REPOSITORY / ".cache" / "cluster-tools"))
VALIDATOR = TOOLS / "bin" / "cdi-validate"
SHA = "0" * 64


def manifest(
    version: str,
    kernel_release: str,
    *,
    libraries: tuple[str, ...] = (),
    links: dict[str, str] | None = None,
    binaries: tuple[str, ...] = ("nvidia-smi",),
    firmware: tuple[str, ...] = (),
    configs: tuple[str, ...] = (),
) -> manifests.ManifestV2:
    """A format 2 manifest of `version` with these user space files (digests are not
    checked here: nothing is unpacked)."""
    libraries = libraries or (f"libnvidia-ml.so.{version}", f"libcuda.so.{version}")
    links = (
        links
        if links is not None
        else {
            "libnvidia-ml.so.1": f"libnvidia-ml.so.{version}",
            "libcuda.so.1": f"libcuda.so.{version}",
        }
    )
    files = [{"path": "modules/nvidia.ko", "sha256": SHA, "mode": "0644", "role": "module"}]
    files += [
        {"path": f"userspace/lib/{n}", "sha256": SHA, "mode": "0644", "role": "library"}
        for n in libraries
    ]
    files += [
        {"path": f"userspace/bin/{n}", "sha256": SHA, "mode": "0755", "role": "binary"}
        for n in binaries
    ]
    files += [
        {"path": f"userspace/etc/{n}", "sha256": SHA, "mode": "0644", "role": "config"}
        for n in configs
    ]
    files += [
        {"path": f"firmware/{n}", "sha256": SHA, "mode": "0644", "role": "firmware"}
        for n in firmware
    ]
    document = {
        "format": manifests.FORMAT_V2,
        "component": "gpu",
        "version": version,
        "flavour": "open",
        "kernel_release": kernel_release,
        "files": files,
        "links": [{"path": f"userspace/lib/{p}", "target": t} for p, t in links.items()],
    }
    parsed = manifests.parse(json.dumps(document).encode())
    assert isinstance(parsed, manifests.ManifestV2)
    return parsed


def install_userspace(
    root: HostRoot, manifest: manifests.ManifestV2, *, current: bool = True
) -> None:
    """Lay the manifest's user space and firmware out under `root` as the installer does, its
    `manifest.json` in the version directory, and (with `current`) switch to it."""
    kernel_release = system.kernel_release(root)
    assert kernel_release is not None
    directory = packages.package_dir(root, kernel_release, "gpu", manifest.version)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / manifests.NAME).write_bytes(manifest.encode())
    userspace = root.join(f"{packages.USERSPACE}/gpu/{manifest.version}")
    for entry in manifest.files:
        parts = Path(entry.path).parts
        if parts[0] == "userspace":
            target = userspace.joinpath(*parts[1:])
        elif parts[0] == "firmware":
            target = root.join(f"lib/firmware/nvidia/{manifest.version}").joinpath(*parts[1:])
        else:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(entry.path.encode())
    for link in manifest.links:
        userspace.joinpath(*Path(link.path).parts[1:]).symlink_to(link.target)
    if current:
        switch(root, manifest.version)


def switch(root: HostRoot, version: str) -> None:
    link = root.join(f"{packages.USERSPACE}/gpu/{packages.CURRENT}")
    link.unlink(missing_ok=True)
    link.symlink_to(version)


def validate(*specs: Path) -> tuple[int, list[dict[str, Any]], str]:
    """The CDI project's validator (`tests/cluster/cdi`) on `specs`: its exit status, its
    report (one object per file) and its stderr. Fails the test when it is not built."""
    import pytest

    if not VALIDATOR.is_file():
        pytest.fail(
            f"{VALIDATOR} is missing: run `make cluster-tools` (builds it from tests/cluster/cdi; "
            "needs Go 1.26 and the Go module proxy)"
        )
    done = subprocess.run(
        [str(VALIDATOR), *map(str, specs)], capture_output=True, text=True, timeout=60, check=False
    )
    return done.returncode, json.loads(done.stdout or "[]"), done.stderr
