"""The GPU driver's control device nodes, made under a host root as NVIDIA's toolkit makes
them: `nvidiactl` and `nvidia-modeset` on NVIDIA's major, the unified memory pair on the major
the kernel lists for `nvidia-uvm`, and only while it lists it; a right node is kept, a wrong
one replaced, and a node that cannot be made is an error naming it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gpuop.host import devnodes
from gpuop.host.roots import HostRoot
from gpuop_sim.host.simkernel import SimKernel


@pytest.fixture(autouse=True)
def _root() -> None:
    """mknod needs CAP_MKNOD: the suite runs as root (CI does); elsewhere this fails, not skips."""
    if os.geteuid() != 0:
        pytest.fail("these tests make device nodes with mknod: run the suite as root")


def numbers(root: HostRoot) -> dict[str, tuple[int, int, int]]:
    """Every character device under the root's dev/: its major, minor and mode."""
    found = {}
    for path in sorted(root.join("dev").iterdir()):
        info = path.lstat()
        assert stat.S_ISCHR(info.st_mode), path
        found[path.name] = (os.major(info.st_rdev), os.minor(info.st_rdev), info.st_mode & 0o777)
    return found


def test_the_loaded_driver_gets_its_control_nodes_as_nvidias_toolkit_makes_them(
    seeded: HostRoot,
) -> None:
    made = devnodes.create(seeded)

    assert made == (
        "/dev/nvidiactl",
        "/dev/nvidia-modeset",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    )
    assert numbers(seeded) == {
        "nvidiactl": (195, 255, 0o666),
        "nvidia-modeset": (195, 254, 0o666),
        "nvidia-uvm": (235, 0, 0o666),  # the major the simulated kernel lists
        "nvidia-uvm-tools": (235, 1, 0o666),
    }


def test_the_uvm_pair_waits_for_the_kernel_to_list_its_major(seeded: HostRoot) -> None:
    SimKernel(seeded).rmmod("nvidia_uvm")
    assert "nvidia-uvm" not in devnodes.character_majors(seeded)

    devnodes.create(seeded)

    assert set(numbers(seeded)) == {"nvidiactl", "nvidia-modeset"}


def test_a_right_node_is_kept_and_a_wrong_one_replaced(seeded: HostRoot) -> None:
    devnodes.create(seeded)
    kept = seeded.join("dev/nvidiactl").stat().st_ino
    seeded.join("dev/nvidia-uvm").unlink()
    seeded.join("dev/nvidia-uvm").write_text("not a device\n")
    os.unlink(seeded.join("dev/nvidia-uvm-tools"))
    os.mknod(seeded.join("dev/nvidia-uvm-tools"), stat.S_IFCHR | 0o600, os.makedev(235, 7))

    made = devnodes.create(seeded)

    assert made == ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
    assert seeded.join("dev/nvidiactl").stat().st_ino == kept
    assert numbers(seeded)["nvidia-uvm"] == (235, 0, 0o666)
    assert numbers(seeded)["nvidia-uvm-tools"] == (235, 1, 0o666)


def test_a_node_that_cannot_be_made_is_an_error_naming_it(seeded: HostRoot) -> None:
    seeded.join("dev").write_text("a file where dev/ should be\n")

    with pytest.raises(devnodes.DeviceNodeError, match=r"dev/nvidiactl \(c 195 255\)"):
        devnodes.create(seeded)


def test_proc_devices_is_read_by_section(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/devices").write_text(
        "Character devices:\n  1 mem\n195 nvidia\n511 nvidia-uvm\n\nBlock devices:\n"
        "  7 loop\n259 nvidia-uvm\n"
    )

    assert devnodes.character_majors(root) == {"mem": 1, "nvidia": 195, "nvidia-uvm": 511}
