"""The real node's launcher where it must fail clearly without the built tools, and the tiny
images it imports: one layer of busybox, the same bytes every time, named as containerd's
import reads them."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from tests.support import control_plane, real_node, tiny_images
from tests.support.control_plane import ControlPlane
from tests.support.real_node import RealNode, RealNodeError


def test_missing_node_tools_say_how_to_build_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(control_plane, "BIN", tmp_path / "empty")

    absent = real_node.missing()

    for name in real_node.BINARIES:
        assert f"{name} (make cluster-tools)" in absent


def test_a_node_without_its_tools_refuses_to_start_and_touches_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(control_plane, "BIN", tmp_path / "empty")
    node = RealNode(ControlPlane(tmp_path / "plane"), tmp_path / "node")

    with pytest.raises(RealNodeError, match=r"kubelet \(make cluster-tools\)"), node:
        pass

    assert not node.work.exists()
    assert node.components == []


def fake_busybox(tmp_path: Path) -> Path:
    path = tmp_path / "busybox"
    path.write_bytes(b"\x7fELF not really busybox")
    return path


def members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {
            m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }


def test_the_image_archive_is_the_same_bytes_every_time(tmp_path: Path) -> None:
    busybox = fake_busybox(tmp_path)

    first = tiny_images.write_archive(tmp_path / "a.tar", busybox).read_bytes()
    second = tiny_images.write_archive(tmp_path / "b.tar", busybox).read_bytes()

    assert first == second


def test_the_archive_names_both_images_over_one_busybox_layer(tmp_path: Path) -> None:
    files = members(tiny_images.write_archive(tmp_path / "images.tar", fake_busybox(tmp_path)))
    index = json.loads(files["index.json"])
    names = {m["annotations"]["io.containerd.image.name"]: m for m in index["manifests"]}

    assert set(names) == {tiny_images.PAUSE, tiny_images.BUSYBOX}
    layers = set()
    for descriptor in names.values():
        manifest = json.loads(files[f"blobs/sha256/{descriptor['digest'][7:]}"])
        (layer,) = manifest["layers"]
        layers.add(layer["digest"])
        config = json.loads(files[f"blobs/sha256/{manifest['config']['digest'][7:]}"])
        assert config["rootfs"]["diff_ids"] == [layer["digest"]]
    (digest,) = layers
    with tarfile.open(fileobj=io.BytesIO(files[f"blobs/sha256/{digest[7:]}"])) as layer_tar:
        entries = {m.name: m for m in layer_tar.getmembers()}
    assert entries["bin/busybox"].isfile()
    assert entries["bin/sh"].issym() and entries["bin/sh"].linkname == "busybox"


def test_no_busybox_names_the_debian_package(tmp_path: Path) -> None:
    with pytest.raises(tiny_images.ImageError, match="busybox-static"):
        tiny_images.write_archive(tmp_path / "images.tar", tmp_path / "nothing")
