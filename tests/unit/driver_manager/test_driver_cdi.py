"""The node's CDI spec is a step of every GPU driver load and rollback: the load writes it for
the version now in use (keeping the one it replaced), the rollback puts the kept one back byte
for byte, a version without user space leaves no spec naming another version's libraries, and
a spec that cannot be made fails the load with the reason."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import cast

import pytest

from gpuop.clocks import VirtualClock
from gpuop.events import Event
from gpuop.events import driver as dm
from gpuop.host import cdi, packages
from gpuop.host.roots import HostRoot
from gpuop.nvml import Nvml, open_backend
from gpuop.services.driver_manager.cdi import SpecFailed, SpecWriter
from tests.support import cdi as support
from tests.support.driver_manager import KERNEL, NEW, OLD, Harness, source_of

GPU = dm.Component.GPU


def spec_of(root: HostRoot) -> bytes:
    return cdi.spec_path(root).read_bytes()


def mounted_version(root: HostRoot) -> str | None:
    return cdi.driver_version_of(spec_of(root))


async def load(harness: Harness, version: str) -> Event:
    await harness.send(dm.UnloadDriver(component=GPU))
    return await harness.send(dm.LoadDriver(component=GPU, version=version))


async def new_with_userspace(harness: Harness, host: HostRoot, source: Path) -> None:
    """OLD runs with its user space and spec; NEW is installed with its user space."""
    support.install_userspace(host, support.manifest(OLD, KERNEL))
    assert isinstance(await load(harness, OLD), dm.DriverLoaded)
    installed = await harness.send(
        dm.InstallDriver(component=GPU, version=NEW, source=source_of(source))
    )
    assert isinstance(installed, dm.DriverInstalled), installed
    support.install_userspace(host, support.manifest(NEW, KERNEL), current=False)


async def test_a_load_writes_the_spec_of_the_version_in_use_and_keeps_the_one_before(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    await new_with_userspace(harness, host, source)
    before = spec_of(host)
    assert mounted_version(host) == OLD

    loaded = await load(harness, NEW)

    assert isinstance(loaded, dm.DriverLoaded), loaded
    assert mounted_version(host) == NEW
    assert cdi.previous_path(cdi.spec_path(host)).read_bytes() == before
    spec = json.loads(spec_of(host))
    names = [device["name"] for device in spec["devices"]]
    assert names[:2] == ["0", names[1]] and names[1].startswith("GPU-")
    assert len(names) == 8 * 2 + 1 and names[-1] == "all"
    paths = {m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    assert f"/opt/gpuop/gpu/{NEW}/lib/libcuda.so.1" in paths


async def test_a_rollback_restores_the_previous_spec_byte_for_byte(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    await new_with_userspace(harness, host, source)
    before = spec_of(host)
    assert isinstance(await load(harness, NEW), dm.DriverLoaded)
    assert spec_of(host) != before

    rolled = await harness.send(dm.RollbackDriver(component=GPU, version=OLD))

    assert isinstance(rolled, dm.DriverRolledBack), rolled
    assert spec_of(host) == before


async def test_a_rollback_without_a_kept_spec_of_its_version_writes_one(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    await new_with_userspace(harness, host, source)
    assert isinstance(await load(harness, NEW), dm.DriverLoaded)
    cdi.previous_path(cdi.spec_path(host)).unlink()

    rolled = await harness.send(dm.RollbackDriver(component=GPU, version=OLD))

    assert isinstance(rolled, dm.DriverRolledBack), rolled
    assert mounted_version(host) == OLD


async def test_a_version_without_user_space_leaves_no_spec_of_another_version(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    support.install_userspace(host, support.manifest(OLD, KERNEL))
    assert isinstance(await load(harness, OLD), dm.DriverLoaded)
    before = spec_of(host)
    await harness.send(dm.InstallDriver(component=GPU, version=NEW, source=source_of(source)))

    loaded = await load(harness, NEW)  # a format 1 package: no user space

    assert isinstance(loaded, dm.DriverLoaded), loaded
    assert not cdi.spec_path(host).exists()
    assert cdi.previous_path(cdi.spec_path(host)).read_bytes() == before
    rolled = await harness.send(dm.RollbackDriver(component=GPU, version=OLD))
    assert isinstance(rolled, dm.DriverRolledBack), rolled
    assert spec_of(host) == before


async def test_a_broken_manifest_fails_the_load_naming_it(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    await new_with_userspace(harness, host, source)
    manifest = packages.package_dir(host, KERNEL, "gpu", NEW) / "manifest.json"
    manifest.write_text("{")

    failed = await load(harness, NEW)

    assert isinstance(failed, dm.DriverLoadFailed), failed
    assert failed.reason is dm.LoadFailureReason.OTHER and not failed.retryable
    assert failed.message.startswith(f"no CDI spec: {manifest} is not JSON")
    assert mounted_version(host) == OLD  # untouched


async def test_nvml_that_never_answers_fails_the_step_at_its_deadline(tmp_path: Path) -> None:
    root = support_host(tmp_path)
    root.join("proc/modules").write_text("")  # no driver loaded: NVML cannot start
    clock = VirtualClock()
    writer = SpecWriter(
        root, lambda: open_backend("sim:2", host_root=root.path, node="n1"), clock, 1.0
    )
    start = clock.monotonic()
    with pytest.raises(SpecFailed, match="NVML did not name the GPUs within 5 s") as failed:
        await writer.after_load(GPU, OLD, 5)
    assert failed.value.retryable
    assert clock.monotonic() - start >= 5
    assert not cdi.spec_path(root).exists()


async def test_nvml_seeing_no_gpu_leaves_the_failure_to_the_validation(tmp_path: Path) -> None:
    root = support_host(tmp_path)
    writer = SpecWriter(root, lambda: cast(Nvml, _NoGpu()), VirtualClock())
    cdi.write(cdi.spec_path(root), b"{}\n")
    await writer.after_load(GPU, OLD, 5)
    assert not cdi.spec_path(root).exists()
    assert cdi.previous_path(cdi.spec_path(root)).read_bytes() == b"{}\n"


class _NoGpu:
    def init(self) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def device_count(self) -> int:
        return 0


async def test_the_ofed_driver_has_no_spec(tmp_path: Path) -> None:
    root = support_host(tmp_path)
    writer = SpecWriter(root, lambda: pytest.fail("NVML asked"), VirtualClock())
    await writer.after_load(dm.Component.OFED, "24.10", 5)
    await writer.after_rollback(dm.Component.OFED, "24.10", 5)
    assert not cdi.spec_path(root).exists()


def support_host(tmp_path: Path) -> HostRoot:
    from tests.support.driver_manager import seed

    root = seed(tmp_path / "host")
    support.install_userspace(root, support.manifest(OLD, KERNEL))
    return root


async def test_every_load_makes_the_control_nodes_so_the_spec_names_them(
    harness: Harness, host: HostRoot, source: Path
) -> None:
    """No program asked NVIDIA's driver for its unified memory nodes: the load makes them
    (as `nvidia-ctk system create-device-nodes` does), numbered in the spec it writes next;
    again after a load that finds them gone."""
    assert os.geteuid() == 0, "mknod needs root (CAP_MKNOD): run the suites as root, as CI does"
    await new_with_userspace(harness, host, source)
    for name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"):
        host.join(f"dev/{name}").unlink()

    loaded = await load(harness, NEW)

    assert isinstance(loaded, dm.DriverLoaded), loaded
    control = json.loads(spec_of(host))["containerEdits"]["deviceNodes"]
    assert control == [
        {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255},
        {"path": "/dev/nvidia-uvm", "type": "c", "major": 235, "minor": 0},
        {"path": "/dev/nvidia-uvm-tools", "type": "c", "major": 235, "minor": 1},
        {"path": "/dev/nvidia-modeset", "type": "c", "major": 195, "minor": 254},
    ]


async def test_a_load_that_cannot_make_the_nodes_stands_and_its_spec_names_none(
    harness: Harness, host: HostRoot, source: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await new_with_userspace(harness, host, source)
    shutil.rmtree(host.join("dev"), ignore_errors=True)
    host.join("dev").write_text("not a directory\n")

    loaded = await load(harness, NEW)

    assert isinstance(loaded, dm.DriverLoaded), loaded
    assert json.loads(spec_of(host))["containerEdits"]["deviceNodes"] == []
    assert "cannot make" in caplog.text and "dev/nvidiactl" in caplog.text
