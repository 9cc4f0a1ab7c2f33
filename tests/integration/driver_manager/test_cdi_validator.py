"""The CDI specs gpuop writes, read back by the CDI project's own Go library
(`tags.cncf.io/container-device-interface`, built by `make cluster-tools` into
`cdi-validate`): strict decoding, the declared version covering every field, the names, and
the spec-directory cache a runtime uses. First on synthetic drivers (GPUs and MIG devices
from the simulated NVML), then on NVIDIA's real 535 package installed and loaded by the
driver-manager on the simulated node, whose spec must list every library and binary of the
package's manifest."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from pathlib import PurePosixPath as Posix
from typing import Any

import pytest

from gpuop.bus import InMemoryBus
from gpuop.events import driver as dm
from gpuop.host import cdi, system
from gpuop.host.manifests import Flavour, Role
from gpuop.inventory import cdi_devices
from gpuop.nvml import opened
from gpuop_sim.host import seeding
from gpuop_sim.nvml.simulated import SimNvml
from tests.support import cdi as support
from tests.support import driver_packages
from tests.support.driver_manager import recorded_host, running_agent, seed, source_of

pytestmark = [pytest.mark.real_cluster, pytest.mark.timeout(3600)]

VERSION = driver_packages.VERSION
BASE_KERNEL = ("drm", "drm_kms_helper", "video")
"""What NVIDIA's modules need of the kernel itself, built into the simulated node's kernel."""


def test_a_synthetic_drivers_spec_with_mig_devices_passes_the_validator(tmp_path: Path) -> None:
    root = seed(tmp_path / "host")
    release = system.kernel_release(root)
    assert release is not None
    support.install_userspace(
        root,
        support.manifest(
            "580.159.04", release, firmware=("gsp_ga10x.bin",), configs=("nvidia/x.conf",)
        ),
    )
    nvml = SimNvml(2, node="n1")
    nvml.enable_mig(1, ["3g.71gb", "3g.71gb"])
    with opened(nvml):
        devices = cdi_devices.gpu_devices(nvml, root)
    driver = cdi.driver_files(root)
    path = tmp_path / "cdi" / cdi.SPEC_FILE
    cdi.write(path, cdi.encode(cdi.spec(devices, driver, ("/dev/nvidiactl",))))

    code, [report], stderr = support.validate(path)

    assert code == 0, stderr
    assert report["cdiVersion"] == report["minimumVersion"] == "0.5.0"  # the lowest that covers
    names = [device["name"] for device in report["devices"]]
    assert {"nvidia.com/gpu=0", "nvidia.com/gpu=1:0", "nvidia.com/gpu=1:1"} <= set(names)
    assert "nvidia.com/gpu=all" in names and len(names) == 2 * 2 + 2 * 2 + 1
    [whole] = [d for d in report["devices"] if d["name"] == "nvidia.com/gpu=0"]
    assert len(whole["mounts"]) == len(driver.mounts)
    assert all(m.endswith(":ro,nosuid,nodev,bind") for m in whole["mounts"])


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda s: s.update(cdiVersion="0.3.0"), "the spec version must be at least"),
        (lambda s: s["containerEdits"].update(envs=[]), "field envs not found"),
        (lambda s: s["devices"][0].update(name="bad name"), "invalid"),
        (lambda s: s.update(kind="nvidia.com"), "invalid vendor"),
    ],
)
def test_the_validator_refuses_what_a_runtime_refuses(
    tmp_path: Path, change: Callable[[dict[str, Any]], None], error: str
) -> None:
    document = cdi.spec(
        [cdi.Device(("0", "GPU-a"), ("/dev/nvidia0",))],
        cdi.DriverFiles("1.0", (cdi.Mount("/opt/gpuop/gpu/1.0/bin/x", "/usr/bin/x"),)),
        (),
    )
    change(document)
    path = tmp_path / "nvidia.com-gpu.json"
    path.write_text(json.dumps(document))

    code, [report], stderr = support.validate(path)

    assert code == 1
    assert error in " ".join(report["errors"]), report
    assert error in stderr


@pytest.fixture(scope="module")
def kernel() -> str:
    for tool in ("apt-get", "dpkg-deb", "make", "gcc-12", "strip", "modinfo", "depmod"):
        if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode:
            pytest.fail(
                f"{tool} is not installed: apt-get install kmod binutils make gcc-12 dpkg "
                "(.ci/run's driver-build-tools stage does)"
            )
    return driver_packages.newest_kernel()


@pytest.mark.slow
async def test_the_spec_of_the_real_535_package_mounts_every_library_and_binary_and_validates(
    tmp_path: Path, kernel: str
) -> None:
    package = driver_packages.cached_package(Flavour.PROPRIETARY, kernel).package
    manifest = driver_packages.manifest_of(package)
    root = seeding.seed_host_root(
        tmp_path / "host", recorded_host(), gpu_version=None, kernel_release=kernel
    )
    for needed in BASE_KERNEL:
        root.join(f"sys/module/{needed}").mkdir(parents=True)
    source = driver_packages.real_source(tmp_path / "source", [package])
    gpu = dm.Component.GPU
    async with running_agent(InMemoryBus(), root, source) as agent:
        installed = await agent.send(
            dm.InstallDriver(component=gpu, version=VERSION, source=source_of(source)),
            timeout=120,
        )
        assert isinstance(installed, dm.DriverInstalled), installed
        loaded = await agent.send(dm.LoadDriver(component=gpu, version=VERSION), timeout=60)
        assert isinstance(loaded, dm.DriverLoaded), loaded

    path = cdi.spec_path(root)
    spec = json.loads(path.read_bytes())
    mounts = {m["hostPath"]: m for m in spec["containerEdits"]["mounts"]}
    userspace = f"/opt/gpuop/gpu/{VERSION}"
    expected = {
        f"{userspace}/{Posix(f.path).relative_to('userspace')}"
        for f in manifest.files
        if f.role in (Role.LIBRARY, Role.BINARY)
    } | {f"{userspace}/{Posix(link.path).relative_to('userspace')}" for link in manifest.links}
    assert expected <= set(mounts), sorted(expected - set(mounts))
    assert len(manifest.of_role(Role.LIBRARY)) >= 2 and manifest.links
    for host_path in expected:
        assert root.join(host_path).resolve().is_file(), host_path  # the installer put it there
    assert mounts[f"{userspace}/bin/nvidia-smi"]["containerPath"] == "/usr/bin/nvidia-smi"
    assert mounts[f"{userspace}/lib/libcuda.so.1"]["containerPath"] == (
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
    )
    firmware = {f for f in mounts if f.startswith(f"/lib/firmware/nvidia/{VERSION}/")}
    assert len(firmware) == len(manifest.of_role(Role.FIRMWARE))

    code, [report], stderr = support.validate(path)

    assert code == 0, stderr
    assert report["kind"] == "nvidia.com/gpu" and report["cdiVersion"] == "0.5.0"
    names = [device["name"] for device in report["devices"]]
    assert names[0] == "nvidia.com/gpu=0" and names[-1] == "nvidia.com/gpu=all"
    assert any(name.startswith("nvidia.com/gpu=GPU-") for name in names)
    assert len(report["devices"][0]["mounts"]) == len(mounts)
    print(f"CDI spec of {VERSION}: {len(mounts)} mounts, {len(names)} devices")
