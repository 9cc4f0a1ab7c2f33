"""`gpuop sim host`: a simulated node's host root that an agent runs on by hand, made from
the recording; bad flags and a directory in use are refused and leave nothing behind."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.support.processes import gpuop


async def test_a_host_made_by_hand_is_what_discovery_sees(tmp_path: Path) -> None:
    root = tmp_path / "gpu-a"
    code, out, err = await gpuop(
        "sim", "host", str(root), "--node", "gpu-a", "--gpus", "2",
        "--kernel", "6.8.0-50-generic", "--driver", "580.200.01",
    )  # fmt: skip
    assert code == 0, err
    assert "2 x NVIDIA H200, driver 580.200.01 loaded, kernel 6.8.0-50-generic" in out
    assert f"gpuop run discovery --node gpu-a --host-root {root} --nvml sim:2" in out

    code, out, err = await gpuop(
        "discover", "--host-root", str(root), "--nvml", "sim:2", "--node", "gpu-a", "--json"
    )
    assert code == 0, err
    document = json.loads(out)
    assert len(document["inventory"]["gpus"]) == 2
    assert document["labels"]["nvidia.com/gpu.count"] == "2"
    assert document["labels"]["nvidia.com/cuda.driver-version.full"] == "580.200.01"
    assert (root / "proc/sys/kernel/osrelease").read_text().strip() == "6.8.0-50-generic"


async def test_without_a_driver_no_nvidia_module_is_loaded(tmp_path: Path) -> None:
    root = tmp_path / "bare"
    code, out, err = await gpuop("sim", "host", str(root), "--node", "bare", "--driver", "none")
    assert code == 0, err
    assert "no GPU driver" in out
    assert "nvidia " not in (root / "proc/modules").read_text()


async def test_bad_flags_and_a_used_directory_are_refused_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep").write_text("mine")
    cases = [
        ((str(tmp_path / "a"), "--node", "Bad_Name"), "invalid node name 'Bad_Name'"),
        ((str(tmp_path / "b"), "--node", "n", "--gpus", "65"), "1 to 64 GPUs, not 65"),
        ((str(tmp_path / "c"), "--node", "n", "--driver", "1; rm -rf"), "--driver '1; rm -rf'"),
        ((str(tmp_path / "d"), "--node", "n", "--kernel", "../x"), "--kernel '../x'"),
        ((str(used), "--node", "n"), "exists and is not an empty directory"),
    ]
    for args, message in cases:
        code, _, err = await gpuop("sim", "host", *args)
        assert (code, message in err) == (2, True), (args, err)
    assert sorted(os.listdir(tmp_path)) == ["used"]
    assert os.listdir(used) == ["keep"]
