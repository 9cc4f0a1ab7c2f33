"""The `nvidia` handler's drop-ins (`gpuop.host.runtimes`) read by the real containerd:
Debian's 1.6 (`apt-get install -y --no-install-recommends containerd`, marker `slow`) and
2.x built from its Go module by `make cluster-tools` (marker `real_cluster`). Each runs
`containerd --config <main config> config dump`, which loads the main config and its
imports without a daemon, and the merged result must show the handler and the main
config's own settings; 2.x must also show CDI (1.6 has none: the plan says so).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from gpuop.host import runtimes
from gpuop.host.roots import HostRoot
from gpuop.host.runtimes import Runtime

REPO = Path(__file__).resolve().parents[3]
TOOLS = Path(os.environ.get("GPUOP_CLUSTER_TOOLS", REPO / ".cache" / "cluster-tools"))


def debian_containerd() -> Path:
    found = shutil.which("containerd")
    if found is None:
        pytest.fail(
            "no containerd on PATH: install Debian's "
            "(apt-get install -y --no-install-recommends containerd)"
        )
    return Path(found)


def built_containerd() -> Path:
    path = TOOLS / "bin" / "containerd"
    if not os.access(path, os.X_OK):
        pytest.fail(
            f"{path} is missing: build it with `make cluster-tools` "
            "(containerd 2.x from its Go module; needs Go 1.26, see DEVELOPERS.md)"
        )
    return path


def host_root(directory: Path, binary: Path, main_config: str) -> HostRoot:
    """A host root whose containerd is `binary` (a wrapper script, as the host's own binary
    would answer `--version`) with `main_config` as its main config."""
    root = HostRoot(directory)
    config = root.join(runtimes.CONTAINERD_CONFIG)
    config.parent.mkdir(parents=True)
    config.write_text(main_config)
    wrapper = root.join("usr/bin/containerd")
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text(f'#!/bin/sh\nexec {binary} "$@"\n')
    wrapper.chmod(0o755)
    return root


def default_config(binary: Path) -> str:
    return run(binary, "config", "default")


def dump(binary: Path, root: HostRoot) -> dict[str, Any]:
    text = run(binary, "--config", str(root.join(runtimes.CONTAINERD_CONFIG)), "config", "dump")
    return tomllib.loads(text)


def run(binary: Path, *args: str) -> str:
    done = subprocess.run(
        [str(binary), *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, f"{binary} {' '.join(args)}: {done.stderr}"
    return done.stdout


@pytest.mark.slow
def test_debian_containerd_16_loads_the_handler_and_keeps_the_main_cri_table(
    tmp_path: Path,
) -> None:
    binary = debian_containerd()
    main = default_config(binary).replace('bin_dir = "/opt/cni/bin"', 'bin_dir = "/usr/lib/cni"')
    root = host_root(tmp_path, binary, main)
    planned = runtimes.plan(root, Runtime.CONTAINERD)
    assert planned.config_version == 2
    assert planned.runtime_version is not None and planned.runtime_version.startswith("1.6")
    assert any("no CDI" in note for note in planned.notes)
    runtimes.apply(root, planned)

    merged = dump(binary, root)
    assert str(root.join(runtimes.CONTAINERD_DROP_IN)) in merged["imports"]
    cri = merged["plugins"]["io.containerd.grpc.v1.cri"]
    handlers = cri["containerd"]["runtimes"]
    assert handlers["nvidia"]["runtime_type"] == "io.containerd.runc.v2"
    # the import replaced the whole CRI table: what the main config set must be in it
    assert "runc" in handlers
    assert cri["cni"]["bin_dir"] == "/usr/lib/cni"
    assert cri["containerd"]["default_runtime_name"] == "runc"
    assert not runtimes.plan(root, Runtime.CONTAINERD).changed


@pytest.mark.slow
def test_debian_containerd_refuses_a_broken_drop_in_that_undo_then_removes(
    tmp_path: Path,
) -> None:
    binary = debian_containerd()
    root = host_root(tmp_path, binary, default_config(binary))
    planned = runtimes.plan(root, Runtime.CONTAINERD)
    runtimes.apply(root, planned)
    root.join(runtimes.CONTAINERD_DROP_IN).write_text("[plugins\n")
    config = str(root.join(runtimes.CONTAINERD_CONFIG))
    broken = subprocess.run(
        [str(binary), "--config", config, "config", "dump"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert broken.returncode != 0
    runtimes.undo(root, planned)
    assert (
        "nvidia"
        not in dump(binary, root)["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
    )


@pytest.mark.real_cluster
@pytest.mark.parametrize("main_from", ["containerd 2.x default", "Debian's version 2"])
def test_containerd_2x_loads_the_version_3_handler_with_cdi(tmp_path: Path, main_from: str) -> None:
    binary = built_containerd()
    if main_from == "Debian's version 2":
        main = default_config(debian_containerd())
    else:
        # 2.x's default imports /etc/containerd/conf.d/*.toml, outside this host root
        lines = default_config(binary).splitlines(keepends=True)
        main = "".join(line for line in lines if not line.startswith("imports"))
    root = host_root(tmp_path, binary, main)
    planned = runtimes.plan(root, Runtime.CONTAINERD)
    assert (planned.config_version, planned.notes) == (3, ())
    runtimes.apply(root, planned)

    merged = dump(binary, root)
    assert runtimes.CONTAINERD_DROP_IN.removeprefix("etc/containerd/") in merged["imports"]
    cri = merged["plugins"]["io.containerd.cri.v1.runtime"]
    assert cri["containerd"]["runtimes"]["nvidia"]["runtime_type"] == "io.containerd.runc.v2"
    assert "runc" in cri["containerd"]["runtimes"]
    assert cri["cdi_spec_dirs"] == list(runtimes.CDI_SPEC_DIRS)
    assert cri.get("enable_cdi", True) is True
    assert not runtimes.plan(root, Runtime.CONTAINERD).changed
