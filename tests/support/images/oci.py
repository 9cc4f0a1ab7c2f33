"""OCI image archives: an image layout (`oci-layout`, `index.json`, `blobs/sha256/...`) in one
tar, as `ctr images import` and the OCI image spec read it, its bytes fixed by its content.

    Image(name, layers, user, entrypoint, cmd, env, epoch)   what the image is
    write_archive(image, path) -> str                        the archive; the manifest's digest
    read_archive(path) -> dict[str, bytes]                   its members (for checks)

The index names the image twice: `io.containerd.image.name` (the full reference, which
containerd's import uses) and `org.opencontainers.image.ref.name` (the tag, the spec's own).
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.support.images.layers import MEDIA_TYPE as LAYER_MEDIA_TYPE
from tests.support.images.layers import Layer

LAYOUT_VERSION = "1.0.0"
INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
NAME_ANNOTATION = "io.containerd.image.name"
REF_ANNOTATION = "org.opencontainers.image.ref.name"


@dataclass(frozen=True)
class Image:
    """An image to write: its reference `name` (`registry/repository:tag`), its layers
    bottom first, and the runtime configuration the OCI config carries."""

    name: str
    layers: tuple[Layer, ...]
    user: str
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    epoch: int = 0
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def tag(self) -> str:
        return self.name.rpartition(":")[2]


def canonical(document: dict[str, Any]) -> bytes:
    """JSON with sorted keys and no spaces: the same document, the same bytes."""
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def _descriptor(media_type: str, blob: bytes) -> dict[str, Any]:
    return {
        "mediaType": media_type,
        "digest": f"sha256:{hashlib.sha256(blob).hexdigest()}",
        "size": len(blob),
    }


def config(image: Image) -> bytes:
    created = datetime.fromtimestamp(image.epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    runtime: dict[str, Any] = {
        "User": image.user,
        "Entrypoint": list(image.entrypoint),
        "Env": list(image.env),
        "WorkingDir": "/",
    }
    if image.cmd:
        runtime["Cmd"] = list(image.cmd)
    if image.labels:
        runtime["Labels"] = dict(image.labels)
    return canonical(
        {
            "created": created,
            "architecture": "amd64",
            "os": "linux",
            "config": runtime,
            "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in image.layers]},
        }
    )


def manifest(image: Image, config_blob: bytes) -> bytes:
    return canonical(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": _descriptor(CONFIG, config_blob),
            "layers": [
                {"mediaType": LAYER_MEDIA_TYPE, "digest": layer.digest, "size": layer.size}
                for layer in image.layers
            ],
        }
    )


def index(image: Image, manifest_blob: bytes) -> bytes:
    entry = _descriptor(MANIFEST, manifest_blob)
    entry["platform"] = {"architecture": "amd64", "os": "linux"}
    entry["annotations"] = {NAME_ANNOTATION: image.name, REF_ANNOTATION: image.tag}
    return canonical({"schemaVersion": 2, "mediaType": INDEX, "manifests": [entry]})


def _add(archive: tarfile.TarFile, name: str, size: int, epoch: int, content: Any) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, epoch, 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    archive.addfile(info, content)


def _blob_name(digest: str) -> str:
    algorithm, _, hexdigest = digest.partition(":")
    return f"blobs/{algorithm}/{hexdigest}"


def write_archive(image: Image, path: Path) -> str:
    """Write `image` as an OCI layout tar to `path`; the digest of its manifest (the image's
    digest as containerd reports it)."""
    config_blob = config(image)
    manifest_blob = manifest(image, config_blob)
    index_blob = index(image, manifest_blob)
    blobs: dict[str, tuple[int, Path | bytes]] = {
        _descriptor(CONFIG, config_blob)["digest"]: (len(config_blob), config_blob),
        _descriptor(MANIFEST, manifest_blob)["digest"]: (len(manifest_blob), manifest_blob),
    }
    for layer in image.layers:
        blobs[layer.digest] = (layer.size, layer.path)
    layout = canonical({"imageLayoutVersion": LAYOUT_VERSION})
    partial = path.with_name(path.name + ".partial")
    with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as archive:
        for directory in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, image.epoch
            archive.addfile(info)
        for digest in sorted(blobs):
            size, content = blobs[digest]
            if isinstance(content, bytes):
                _add(archive, _blob_name(digest), size, image.epoch, io.BytesIO(content))
            else:
                with content.open("rb") as stream:
                    _add(archive, _blob_name(digest), size, image.epoch, stream)
        _add(archive, "index.json", len(index_blob), image.epoch, io.BytesIO(index_blob))
        _add(archive, "oci-layout", len(layout), image.epoch, io.BytesIO(layout))
    partial.replace(path)
    return str(_descriptor(MANIFEST, manifest_blob)["digest"])


class LayoutError(Exception):
    """An archive that is not an OCI image layout of one image."""


def _check_blob(files: dict[str, bytes], descriptor: dict[str, Any], media_type: str) -> bytes:
    name = _blob_name(descriptor["digest"])
    if descriptor.get("mediaType") != media_type:
        raise LayoutError(f"{name}: media type {descriptor.get('mediaType')}, not {media_type}")
    if name not in files:
        raise LayoutError(f"{name}: missing")
    content = files[name]
    if f"sha256:{hashlib.sha256(content).hexdigest()}" != descriptor["digest"]:
        raise LayoutError(f"{name}: its content is not its digest's")
    if len(content) != descriptor["size"]:
        raise LayoutError(f"{name}: {len(content)} bytes, not {descriptor['size']}")
    return content


def validate(path: Path) -> dict[str, Any]:
    """Check the archive as the OCI image layout spec requires (oci-layout, index.json, each
    referenced blob present with its digest and size, the spec's media types); its index."""
    files = read_archive(path)
    for required in ("oci-layout", "index.json"):
        if required not in files:
            raise LayoutError(f"{required}: missing, and an image layout requires it")
    if json.loads(files["oci-layout"]).get("imageLayoutVersion") != LAYOUT_VERSION:
        raise LayoutError(f"oci-layout: not version {LAYOUT_VERSION}")
    index_document: dict[str, Any] = json.loads(files["index.json"])
    if index_document.get("schemaVersion") != 2 or index_document.get("mediaType") != INDEX:
        raise LayoutError("index.json: not an image index of schema version 2")
    for entry in index_document["manifests"]:
        manifest_document = json.loads(_check_blob(files, entry, MANIFEST))
        _check_blob(files, manifest_document["config"], CONFIG)
        for layer in manifest_document["layers"]:
            _check_blob(files, layer, LAYER_MEDIA_TYPE)
    return index_document


def read_archive(path: Path, *, blobs: bool = True) -> dict[str, bytes]:
    """The archive's files by name; layer blobs too unless `blobs` is false (then only the
    JSON documents: index, layout, manifests and configs are small)."""
    found: dict[str, bytes] = {}
    with tarfile.open(path) as archive:
        for member in archive:
            if not member.isfile():
                continue
            stream = archive.extractfile(member)
            assert stream is not None
            if blobs or member.size < 1 << 20:
                found[member.name] = stream.read()
    return found


def unpack(path: Path, rootfs: Path) -> dict[str, Any]:
    """Extract the archive's image, layer over layer, into `rootfs` (for a chroot); its
    config."""
    documents = read_archive(path, blobs=False)
    (entry,) = json.loads(documents["index.json"])["manifests"]
    manifest_document = json.loads(documents[_blob_name(entry["digest"])])
    with tarfile.open(path) as archive:
        for layer in manifest_document["layers"]:
            stream = archive.extractfile(_blob_name(layer["digest"]))
            assert stream is not None
            with tarfile.open(fileobj=stream, mode="r|gz") as layer_archive:
                layer_archive.extractall(rootfs, filter="tar")
    config_name = _blob_name(manifest_document["config"]["digest"])
    document: dict[str, Any] = json.loads(documents[config_name])
    return document
