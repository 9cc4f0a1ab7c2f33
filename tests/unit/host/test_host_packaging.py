"""Package archives of module stand-ins, a driver source of them, and the installed layout."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from gpuop.host import components, packages, packaging
from gpuop.host.roots import HostRoot

KERNEL = "6.18.44-fc-v657-gpu"


def test_a_package_holds_a_manifest_and_one_stand_in_per_module(tmp_path: Path) -> None:
    built = packaging.build_package(tmp_path, "gpu", "590.44.01", KERNEL)
    assert built.path.name == f"gpu-590.44.01-{KERNEL}.tar.gz"
    assert built.sha256 == packaging.sha256_of(built.path)
    with tarfile.open(built.path) as archive:
        names = archive.getnames()
        manifest = json.load(archive.extractfile("manifest.json") or io.BytesIO())
        drm = archive.extractfile("nvidia_drm.ko")
        assert drm is not None
        standin = packages.ModuleStandin.decode(drm.read())
    assert names == ["manifest.json", *(f"{m}.ko" for m in components.modules_of("gpu"))]
    assert manifest == {
        "component": "gpu",
        "version": "590.44.01",
        "kernel_release": KERNEL,
        "modules": list(components.modules_of("gpu")),
    }
    assert standin == packages.ModuleStandin(
        "nvidia_drm",
        "590.44.01",
        KERNEL,
        ("nvidia", "nvidia_modeset"),
        135168,
        parameters=(("modeset", "bool"),),  # what the real module's modinfo declares
    )


def test_packages_are_reproducible_byte_for_byte(tmp_path: Path) -> None:
    first = packaging.build_package(tmp_path / "a", "ofed", "24.10-1.1.4", KERNEL)
    second = packaging.build_package(tmp_path / "b", "ofed", "24.10-1.1.4", KERNEL)
    assert first.sha256 == second.sha256
    assert packaging.build_package(tmp_path, "ofed", "24.10-1.1.5", KERNEL).sha256 != first.sha256


def test_a_driver_source_indexes_its_archives(tmp_path: Path) -> None:
    built = packaging.build_driver_source(
        tmp_path, [("gpu", "580.159.04", KERNEL), ("gpu", "590.44.01", KERNEL)]
    )
    index = json.loads((tmp_path / "index.json").read_text())
    assert index == {"packages": [package.index_entry() for package in built]}
    assert index["packages"][1] == {
        "component": "gpu",
        "version": "590.44.01",
        "kernel_release": KERNEL,
        "sha256": built[1].sha256,
        "file": f"gpu-590.44.01-{KERNEL}.tar.gz",
        "parameters": built[1].parameters,  # what its modules declare
    }


def test_the_active_version_is_the_selected_one_else_the_newest(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    assert packages.active_version(root, KERNEL, "gpu") is None
    for version in ("580.159.10", "580.159.04", "590.1"):
        packages.install_standins(root, "gpu", version, KERNEL)
    (packages.component_dir(root, KERNEL, "gpu") / ".staging-590.2").mkdir()
    assert packages.installed_versions(root, KERNEL, "gpu") == (
        "580.159.04",
        "580.159.10",
        "590.1",
    )
    assert packages.active_version(root, KERNEL, "gpu") == "590.1"
    packages.select_version(root, KERNEL, "gpu", "580.159.04")
    assert packages.active_version(root, KERNEL, "gpu") == "580.159.04"


@pytest.mark.parametrize(
    "data", [b"\x7fELF\x02\x01", b"[]", b'{"format": "gpuop-module-standin/1", "name": "x"}']
)
def test_anything_but_a_stand_in_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError, match="stand-in"):
        packages.ModuleStandin.decode(data)
