"""OCI archives (`tests.support.images.oci`): the layout the image spec requires (oci-layout,
index.json, every blob under blobs/sha256 named by its digest and of the size its descriptor
says), the spec's media types, the name containerd's import reads, and the same bytes twice."""

from __future__ import annotations

import gzip
import hashlib
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.support.images import oci
from tests.support.images.layers import MEDIA_TYPE, write_layer

EPOCH = 1_700_000_000


def image(tmp_path: Path, name: str = "gpuop.local/gpuop:0.1.0") -> oci.Image:
    layers = []
    for number, content in enumerate((b"base", b"app")):
        tree = tmp_path / f"tree{number}"
        (tree / "usr/bin").mkdir(parents=True, exist_ok=True)
        (tree / "usr/bin" / f"tool{number}").write_bytes(content)
        layers.append(write_layer(tree, tmp_path / f"layer{number}.tar.gz", EPOCH))
    return oci.Image(
        name=name,
        layers=tuple(layers),
        user="10001:10001",
        entrypoint=("gpuop",),
        cmd=("--help",),
        env=("PATH=/usr/bin",),
        epoch=EPOCH,
    )


def blob(files: dict[str, bytes], descriptor: dict[str, Any]) -> bytes:
    algorithm, _, hexdigest = descriptor["digest"].partition(":")
    content = files[f"blobs/{algorithm}/{hexdigest}"]
    assert algorithm == "sha256" and hashlib.sha256(content).hexdigest() == hexdigest
    assert len(content) == descriptor["size"], descriptor
    return content


def test_the_archive_is_an_oci_image_layout(tmp_path: Path) -> None:
    built = image(tmp_path)
    digest = oci.write_archive(built, tmp_path / "image.oci.tar")

    files = oci.read_archive(tmp_path / "image.oci.tar")
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads(files["index.json"])
    assert (index["schemaVersion"], index["mediaType"]) == (
        2, "application/vnd.oci.image.index.v1+json"
    )  # fmt: skip
    (entry,) = index["manifests"]
    assert entry["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert entry["digest"] == digest
    assert entry["platform"] == {"architecture": "amd64", "os": "linux"}
    assert entry["annotations"] == {
        "io.containerd.image.name": "gpuop.local/gpuop:0.1.0",
        "org.opencontainers.image.ref.name": "0.1.0",
    }
    manifest = json.loads(blob(files, entry))
    assert (manifest["schemaVersion"], manifest["mediaType"]) == (2, entry["mediaType"])
    assert manifest["config"]["mediaType"] == "application/vnd.oci.image.config.v1+json"
    config = json.loads(blob(files, manifest["config"]))
    assert [layer["mediaType"] for layer in manifest["layers"]] == [MEDIA_TYPE] * 2
    diff_ids = [
        f"sha256:{hashlib.sha256(gzip.decompress(blob(files, layer))).hexdigest()}"
        for layer in manifest["layers"]
    ]
    assert config["rootfs"] == {"type": "layers", "diff_ids": diff_ids}
    assert diff_ids == [layer.diff_id for layer in built.layers]
    assert (config["os"], config["architecture"]) == ("linux", "amd64")
    assert config["created"] == "2023-11-14T22:13:20Z"
    assert config["config"] == {
        "User": "10001:10001",
        "Entrypoint": ["gpuop"],
        "Cmd": ["--help"],
        "Env": ["PATH=/usr/bin"],
        "WorkingDir": "/",
    }
    blobs = {name for name in files if name.startswith("blobs/")}
    assert len(blobs) == 4, "manifest, config and two layers, nothing else"


def test_the_same_image_gives_the_same_archive(tmp_path: Path) -> None:
    first = oci.write_archive(image(tmp_path / "one"), tmp_path / "one.tar")
    second = oci.write_archive(image(tmp_path / "two"), tmp_path / "two.tar")

    assert first == second
    assert (tmp_path / "one.tar").read_bytes() == (tmp_path / "two.tar").read_bytes()
    with tarfile.open(tmp_path / "one.tar") as archive:
        members = archive.getmembers()
    assert {(m.uid, m.gid, m.mtime) for m in members} == {(0, 0, EPOCH)}


def test_another_name_or_layer_changes_what_it_should(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    base = oci.write_archive(image(tmp_path / "a"), tmp_path / "a.tar")
    other = image(tmp_path / "b", "gpuop.local/gpuop:0.2.0")
    renamed = oci.write_archive(other, tmp_path / "b.tar")
    assert renamed == base, "the name is the index's, not the manifest's"
    assert (tmp_path / "a.tar").read_bytes() != (tmp_path / "b.tar").read_bytes()

    (tmp_path / "c").mkdir()
    changed = image(tmp_path / "c")
    (tmp_path / "c/tree1/usr/bin/tool1").write_bytes(b"app, edited")
    layer = write_layer(tmp_path / "c/tree1", tmp_path / "c/edited.tar.gz", EPOCH)
    edited = oci.Image(**{**changed.__dict__, "layers": (changed.layers[0], layer)})
    assert oci.write_archive(edited, tmp_path / "c.tar") != base


def test_unpacking_lays_the_layers_over_each_other(tmp_path: Path) -> None:
    built = image(tmp_path)
    oci.write_archive(built, tmp_path / "image.oci.tar")

    config = oci.unpack(tmp_path / "image.oci.tar", tmp_path / "rootfs")
    assert config["config"]["Entrypoint"] == ["gpuop"]
    assert (tmp_path / "rootfs/usr/bin/tool0").read_bytes() == b"base"
    assert (tmp_path / "rootfs/usr/bin/tool1").read_bytes() == b"app"


@pytest.mark.parametrize("missing", ["oci-layout", "index.json"])
def test_an_archive_without_a_required_file_is_not_read_as_an_image(
    tmp_path: Path, missing: str
) -> None:
    oci.write_archive(image(tmp_path), tmp_path / "image.oci.tar")
    with tarfile.open(tmp_path / "image.oci.tar") as source, \
            tarfile.open(tmp_path / "broken.tar", "w") as broken:  # fmt: skip
        for member in source:
            if member.name != missing:
                broken.addfile(member, source.extractfile(member) if member.isfile() else None)
    with pytest.raises(oci.LayoutError, match=missing):
        oci.validate(tmp_path / "broken.tar")
    oci.validate(tmp_path / "image.oci.tar")
