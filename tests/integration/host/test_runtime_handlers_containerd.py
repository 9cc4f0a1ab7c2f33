"""Discovery's reading of containerd's configuration (`gpuop.host.runtime_handlers`) agrees
with Debian's containerd 1.6 itself (`apt-get install -y --no-install-recommends
containerd`; `.ci/run` installs it for the slow suite): for each configuration below,
`containerd --config <main> config dump`, run from the host root as its working directory
(systemd runs it from `/`), shows the `nvidia` handler exactly when the reader says so, and
refuses the configuration exactly when the reader reports an error."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gpuop.host import runtime_handlers
from gpuop.host.roots import HostRoot
from tests.support import container_runtimes as files

pytestmark = pytest.mark.slow

CNI_ONLY = '[plugins."io.containerd.grpc.v1.cri".cni]\n  bin_dir = "/opt/cni/bin"\n'

CASES = {
    "imported by name": (
        'version = 2\nimports = ["conf.d/99-nvidia.toml"]\n',
        {files.CONTAINERD_DROP_IN: files.CONTAINERD_DROP_IN_V2},
    ),
    "relative glob, drop-in in /etc": (
        'version = 2\nimports = ["conf.d/*.toml"]\n',
        {files.CONTAINERD_DROP_IN: files.CONTAINERD_DROP_IN_V2},
    ),
    "relative glob, drop-in in /conf.d": (
        'version = 2\nimports = ["conf.d/*.toml"]\n',
        {"conf.d/99-nvidia.toml": files.CONTAINERD_DROP_IN_V2},
    ),
    "a later import replaces the CRI table": (
        'version = 2\nimports = ["conf.d/99-nvidia.toml", "conf.d/zz-cni.toml"]\n',
        {
            files.CONTAINERD_DROP_IN: files.CONTAINERD_DROP_IN_V2,
            "etc/containerd/conf.d/zz-cni.toml": CNI_ONLY,
        },
    ),
    "not imported": (
        'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "pause:3.9"\n',
        {files.CONTAINERD_DROP_IN: files.CONTAINERD_DROP_IN_V2},
    ),
    "handler in the main config": (files.CONTAINERD_DROP_IN_V2, {}),
    "missing import": ('version = 2\nimports = ["conf.d/99-nvidia.toml"]\n', {}),
    "drop-in that does not parse": (
        'version = 2\nimports = ["conf.d/99-nvidia.toml"]\n',
        {files.CONTAINERD_DROP_IN: "[plugins.\n"},
    ),
}


def debian_containerd() -> str:
    found = shutil.which("containerd")
    if found is None:
        pytest.fail(
            "no containerd on PATH: install Debian's "
            "(apt-get install -y --no-install-recommends containerd)"
        )
    return found


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_reader_agrees_with_containerd_1_6(case: str, tmp_path: Path) -> None:
    binary = debian_containerd()
    main, others = CASES[case]
    root = HostRoot(tmp_path)
    files.write(root, runtime_handlers.DPKG_STATUS, files.DPKG_CONTAINERD)
    files.write(root, files.CONTAINERD_MAIN, main)
    for relative, text in others.items():
        files.write(root, relative, text)

    dump = subprocess.run(
        [binary, "--config", str(root.join(files.CONTAINERD_MAIN)), "config", "dump"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    [state] = runtime_handlers.runtimes(root)

    refused = "failed to load TOML" in dump.stderr
    has_handler = ".containerd.runtimes.nvidia]" in dump.stdout
    assert (state.error is not None, state.nvidia_handler) == (refused, has_handler), (
        f"{case}: containerd says refused={refused} handler={has_handler}\n{dump.stderr}"
    )
    assert state.version == "1.6.20~ds1-1+deb12u3"
    if state.error is None:
        assert state.cdi_enabled is False  # 1.6 has no CDI, whatever the drop-in says
