"""`gpuop cdi generate` as an admin runs it on a host root: the spec on stdout or in a file
(the one it replaces kept), and clear errors where no driver is installed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuop.cli.main import main
from gpuop.host import cdi, system
from gpuop.host.roots import HostRoot
from tests.support import cdi as support
from tests.support.driver_manager import seed

VERSION = "580.159.04"


def installed(tmp_path: Path) -> HostRoot:
    root = seed(tmp_path / "host")
    release = system.kernel_release(root)
    assert release is not None
    support.install_userspace(root, support.manifest(VERSION, release))
    return root


def test_generate_prints_the_spec_of_the_installed_driver(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = installed(tmp_path)

    code = main(["cdi", "generate", "--host-root", str(root.path), "--nvml", "sim:4"])

    out = capsys.readouterr().out
    assert code == 0
    spec = json.loads(out)
    assert spec["kind"] == "nvidia.com/gpu"
    assert [d["name"] for d in spec["devices"]][::2][:4] == ["0", "1", "2", "3"]
    assert spec["devices"][-1]["name"] == "all"
    assert {m["containerPath"] for m in spec["containerEdits"]["mounts"]} >= {
        "/usr/bin/nvidia-smi",
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    }


def test_generate_writes_the_file_keeping_the_one_it_replaces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = installed(tmp_path)
    out = tmp_path / "cdi" / "nvidia.com-gpu.json"
    out.parent.mkdir()
    out.write_text("old\n")

    code = main(
        ["cdi", "generate", "--host-root", str(root.path), "--nvml", "sim:2", "--out", str(out)]
    )

    assert code == 0, capsys.readouterr().err
    assert json.loads(out.read_text())["cdiVersion"] == "0.5.0"
    assert cdi.previous_path(out).read_text() == "old\n"


def test_generate_on_a_host_root_without_a_driver_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = seed(tmp_path / "host")

    code = main(["cdi", "generate", "--host-root", str(root.path), "--nvml", "sim:2"])

    captured = capsys.readouterr()
    assert code == 1 and captured.out == ""
    assert captured.err.startswith("gpuop cdi generate: ")
    assert "opt/gpuop/gpu/current does not exist: no NVIDIA driver user space" in captured.err


def test_generate_with_nvml_failing_names_nvml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = installed(tmp_path)
    root.join("proc/modules").write_text("")  # the driver is not loaded

    code = main(["cdi", "generate", "--host-root", str(root.path), "--nvml", "sim:2"])

    assert code == 1
    assert "gpuop cdi generate: NVML cannot name the GPUs:" in capsys.readouterr().err


def test_generate_refuses_a_host_root_that_does_not_exist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["cdi", "generate", "--host-root", str(tmp_path / "none"), "--nvml", "sim:2"])

    assert code == 2
    assert "no such directory" in capsys.readouterr().err
