"""The readers against the recorded H200 host: exactly what the real node showed."""

from __future__ import annotations

from gpuop.host import modules, nvidia, pci, system
from gpuop.host.roots import HostRoot


def test_pci_functions_list_every_recorded_function_by_address(recorded: HostRoot) -> None:
    addresses = [function.address for function in pci.pci_functions(recorded)]
    assert addresses == [f"0000:00:0{n}.0" for n in range(7)]


def test_the_h200_is_the_only_nvidia_gpu_with_its_recorded_ids_and_link(
    recorded: HostRoot,
) -> None:
    gpus = [function for function in pci.pci_functions(recorded) if function.is_nvidia_gpu]
    assert gpus == [
        pci.PciFunction(
            address="0000:00:06.0",
            vendor_id=0x10DE,
            device_id=0x2335,
            class_code=0x030200,
            subsystem_vendor_id=0x10DE,
            subsystem_device_id=0x18BF,
            numa_node=None,
            link_speed_gts=32.0,
            link_width=16,
            driver="nvidia",
            pcie_root="pci0000:00",
        )
    ]
    assert gpus[0].base_class == pci.DISPLAY_CLASS


def test_bound_drivers_come_from_the_recorded_links_and_unbound_functions_have_none(
    recorded: HostRoot,
) -> None:
    drivers = {function.address: function.driver for function in pci.pci_functions(recorded)}
    assert drivers["0000:00:00.0"] is None  # the host bridge: no link, no DRIVER= in uevent
    assert drivers["0000:00:03.0"] == "virtio-pci"
    virtio = pci.pci_function(recorded, "0000:00:03.0")
    assert (virtio.vendor_id, virtio.class_code, virtio.link_speed_gts) == (0x1AF4, 0x020000, None)


def test_driver_version_is_the_recorded_open_module_580_159_04(recorded: HostRoot) -> None:
    assert nvidia.driver_version(recorded) == nvidia.NvidiaDriverVersion(
        version="580.159.04",
        open_kernel_module=True,
        arch="x86_64",
        build="Release Build  (nixbld@)",
        gcc_version="gcc version 15.3.0 (GCC)",
    )
    version = nvidia.driver_version(recorded)
    assert version is not None and version.parts == ("580", "159", "04")


def test_gpu_information_of_the_h200(recorded: HostRoot) -> None:
    assert nvidia.gpus(recorded) == (
        nvidia.GpuInformation(
            address="0000:00:06.0",
            model="NVIDIA H200",
            uuid="GPU-20bce083-dbf9-2d4f-3c35-c858915accc5",
            irq=41,
            video_bios="96.00.a5.00.1a",
            bus_type="PCIe",
            device_minor=0,
            firmware="580.159.04",
            excluded=False,
        ),
    )
    assert nvidia.gpu_information(recorded, "0000:00:01.0") is None


def test_proc_modules_of_a_kernel_without_unloading_shows_dashes_as_unknown(
    recorded: HostRoot,
) -> None:
    assert modules.loaded_modules(recorded) == (
        modules.LoadedModule("nvidia_uvm", 1830912, None, (), "Live", taints="O"),
        modules.LoadedModule("nvidia", 14299136, None, (), "Live", taints="O"),
    )


def test_sys_module_tells_loaded_from_built_in_modules(recorded: HostRoot) -> None:
    loaded = modules.module_info(recorded, "nvidia")
    assert loaded is not None
    assert (loaded.version, loaded.initstate, loaded.refcount, loaded.holders) == (
        "580.159.04",
        "live",
        None,
        (),
    )
    assert loaded.srcversion == "06B987C9B8B712FF4E7FB47"
    assert not loaded.builtin
    builtin = modules.module_info(recorded, "mlx5_core")
    assert builtin is not None and builtin.builtin and builtin.version is None
    assert modules.module_info(recorded, "nvidia_drm") is None
    assert modules.module_version(recorded, "nvidia_uvm") == "580.159.04"


def test_system_falls_back_where_the_recording_has_no_file(recorded: HostRoot) -> None:
    assert system.describe(recorded) == system.HostSystem(
        os=system.OsRelease(),  # no etc/os-release nor usr/lib/os-release was recorded
        kernel_release="6.18.44-fc-v657-gpu",  # from proc/version: no osrelease recorded
        machine="x86_64",  # from the NVIDIA module's build line: no kernel/arch recorded
        boot_id=None,
        uptime_seconds=None,
    )


def test_recorded_links_list_what_the_recording_could_not_keep(recorded: HostRoot) -> None:
    links = recorded.recorded_links()
    assert links["etc/os-release"] == "../usr/lib/os-release"
    assert recorded.link_target("sys/bus/pci/devices/0000:00:06.0/driver") == (
        "../../../bus/pci/drivers/nvidia"
    )
    assert recorded.link_target("sys/bus/pci/devices/0000:00:00.0/driver") is None
