"""The readers on the shapes real hosts have beyond the recording, and on broken files:
missing files give None or nothing, malformed ones raise `HostReadError` naming the file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuop.host import modules, nvidia, pci, system
from gpuop.host.errors import HostReadError
from gpuop.host.roots import HostRoot

from .support import make_root

GPU = "sys/bus/pci/devices/0000:17:00.0"
PROPRIETARY = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC 2023\n"
    "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04) \n"
)


def gpu_files(**overrides: str) -> dict[str, str | bytes]:
    files: dict[str, str | bytes] = {
        f"{GPU}/vendor": "0x10de\n",
        f"{GPU}/device": "0x2335\n",
        f"{GPU}/class": "0x030200\n",
        f"{GPU}/subsystem_vendor": "0x10de\n",
        f"{GPU}/subsystem_device": "0x18bf\n",
        f"{GPU}/numa_node": "1\n",
        f"{GPU}/current_link_speed": "16.0 GT/s PCIe\n",
        f"{GPU}/current_link_width": "8\n",
    }
    files.update({f"{GPU}/{name}": value for name, value in overrides.items()})
    return files


def test_a_real_numa_node_link_and_driver_link_are_read(tmp_path: Path) -> None:
    root = make_root(tmp_path, gpu_files())
    (tmp_path / GPU / "driver").symlink_to("../../../bus/pci/drivers/nvidia")
    function = pci.pci_function(root, "0000:17:00.0")
    assert (function.numa_node, function.link_speed_gts, function.link_width) == (1, 16.0, 8)
    assert function.driver == "nvidia"


def test_a_real_driver_link_wins_over_the_recorded_list(tmp_path: Path) -> None:
    files = gpu_files()
    files["SYMLINKS.txt"] = f"{GPU}/driver -> ../../../bus/pci/drivers/nouveau\n"
    root = make_root(tmp_path, files)
    assert pci.bound_driver(root, "0000:17:00.0") == "nouveau"
    (tmp_path / GPU / "driver").symlink_to("../../../bus/pci/drivers/nvidia")
    assert pci.bound_driver(root, "0000:17:00.0") == "nvidia"


def test_the_pcie_root_is_the_root_complex_in_the_functions_link(tmp_path: Path) -> None:
    # a real sysfs: the function's directory lives under its root complex and bridges, and
    # sys/bus/pci/devices/<address> links to it
    address = "0000:17:00.0"
    tree = f"sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/{address}"
    files = {f"{tree}/{name.rpartition('/')[2]}": v for name, v in gpu_files().items()}
    root = make_root(tmp_path, files)
    (tmp_path / "sys/bus/pci/devices").mkdir(parents=True)
    (tmp_path / GPU).symlink_to(f"../../../devices/pci0000:15/0000:15:01.0/0000:16:00.0/{address}")
    assert pci.pci_function(root, address).pcie_root == "pci0000:15"


def test_the_pcie_root_comes_from_the_recorded_link_and_is_none_without_one(
    tmp_path: Path,
) -> None:
    files = gpu_files()
    root = make_root(tmp_path, files)
    assert pci.pci_function(root, "0000:17:00.0").pcie_root is None
    files["SYMLINKS.txt"] = f"{GPU} -> ../../../devices/pci10000:e0/10000:e0:02.0/0000:17:00.0\n"
    assert pci.pcie_root(make_root(tmp_path, files), "0000:17:00.0") == "pci10000:e0"
    files["SYMLINKS.txt"] = f"{GPU} -> ../../../devices/platform/0000:17:00.0\n"
    assert pci.pcie_root(make_root(tmp_path, files), "0000:17:00.0") is None


def test_uevent_names_the_driver_when_no_link_was_kept(tmp_path: Path) -> None:
    root = make_root(tmp_path, gpu_files(uevent="DRIVER=vfio-pci\nPCI_CLASS=30200\n"))
    assert pci.bound_driver(root, "0000:17:00.0") == "vfio-pci"


@pytest.mark.parametrize(
    ("text", "speed"),
    [("2.5 GT/s PCIe", 2.5), ("8 GT/s", 8.0), ("64.0 GT/s PCIe", 64.0), ("Unknown", None)],
)
def test_link_speeds_of_every_kernel_format(text: str, speed: float | None) -> None:
    assert pci.parse_link_speed(text) == speed


def test_missing_optional_attributes_are_none(tmp_path: Path) -> None:
    files = gpu_files()
    for name in ("numa_node", "current_link_speed", "current_link_width", "subsystem_vendor"):
        del files[f"{GPU}/{name}"]
    function = pci.pci_function(make_root(tmp_path, files), "0000:17:00.0")
    assert function.numa_node is function.link_speed_gts is function.link_width is None
    assert function.subsystem_vendor_id is None


@pytest.mark.parametrize(
    ("attribute", "value"),
    [
        ("vendor", "10de\n"),
        ("class", "display\n"),
        ("numa_node", "zero\n"),
        ("current_link_speed", "fast\n"),
        ("current_link_width", "x16\n"),
    ],
)
def test_malformed_pci_attributes_raise_naming_the_file(
    tmp_path: Path, attribute: str, value: str
) -> None:
    root = make_root(tmp_path, gpu_files(**{attribute: value}))
    with pytest.raises(HostReadError) as raised:
        pci.pci_functions(root)
    assert raised.value.path == tmp_path / GPU / attribute
    assert attribute in str(raised.value)


def test_a_function_without_a_vendor_raises(tmp_path: Path) -> None:
    files = gpu_files()
    del files[f"{GPU}/vendor"]
    with pytest.raises(HostReadError, match="vendor: missing"):
        pci.pci_functions(make_root(tmp_path, files))


def test_an_empty_root_has_no_functions_modules_driver_or_system(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    assert pci.pci_functions(root) == ()
    assert modules.loaded_modules(root) == ()
    assert nvidia.driver_version(root) is None
    assert nvidia.gpus(root) == ()
    assert system.describe(root) == system.HostSystem(system.OsRelease(), None, None, None, None)


def test_proc_modules_of_a_kernel_that_unloads_lists_counts_users_and_permanence(
    tmp_path: Path,
) -> None:
    root = make_root(
        tmp_path,
        {
            "proc/modules": (
                "nvidia_drm 135168 4 - Live 0x0000000000000000 (POE)\n"
                "nvidia 14299136 67 nvidia_uvm,nvidia_modeset, Live 0xffffffffc0400000 (POE)\n"
                "ipv6 651264 38 [permanent], Live 0x0000000000000000\n"
                "mlx5_ib 487424 0 - Loading 0x0000000000000000\n"
            )
        },
    )
    drm, nv, ipv6, mlx = modules.loaded_modules(root)
    assert (drm.refcount, drm.used_by, drm.taints) == (4, (), "POE")
    assert (nv.refcount, nv.used_by) == (67, ("nvidia_uvm", "nvidia_modeset"))
    assert (ipv6.used_by, ipv6.permanent, ipv6.taints) == ((), True, "")
    assert mlx.state == "Loading"


@pytest.mark.parametrize(
    "line",
    [
        "nvidia 14299136 - -",
        "nvidia big - - Live 0x0",
        "nvidia 1 many - Live 0x0",
        "nvi/dia 1 0 - Live 0x0",
        "nvidia 1 0 - Live 0x0 O",
    ],
)
def test_malformed_proc_modules_raises_with_the_line_number(tmp_path: Path, line: str) -> None:
    root = make_root(tmp_path, {"proc/modules": f"ib_core 1 0 - Live 0x0\n{line}\n"})
    with pytest.raises(HostReadError, match=r"proc/modules: line 2"):
        modules.loaded_modules(root)


def test_sys_module_refcount_and_holders_of_a_kernel_that_unloads(tmp_path: Path) -> None:
    root = make_root(
        tmp_path,
        {
            "sys/module/nvidia/initstate": "live\n",
            "sys/module/nvidia/refcnt": "2\n",
            "sys/module/nvidia/holders/nvidia_uvm": "",
            "sys/module/nvidia/holders/nvidia_modeset": "",
        },
    )
    info = modules.module_info(root, "nvidia")
    assert info is not None
    assert (info.refcount, info.holders, info.version) == (
        2,
        ("nvidia_modeset", "nvidia_uvm"),
        None,
    )
    (tmp_path / "sys/module/nvidia/refcnt").write_text("two\n")
    with pytest.raises(HostReadError, match="refcnt"):
        modules.module_info(root, "nvidia")


def test_proprietary_driver_version_line_is_parsed() -> None:
    version = nvidia.parse_version(PROPRIETARY)
    assert (version.version, version.open_kernel_module, version.arch) == (
        "535.129.03",
        False,
        "x86_64",
    )
    assert version.build == "Thu Oct 19 18:56:32 UTC 2023"
    assert nvidia.parse_version(nvidia.with_version(PROPRIETARY, "550.54.15")).version == (
        "550.54.15"
    )


def test_a_version_file_without_an_nvrm_line_raises(tmp_path: Path) -> None:
    root = make_root(tmp_path, {nvidia.VERSION_FILE: "GCC version: gcc 12\n"})
    with pytest.raises(HostReadError, match="proc/driver/nvidia/version: no 'NVRM version"):
        nvidia.driver_version(root)


def test_malformed_gpu_information_raises(tmp_path: Path) -> None:
    path = f"{nvidia.GPUS_DIR}/0000:17:00.0/information"
    root = make_root(tmp_path, {path: "Model: \t\t NVIDIA H200\nIRQ: lots\n"})
    with pytest.raises(HostReadError, match="IRQ is not a number"):
        nvidia.gpus(root)
    (tmp_path / path).write_text("Model NVIDIA H200\n")
    with pytest.raises(HostReadError, match="line 1 is not 'Key: value'"):
        nvidia.gpus(root)


def test_firmware_is_rewritten_in_place_and_na_means_none() -> None:
    text = "Model: \t\t NVIDIA H200\nGPU Firmware: \t 580.159.04\nGPU Excluded:\t No\n"
    rewritten = nvidia.with_firmware(text, "590.44.01")
    assert rewritten == text.replace("580.159.04", "590.44.01")
    assert nvidia.parse_information("a", "GPU Firmware: N/A\n").firmware is None


def test_os_release_from_etc_with_quoting_and_comments(tmp_path: Path) -> None:
    root = make_root(
        tmp_path,
        {
            "etc/os-release": (
                '# Ubuntu\nPRETTY_NAME="Ubuntu 24.04.1 LTS"\nID=ubuntu\n'
                'VERSION_ID=\'24.04\'\nNAME="Ubuntu \\"Noble\\""\n\n'
            ),
            "usr/lib/os-release": "ID=debian\n",
        },
    )
    release = system.os_release(root)
    assert (release.id, release.version_id, release.pretty_name) == (
        "ubuntu",
        "24.04",
        "Ubuntu 24.04.1 LTS",
    )
    assert release.values["NAME"] == 'Ubuntu "Noble"'


def test_os_release_falls_back_to_usr_lib_and_follows_absolute_links_inside_the_root(
    tmp_path: Path,
) -> None:
    root = make_root(tmp_path, {"usr/lib/os-release": "ID=rhcos\nOSTREE_VERSION='417.94.1'\n"})
    assert system.os_release(root).ostree_version == "417.94.1"
    (tmp_path / "etc").mkdir()
    # an absolute target means the host's /usr, never the container's
    os.symlink("/usr/lib/os-release", tmp_path / "etc/os-release")
    assert system.os_release(root).id == "rhcos"


@pytest.mark.parametrize("line", ["JUST TEXT", 'ID="unterminated', "1D=x"])
def test_malformed_os_release_raises(tmp_path: Path, line: str) -> None:
    root = make_root(tmp_path, {"etc/os-release": f"ID=ubuntu\n{line}\n"})
    with pytest.raises(HostReadError, match="etc/os-release: line 2"):
        system.os_release(root)


def test_kernel_release_prefers_osrelease_over_proc_version(tmp_path: Path) -> None:
    root = make_root(
        tmp_path,
        {
            "proc/sys/kernel/osrelease": "6.8.0-49-generic\n",
            "proc/version": "Linux version 6.8.0-48-generic (buildd@lcy02) #49\n",
        },
    )
    assert system.kernel_release(root) == "6.8.0-49-generic"
    (tmp_path / "proc/sys/kernel/osrelease").unlink()
    assert system.kernel_release(root) == "6.8.0-48-generic"
    (tmp_path / "proc/version").write_text("FreeBSD 14\n")
    with pytest.raises(HostReadError, match="Linux version"):
        system.kernel_release(root)


def test_boot_id_arch_and_uptime_when_the_host_has_them(tmp_path: Path) -> None:
    root = make_root(
        tmp_path,
        {
            "proc/sys/kernel/random/boot_id": "4b5e0f5e-8a4c-4f0e-9d52-9f1d4f7f4c11\n",
            "proc/sys/kernel/arch": "aarch64\n",
            "proc/uptime": "3605.27 57300.11\n",
            nvidia.VERSION_FILE: PROPRIETARY,
        },
    )
    assert system.boot_id(root) == "4b5e0f5e-8a4c-4f0e-9d52-9f1d4f7f4c11"
    assert system.machine(root) == "aarch64"
    assert system.uptime_seconds(root) == 3605.27
    (tmp_path / "proc/sys/kernel/random/boot_id").write_text("not-a-uuid\n")
    with pytest.raises(HostReadError, match="boot_id"):
        system.boot_id(root)
    (tmp_path / "proc/uptime").write_text("\n")
    with pytest.raises(HostReadError, match="uptime"):
        system.uptime_seconds(root)


def test_files_that_cannot_be_read_as_text_raise(tmp_path: Path) -> None:
    root = make_root(tmp_path, {"proc/modules": b"\xff\xfe\x00", "proc/version/x": ""})
    with pytest.raises(HostReadError, match="not UTF-8"):
        modules.loaded_modules(root)
    with pytest.raises(HostReadError, match="is a directory"):
        system.kernel_release(root)


def test_a_malformed_recorded_links_file_raises(tmp_path: Path) -> None:
    root = make_root(tmp_path, {"SYMLINKS.txt": "sys/a -> b\nsys/c => d\n"})
    with pytest.raises(HostReadError, match="line 2"):
        root.link_target("sys/x")


def test_link_loops_inside_the_root_raise(tmp_path: Path) -> None:
    os.symlink("b", tmp_path / "a")
    os.symlink("a", tmp_path / "b")
    with pytest.raises(HostReadError, match="too many levels"):
        HostRoot(tmp_path).read_text("a")
