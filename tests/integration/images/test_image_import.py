"""`make image`'s archives in containerd 2 (marked real_cluster: containerd, its runc shim and
ctr come from `make cluster-tools`; runc is Debian's): a private containerd (its own root,
state, sockets, no CRI) imports both archives into the kubelet's namespace under their names
and digests, and runs each image with runc: gpuop as user 10001 with the image's Python, the
NATS server as 1000."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import control_plane
from tests.support.images import build

pytestmark = [pytest.mark.real_cluster, pytest.mark.timeout(900)]

NAMESPACE = "k8s.io"
"""Where the kubelet's CRI looks for images."""
CONFIG = """version = 4
root = "{run}/root"
state = "{run}/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime",
  "io.containerd.cri.v1.images", "io.containerd.internal.v1.opt",
  "io.containerd.image-verifier.v1.bindir", "io.containerd.nri.v1.nri",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[plugins.'io.containerd.server.v1.grpc']
  address = "{run}/containerd.sock"
[plugins.'io.containerd.server.v1.ttrpc']
  address = "{run}/containerd.sock.ttrpc"
[plugins.'io.containerd.server.v1.debug']
  address = "{run}/debug.sock"
[plugins.'io.containerd.shim.v1.manager']
  socket_dir = "{shims}"
"""
"""A containerd of the test's own: CRI, /opt, NRI and tracing off; the shims' sockets in a
directory of at most 42 characters (containerd refuses longer), so not under pytest's."""


class Containerd:
    def __init__(self, run: Path) -> None:
        self.run = run
        self.ctr = str(control_plane.binary("ctr"))

    def __call__(self, *arguments: str, timeout: float = 300) -> str:
        answer = subprocess.run(
            [self.ctr, "--address", str(self.run / "containerd.sock"), "--namespace",
             NAMESPACE, *arguments],
            capture_output=True, text=True, timeout=timeout, check=False,
            env={"PATH": f"{control_plane.binary('containerd').parent}:/usr/sbin:/usr/bin"},
        )  # fmt: skip
        assert answer.returncode == 0, answer.stderr
        return answer.stdout

    def run_image(self, image: str, name: str, *command: str) -> str:
        return self(
            "run", "--rm", "--cgroup", "", "--fifo-dir", str(self.run / "fifo"),
            "--runc-root", str(self.run / "runc"), image, name, *command,
        )  # fmt: skip


def mounts_under(path: Path) -> list[str]:
    return [
        line.split()[1]
        for line in Path("/proc/self/mounts").read_text().splitlines()
        if line.split()[1].startswith(str(path))
    ]


@pytest.fixture
def containerd(tmp_path: Path) -> Iterator[Containerd]:
    binary = control_plane.binary("containerd")
    control_plane.binary("containerd-shim-runc-v2")
    assert shutil.which("runc"), "runc is missing: apt-get install runc"
    run = tmp_path / "containerd"
    run.mkdir()
    shims = Path(tempfile.mkdtemp(prefix="gpuop-shims-", dir="/tmp"))
    (run / "config.toml").write_text(CONFIG.format(run=run, shims=shims))
    with (run / "containerd.log").open("wb") as log:
        process = subprocess.Popen(
            [str(binary), "--config", str(run / "config.toml")],
            stdout=log, stderr=subprocess.STDOUT,
            env={"PATH": f"{binary.parent}:/usr/sbin:/usr/bin:/sbin:/bin"},
        )  # fmt: skip
    try:
        for _ in range(300):
            if (run / "containerd.sock").is_socket() or process.poll() is not None:
                break
            time.sleep(0.1)
        assert process.poll() is None, (run / "containerd.log").read_text()[-3000:]
        yield Containerd(run)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        left = mounts_under(run)
        for mount in reversed(left):
            subprocess.run(["umount", "-l", mount], check=False, timeout=30)
        shutil.rmtree(shims, ignore_errors=True)
        assert left == [], "containerd left mounts behind"


def test_containerd_imports_both_archives_and_runs_them(containerd: Containerd) -> None:
    images = [build.build_gpuop(), build.build_nats()]

    for built in images:
        containerd("images", "import", str(built.path))
    listed = containerd("images", "list", "--quiet")
    assert sorted(listed.split()) == sorted(built.name for built in images)
    for built in images:
        (row,) = [line for line in containerd("images", "list").splitlines()
                  if line.startswith(built.name + " ")]  # fmt: skip
        assert built.digest in row.split(), row

    gpuop, nats = images
    assert "usage: gpuop" in containerd.run_image(gpuop.name, "gpuop-help")
    where = containerd.run_image(
        gpuop.name, "gpuop-python", "python3.11", "-c",
        "import os, sys; print(os.getuid(), sys.executable)",
    )  # fmt: skip
    assert where.split() == ["10001", "/usr/bin/python3.11"]
    version = nats.name.rpartition(":")[2]
    assert f"v{version}" in containerd.run_image(
        nats.name, "nats-version", "/usr/local/bin/nats-server", "--version"
    )
