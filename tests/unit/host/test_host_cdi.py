"""The CDI spec made from the installed driver's manifest (`gpuop.host.cdi`,
`gpuop.inventory.cdi_devices`): every user space file of the manifest as a read-only bind
mount, the GPUs by index, UUID and `all`, and clear errors for a host root without a driver
or with a broken manifest. Synthetic manifests; the real 535 package is in the slow suite."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuop.host import cdi, packages, system
from gpuop.host.roots import HostRoot
from gpuop.inventory import cdi_devices
from gpuop.nvml import NvmlError, open_backend, opened
from gpuop_sim.nvml.simulated import SimNvml
from tests.support import cdi as support
from tests.support.driver_manager import seed

VERSION = "580.159.04"
OPTIONS = ["ro", "nosuid", "nodev", "bind"]


def host(tmp_path: Path) -> HostRoot:
    return seed(tmp_path / "host")


def kernel(root: HostRoot) -> str:
    release = system.kernel_release(root)
    assert release is not None
    return release


def generate(root: HostRoot, gpus: int = 8) -> dict[str, Any]:
    nvml = open_backend(f"sim:{gpus}", host_root=root.path, node="n1")
    document: dict[str, Any] = json.loads(cdi_devices.generate(root, nvml))
    return document


def test_the_spec_mounts_every_library_link_binary_and_firmware_of_the_manifest(
    tmp_path: Path,
) -> None:
    root = host(tmp_path)
    manifest = support.manifest(
        VERSION,
        kernel(root),
        firmware=("gsp_ga10x.bin", "gsp_tu10x.bin"),
        configs=("vulkan/icd.d/nvidia_icd.json",),
        binaries=("nvidia-smi", "nvidia-persistenced"),
    )
    support.install_userspace(root, manifest)

    spec = generate(root)

    edits = spec["containerEdits"]
    mounts = {m["containerPath"]: m for m in edits["mounts"]}
    prefix = f"/opt/gpuop/gpu/{VERSION}"
    libraries = "/usr/lib/x86_64-linux-gnu"
    assert mounts == {
        f"{libraries}/libnvidia-ml.so.{VERSION}": {
            "hostPath": f"{prefix}/lib/libnvidia-ml.so.{VERSION}",
            "containerPath": f"{libraries}/libnvidia-ml.so.{VERSION}",
            "options": OPTIONS,
        },
        f"{libraries}/libcuda.so.{VERSION}": {
            "hostPath": f"{prefix}/lib/libcuda.so.{VERSION}",
            "containerPath": f"{libraries}/libcuda.so.{VERSION}",
            "options": OPTIONS,
        },
        f"{libraries}/libnvidia-ml.so.1": {
            "hostPath": f"{prefix}/lib/libnvidia-ml.so.1",
            "containerPath": f"{libraries}/libnvidia-ml.so.1",
            "options": OPTIONS,
        },
        f"{libraries}/libcuda.so.1": {
            "hostPath": f"{prefix}/lib/libcuda.so.1",
            "containerPath": f"{libraries}/libcuda.so.1",
            "options": OPTIONS,
        },
        "/usr/bin/nvidia-smi": {
            "hostPath": f"{prefix}/bin/nvidia-smi",
            "containerPath": "/usr/bin/nvidia-smi",
            "options": OPTIONS,
        },
        "/usr/bin/nvidia-persistenced": {
            "hostPath": f"{prefix}/bin/nvidia-persistenced",
            "containerPath": "/usr/bin/nvidia-persistenced",
            "options": OPTIONS,
        },
        "/etc/vulkan/icd.d/nvidia_icd.json": {
            "hostPath": f"{prefix}/etc/vulkan/icd.d/nvidia_icd.json",
            "containerPath": "/etc/vulkan/icd.d/nvidia_icd.json",
            "options": OPTIONS,
        },
        f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin": {
            "hostPath": f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin",
            "containerPath": f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin",
            "options": OPTIONS,
        },
        f"/lib/firmware/nvidia/{VERSION}/gsp_tu10x.bin": {
            "hostPath": f"/lib/firmware/nvidia/{VERSION}/gsp_tu10x.bin",
            "containerPath": f"/lib/firmware/nvidia/{VERSION}/gsp_tu10x.bin",
            "options": OPTIONS,
        },
    }
    # every host path is where the installer put the file (the links resolve on the host)
    for mount in edits["mounts"]:
        assert root.join(mount["hostPath"]).resolve().is_file(), mount
    assert edits["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert spec["cdiVersion"] == "0.5.0"
    assert spec["kind"] == "nvidia.com/gpu"


def test_gpus_are_named_by_index_uuid_and_all_with_the_control_nodes_the_host_has(
    tmp_path: Path,
) -> None:
    root = host(tmp_path)
    support.install_userspace(root, support.manifest(VERSION, kernel(root)))
    for node in ("dev/nvidiactl", "dev/nvidia-uvm"):
        root.join(node).parent.mkdir(parents=True, exist_ok=True)
        root.join(node).touch()
    nvml = open_backend("sim:2", host_root=root.path, node="n1")
    nvml.init()
    uuids = [nvml.device_info(i).uuid for i in range(2)]
    minors = [nvml.device_info(i).minor_number for i in range(2)]
    nvml.shutdown()

    spec = generate(root, gpus=2)

    devices = {d["name"]: d["containerEdits"]["deviceNodes"] for d in spec["devices"]}
    assert devices == {
        "0": [{"path": f"/dev/nvidia{minors[0]}"}],
        uuids[0]: [{"path": f"/dev/nvidia{minors[0]}"}],
        "1": [{"path": f"/dev/nvidia{minors[1]}"}],
        uuids[1]: [{"path": f"/dev/nvidia{minors[1]}"}],
        "all": [{"path": f"/dev/nvidia{minors[0]}"}, {"path": f"/dev/nvidia{minors[1]}"}],
    }
    assert spec["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidiactl"},
        {"path": "/dev/nvidia-uvm"},
    ]


def test_mig_devices_are_named_gpu_colon_index_with_their_capability_nodes(
    tmp_path: Path,
) -> None:
    root = host(tmp_path)
    base = root.join("proc/driver/nvidia/capabilities/gpu0/mig/gi3")
    (base / "ci0").mkdir(parents=True)
    (base / "access").write_text("DeviceFileMinor: 30\nDeviceFileMode: 292\n")
    (base / "ci0/access").write_text("DeviceFileMinor: 31\n")
    gpus = (
        cdi.Device(("0", "GPU-a"), ("/dev/nvidia0",)),
        cdi.Device(
            ("0:0", "MIG-b"),
            ("/dev/nvidia0", *cdi.mig_capability_nodes(root, 0, 3, 0)),
        ),
    )
    spec = cdi.spec(cdi.with_all(gpus), cdi.DriverFiles(VERSION, ()), ())
    named = {
        d["name"]: [n["path"] for n in d["containerEdits"]["deviceNodes"]] for d in spec["devices"]
    }
    assert (
        named["0:0"]
        == named["MIG-b"]
        == [
            "/dev/nvidia0",
            "/dev/nvidia-caps/nvidia-cap30",
            "/dev/nvidia-caps/nvidia-cap31",
        ]
    )
    assert named["all"] == named["0:0"]
    # no capabilities listed (a driver without MIG support): only the GPU's node
    assert cdi.mig_capability_nodes(root, 1, 3, 0) == ()


def test_a_host_root_without_a_driver_says_so(tmp_path: Path) -> None:
    root = host(tmp_path)
    with pytest.raises(cdi.CdiError, match="opt/gpuop/gpu/current does not exist: no NVIDIA"):
        cdi.driver_files(root)


def test_a_missing_manifest_names_the_version_and_kernel(tmp_path: Path) -> None:
    root = host(tmp_path)
    support.install_userspace(root, support.manifest(VERSION, kernel(root)))
    directory = packages.package_dir(root, kernel(root), "gpu", VERSION)
    (directory / "manifest.json").unlink()
    with pytest.raises(cdi.CdiError, match=f"manifest.json does not exist: driver {VERSION}"):
        cdi.driver_files(root)


@pytest.mark.parametrize(
    ("content", "fault"),
    [
        (b"{not json", "is not JSON"),
        (b'{"format": "gpuop-package/2", "component": "gpu"}', "version: Field required"),
        (b'{"component": "gpu", "version": "1", "kernel_release": "k"}', "format 1 manifest"),
        (b'{"format": "gpuop-package/9"}', "format 'gpuop-package/9' is not one"),
    ],
)
def test_a_malformed_manifest_is_a_clear_error(tmp_path: Path, content: bytes, fault: str) -> None:
    root = host(tmp_path)
    support.install_userspace(root, support.manifest(VERSION, kernel(root)))
    directory = packages.package_dir(root, kernel(root), "gpu", VERSION)
    (directory / "manifest.json").write_bytes(content)
    with pytest.raises(cdi.CdiError, match=fault):
        cdi.driver_files(root)


def test_a_current_link_out_of_its_directory_is_refused(tmp_path: Path) -> None:
    root = host(tmp_path)
    support.install_userspace(root, support.manifest(VERSION, kernel(root)))
    support.switch(root, "../../../etc")
    with pytest.raises(cdi.CdiError, match="not to a version beside it"):
        cdi.driver_files(root)


def test_the_manifest_of_another_version_is_refused(tmp_path: Path) -> None:
    root = host(tmp_path)
    support.install_userspace(root, support.manifest(VERSION, kernel(root)))
    directory = packages.package_dir(root, kernel(root), "gpu", VERSION)
    other = support.manifest("535.261.03", kernel(root))
    (directory / "manifest.json").write_bytes(other.encode())
    with pytest.raises(cdi.CdiError, match=f"describes 535.261.03, not {VERSION}"):
        cdi.driver_files(root)


def test_no_gpu_makes_no_spec(tmp_path: Path) -> None:
    with pytest.raises(cdi.CdiError, match="at least one device"):
        cdi.spec(cdi.with_all(()), cdi.DriverFiles(VERSION, ()), ())


def test_nvml_failing_is_reported_after_the_driver_check(tmp_path: Path) -> None:
    root = host(tmp_path)
    nvml = open_backend("sim:2", host_root=root.path, node="n1")
    with pytest.raises(cdi.CdiError):  # no driver: said before NVML is asked
        cdi_devices.generate(root, nvml)
    support.install_userspace(root, support.manifest(VERSION, kernel(root)))
    root.join("proc/modules").write_text("")  # the driver is not loaded: NVML cannot start
    with pytest.raises(NvmlError):
        cdi_devices.generate(root, nvml)


def test_write_keeps_the_previous_spec_and_restore_puts_it_back_byte_for_byte(
    tmp_path: Path,
) -> None:
    path = tmp_path / "cdi" / cdi.SPEC_FILE
    old = cdi.encode(
        cdi.spec(
            [cdi.Device(("0",), ("/dev/nvidia0",))],
            cdi.DriverFiles("1.0", (cdi.Mount("/opt/gpuop/gpu/1.0/bin/x", "/usr/bin/x"),)),
            (),
        )
    )
    new = old.replace(b"1.0", b"2.0")
    assert cdi.write(path, old)
    assert not cdi.previous_path(path).exists()
    assert not cdi.write(path, old)  # unchanged: the previous copy is not overwritten
    assert cdi.write(path, new)
    assert cdi.previous_path(path).read_bytes() == old
    assert cdi.previous_path(path).name == "nvidia.com-gpu.json.previous"  # never loaded as a spec

    assert not cdi.restore_previous(path, "3.0")  # the previous spec is another version's
    assert path.read_bytes() == new
    assert cdi.restore_previous(path, "1.0")
    assert path.read_bytes() == old
    assert cdi.driver_version_of(new) == "2.0"
    assert cdi.driver_version_of(b"not json") is None
    assert not cdi.restore_previous(tmp_path / "none.json")


def test_nvmls_mig_devices_are_named_by_gpu_and_position_beside_their_gpu(
    tmp_path: Path,
) -> None:
    root = host(tmp_path)
    nvml = SimNvml(2, node="n1")
    nvml.enable_mig(1, ["3g.71gb", "3g.71gb"])
    with opened(nvml):
        devices = cdi_devices.gpu_devices(nvml, root)
        migs = nvml.mig_devices(1)
        gpu1 = nvml.device_info(1)

    names = [device.names for device in devices]
    assert names[1] == ("1", gpu1.uuid)
    assert names[2:4] == [("1:0", migs[0].uuid), ("1:1", migs[1].uuid)]
    assert names[-1] == ("all",)
    node = f"/dev/nvidia{gpu1.minor_number}"
    assert devices[2].device_nodes == (node,)  # no capabilities listed under /proc here


def test_an_arm64_hosts_spec_mounts_the_libraries_into_the_aarch64_directory(
    tmp_path: Path,
) -> None:
    root = host(tmp_path)
    arch = root.join(system.ARCH)
    arch.parent.mkdir(parents=True, exist_ok=True)
    arch.write_text("aarch64\n")
    support.install_userspace(root, support.manifest(VERSION, kernel(root)))

    mounts = {m["containerPath"] for m in generate(root)["containerEdits"]["mounts"]}

    assert f"/usr/lib/aarch64-linux-gnu/libcuda.so.{VERSION}" in mounts
    assert "/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1" in mounts
    assert not [m for m in mounts if "x86_64" in m]
    assert cdi.library_dir("x86_64") == cdi.LIBRARY_DIR == "/usr/lib/x86_64-linux-gnu"
    assert cdi.library_dir("s390x") == "/usr/lib/s390x-linux-gnu"
