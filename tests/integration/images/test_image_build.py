"""`make image` for real (marked slow: it builds both images twice from Debian's packages and
the locked wheels, about three minutes on two cores): the two builds give the same digests and
bytes, each archive is a valid OCI layout, and the gpuop image's root file system, run with
this machine's chroot as the image's user, runs `gpuop --help` with the image's own Python,
imports every compiled dependency, and has what the chart's init container runs; the NATS
image's nats-server runs as its user. The .debs and wheels are fetched once into
.cache/images (they are checked inputs); every layer is made anew in each build."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.images import build, oci

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

IMPORTS = (
    "grpc, google._upb._message, cryptography.hazmat.primitives.asymmetric.ed25519, "
    "pydantic_core, yaml, aiohttp, frozenlist, multidict, yarl, bcrypt, ssl, sqlite3, "
    "decimal, kubernetes, pynvml, pyroute2, nats, prometheus_client"
)


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, build.Built]]:
    made = []
    for attempt in ("first", "second"):
        cache = tmp_path_factory.mktemp(attempt)
        made.append(
            {
                "gpuop": build.build_gpuop(cache, downloads=build.CACHE),
                "nats": build.build_nats(cache, downloads=build.CACHE),
            }
        )
        assert build.prune(cache, list(made[-1].values())) == [], "every layer made is used"
    return made


def rootfs_of(built: build.Built, tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    assert os.geteuid() == 0, "running the image's root file system needs chroot: run as root"
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    return rootfs, oci.unpack(built.path, rootfs)["config"]


def run_in(rootfs: Path, config: dict[str, Any], *command: str) -> str:
    answer = subprocess.run(
        ["chroot", f"--userspec={config['User']}", str(rootfs), *command],
        env=dict(variable.split("=", 1) for variable in config["Env"]),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert answer.returncode == 0, answer.stderr
    return answer.stdout


def test_two_builds_give_the_same_images(builds: list[dict[str, build.Built]]) -> None:
    first, second = builds
    for name in ("gpuop", "nats"):
        assert first[name].digest == second[name].digest, name
        assert first[name].path.read_bytes() == second[name].path.read_bytes(), name
    assert first["gpuop"].name == f"gpuop.local/gpuop:{build.version()}"
    assert first["nats"].name.startswith("gpuop.local/nats:2.")


def test_each_archive_is_an_oci_layout_naming_its_image(
    builds: list[dict[str, build.Built]],
) -> None:
    for built in builds[0].values():
        (entry,) = oci.validate(built.path)["manifests"]
        assert entry["annotations"][oci.NAME_ANNOTATION] == built.name
        assert entry["digest"] == built.digest


def test_gpuop_runs_with_the_image_s_python_as_its_user(
    builds: list[dict[str, build.Built]], tmp_path: Path
) -> None:
    rootfs, config = rootfs_of(builds[0]["gpuop"], tmp_path)
    assert (config["User"], config["Entrypoint"]) == ("10001:10001", ["gpuop"])

    assert "usage: gpuop" in run_in(rootfs, config, *config["Entrypoint"], *config["Cmd"])
    where = run_in(
        rootfs, config, "python3.11", "-c",
        "import os, sys, gpuop; print(os.getuid(), sys.executable, sys.version_info[:2], "
        f"gpuop.__file__); import {IMPORTS}",
    )  # fmt: skip
    assert where.split() == [
        "10001",
        "/usr/bin/python3.11",
        "(3,",
        "11)",
        "/usr/local/lib/python3.11/dist-packages/gpuop/__init__.py",
    ]
    assert (rootfs / "usr/bin/python3.11").is_file() and not (rootfs / "usr/local/bin/pip").exists()
    site = rootfs / "usr/local/lib/python3.11/dist-packages"
    assert not list(site.glob("gpuop*sim*")), "the product's image holds no simulation"


def test_the_chart_s_init_command_finds_the_ca_bundle(
    builds: list[dict[str, build.Built]], tmp_path: Path
) -> None:
    rootfs, config = rootfs_of(builds[0]["gpuop"], tmp_path)

    bundle = run_in(rootfs, config, "sh", "-c", "cat /etc/ssl/certs/ca-certificates.crt")
    assert bundle.count("BEGIN CERTIFICATE") > 100
    assert "ID=debian" in (rootfs / "etc/os-release").read_text()
    assert "Package: python3.11-minimal" in (rootfs / "var/lib/dpkg/status").read_text()


def test_the_nats_server_runs_as_its_user(
    builds: list[dict[str, build.Built]], tmp_path: Path
) -> None:
    rootfs, config = rootfs_of(builds[0]["nats"], tmp_path)

    assert config["User"] == "1000:1000"
    version = builds[0]["nats"].name.rpartition(":")[2]
    assert f"v{version}" in run_in(rootfs, config, *config["Entrypoint"], "--version")
