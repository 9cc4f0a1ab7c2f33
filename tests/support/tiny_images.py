"""The real node's own images, made without a registry or a builder: Debian's static busybox
(`busybox-static`) in one uncompressed layer, written as an OCI image layout tarball that
`ctr images import` reads. Reproducible: fixed mtimes and owners, sorted entries, so the
same busybox gives the same digests.

Two images share the layer: `PAUSE` (the pod sandbox: a shell that waits until SIGTERM) and
`BUSYBOX` (no entrypoint; a pod names its command).
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BUSYBOX_BINARY = Path("/bin/busybox")
"""Debian's `busybox-static` installs its one static binary here."""
PAUSE = "gpuop.invalid/pause:busybox"
BUSYBOX = "gpuop.invalid/busybox:static"
PAUSE_COMMAND = ["/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"]
"""The sandbox's process: the pod's first one, gone at the first SIGTERM."""
APPLETS = ("sh", "sleep", "echo", "cat", "ls", "env", "nslookup", "wget", "hostname", "true")
LAYER_MEDIA = "application/vnd.oci.image.layer.v1.tar"
MANIFEST_MEDIA = "application/vnd.oci.image.manifest.v1+json"
CONFIG_MEDIA = "application/vnd.oci.image.config.v1+json"
_MTIME = 0


class ImageError(RuntimeError):
    """An image cannot be made: its busybox is missing."""


@dataclass(frozen=True)
class Blob:
    data: bytes

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.data).hexdigest()

    def descriptor(self, media: str, **extra: Any) -> dict[str, Any]:
        return {"mediaType": media, "digest": self.digest, "size": len(self.data), **extra}


def busybox_layer(busybox: Path = BUSYBOX_BINARY) -> bytes:
    """One tar layer: busybox at /bin/busybox, its applets as symlinks beside it, and the
    empty directories a container's mounts land on."""
    if not busybox.is_file():
        raise ImageError(
            f"{busybox} is missing: install Debian's busybox-static "
            "(apt-get install busybox-static)"
        )
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("bin", "dev", "etc", "proc", "sys", "tmp", "var", "var/run"):
            tar.addfile(_entry(directory, tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755))
        data = busybox.read_bytes()
        binary = _entry("bin/busybox", tarfile.REGTYPE, 0o755)
        binary.size = len(data)
        tar.addfile(binary, io.BytesIO(data))
        for applet in sorted(APPLETS):
            link = _entry(f"bin/{applet}", tarfile.SYMTYPE, 0o777)
            link.linkname = "busybox"
            tar.addfile(link)
    return out.getvalue()


def _entry(name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.mtime = _MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def write_archive(path: Path, busybox: Path = BUSYBOX_BINARY) -> Path:
    """The OCI image layout tarball with `PAUSE` and `BUSYBOX`, each named by the
    annotation containerd's import reads."""
    layer = Blob(busybox_layer(busybox))
    blobs: dict[str, bytes] = {layer.digest: layer.data}
    manifests = []
    for name, entrypoint in ((PAUSE, PAUSE_COMMAND), (BUSYBOX, None)):
        settings: dict[str, Any] = {"Env": ["PATH=/bin"], "Cmd": ["sh"]}
        if entrypoint is not None:
            settings = {"Env": ["PATH=/bin"], "Entrypoint": entrypoint}
        config = Blob(
            _json(
                {
                    "architecture": "amd64",
                    "os": "linux",
                    "config": settings,
                    "rootfs": {"type": "layers", "diff_ids": [layer.digest]},
                }
            )
        )
        manifest = Blob(
            _json(
                {
                    "schemaVersion": 2,
                    "mediaType": MANIFEST_MEDIA,
                    "config": config.descriptor(CONFIG_MEDIA),
                    "layers": [layer.descriptor(LAYER_MEDIA)],
                }
            )
        )
        blobs[config.digest] = config.data
        blobs[manifest.digest] = manifest.data
        manifests.append(
            manifest.descriptor(
                MANIFEST_MEDIA,
                annotations={
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
                },
            )
        )
    index = _json(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": manifests,
        }
    )
    files = {"oci-layout": _json({"imageLayoutVersion": "1.0.0"}), "index.json": index}
    for digest, data in blobs.items():
        files[f"blobs/sha256/{digest.removeprefix('sha256:')}"] = data
    with tarfile.open(path, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("blobs", "blobs/sha256"):
            tar.addfile(_entry(directory, tarfile.DIRTYPE, 0o755))
        for name in sorted(files):
            info = _entry(name, tarfile.REGTYPE, 0o644)
            info.size = len(files[name])
            tar.addfile(info, io.BytesIO(files[name]))
    return path


def _json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
