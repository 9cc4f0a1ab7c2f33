"""Module parameters on the host: the simulated kernel takes the ones a module declares and
shows them in `sys/module/<m>/parameters/`, ignores one it does not declare (as the kernel
does: so a misspelt name is caught before the load, never by it), and refuses a value its type
does not take; modinfo's `parm:` lines become the declarations; stand-ins carry theirs."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuop import moduleparams
from gpuop.host import errors, manifests, modules, packages, packaging, parameters
from gpuop.host.roots import HostRoot
from gpuop_sim.host.simkernel import SimKernel

KERNEL = "6.18.44-fc-v657-gpu"


def reload_nvidia(kernel: SimKernel, options: dict[str, str]) -> None:
    kernel.rmmod("nvidia_uvm")
    kernel.rmmod("nvidia")
    kernel.modprobe("nvidia", options)  # first: loading nvidia_uvm first loads it without
    kernel.modprobe("nvidia_uvm")


def test_declared_parameters_are_taken_and_shown_in_sysfs(seeded: HostRoot) -> None:
    kernel = SimKernel(seeded)
    kernel.rmmod("nvidia_uvm")
    kernel.rmmod("nvidia")
    kernel.modprobe("nvidia_uvm", {"uvm_disable_hmm": "Y"})  # nvidia comes first, without
    assert parameters.shown(seeded, "nvidia_uvm") == {"uvm_disable_hmm": "Y"}
    assert parameters.shown(seeded, "nvidia") == {}
    kernel.rmmod("nvidia_uvm")
    kernel.rmmod("nvidia")
    kernel.modprobe("nvidia", {"NVreg_EnableGpuFirmware": "0", "NVreg_RegistryDwords": "A=1"})
    assert parameters.shown(seeded, "nvidia") == {
        "NVreg_EnableGpuFirmware": "0",
        "NVreg_RegistryDwords": "A=1",
    }
    kernel.rmmod("nvidia")
    assert parameters.shown(seeded, "nvidia") == {}  # gone with the module


def test_a_parameter_the_module_does_not_declare_is_ignored_as_the_kernel_does(
    seeded: HostRoot,
) -> None:
    kernel = SimKernel(seeded)
    reload_nvidia(kernel, {"NVreg_EnableGpuFirmwre": "0", "NVreg_EnableMSI": "1"})
    assert "nvidia" in [m.name for m in modules.loaded_modules(seeded)]
    assert parameters.shown(seeded, "nvidia") == {"NVreg_EnableMSI": "1"}


@pytest.mark.parametrize(
    "options",
    [{"NVreg_EnableGpuFirmware": "on"}, {"NVreg_EnableGpuFirmware": "-1"}],
)
def test_a_value_the_declared_type_refuses_fails_the_load(
    seeded: HostRoot, options: dict[str, str]
) -> None:
    kernel = SimKernel(seeded)
    kernel.rmmod("nvidia_uvm")
    kernel.rmmod("nvidia")
    with pytest.raises(errors.ModuleLoadFailed) as refused:
        kernel.modprobe("nvidia", options)
    assert "Invalid argument" in str(refused.value)
    assert modules.loaded_modules(seeded) == ()


def test_modprobe_d_options_apply_to_every_load_and_the_command_line_wins(
    seeded: HostRoot,
) -> None:
    parameters.write_options(seeded, "gpu", {"nvidia": {"NVreg_EnableMSI": "0"}, "nvidia_uvm": {}})
    conf = seeded.join("etc/modprobe.d/gpuop-gpu.conf").read_text()
    assert conf.splitlines()[1:] == ["options nvidia NVreg_EnableMSI=0"]
    seeded.join("etc/modprobe.d/zz-admin.conf").write_text("options nvidia-uvm uvm_disable_hmm=Y\n")
    assert parameters.configured(seeded) == {
        "nvidia": {"NVreg_EnableMSI": "0"},
        "nvidia_uvm": {"uvm_disable_hmm": "Y"},
    }
    kernel = SimKernel(seeded)
    kernel.rmmod("nvidia_uvm")
    kernel.rmmod("nvidia")
    kernel.modprobe("nvidia_uvm")  # nvidia, a need, gets its modprobe.d options too
    assert parameters.shown(seeded, "nvidia") == {"NVreg_EnableMSI": "0"}
    assert parameters.shown(seeded, "nvidia_uvm") == {"uvm_disable_hmm": "Y"}
    kernel.rmmod("nvidia_uvm")
    kernel.rmmod("nvidia")
    kernel.modprobe("nvidia", {"NVreg_EnableMSI": "1"})
    assert parameters.shown(seeded, "nvidia") == {"NVreg_EnableMSI": "1"}
    parameters.write_options(seeded, "gpu", {})
    assert not seeded.join("etc/modprobe.d/gpuop-gpu.conf").exists()


def test_modinfo_parm_lines_become_declarations() -> None:
    assert moduleparams.declared(
        [
            "NVreg_EnableGpuFirmware:uint",
            "uvm_disable_hmm:Force-disable HMM functionality in the UVM driver. (bool)",
            "NVreg_RegistryDwords:charp",
            "modeset:Enable atomic kernel modesetting (1 = enable, 0 = disable (default)) (bool)",
            "undocumented:no type given",
        ]
    ) == {
        "NVreg_EnableGpuFirmware": "uint",
        "uvm_disable_hmm": "bool",
        "NVreg_RegistryDwords": "charp",
        "modeset": "bool",
        "undocumented": "charp",
    }
    assert moduleparams.parsed(["a=1", "b", "c=x=y"]) == {"a": "1", "b": "Y", "c": "x=y"}
    assert moduleparams.words({"b": "2", "a": "1"}) == ("a=1", "b=2")


def test_nvidia_stand_ins_declare_the_535_parameters_and_keep_them_encoded() -> None:
    nvidia, *_ = packages.standins_for("gpu", "535.261.03", KERNEL)
    declared = dict(nvidia.parameters)
    assert declared["NVreg_EnableGpuFirmware"] == "uint"
    assert declared["NVreg_RegistryDwords"] == "charp"
    assert packages.ModuleStandin.decode(nvidia.encode()) == nvidia
    ofed = packages.standins_for("ofed", "24.10-1.1.4.0", KERNEL)
    assert all(standin.parameters == () for standin in ofed)


def test_a_sources_index_lists_what_each_packages_modules_declare(tmp_path: Path) -> None:
    built = packaging.build_package(tmp_path, "gpu", "535.261.03", KERNEL)
    entry = built.index_entry()
    assert entry["parameters"] == {  # type: ignore[index]
        s.name: dict(s.parameters) for s in packages.standins_for("gpu", "535.261.03", KERNEL)
    }
    assert (
        "parameters" not in packaging.build_package(tmp_path, "ofed", "24.10", KERNEL).index_entry()
    )

    drm = packages.standins_for("gpu", "535.261.03", KERNEL)[-2]
    v2 = packaging.write_package_v2(
        tmp_path / "v2",
        component="gpu",
        version="535.261.03",
        flavour=manifests.Flavour.OPEN,
        kernel_release=KERNEL,
        files={
            f"modules/{drm.name}.ko": packaging.PackageContent(drm.encode(), manifests.Role.MODULE),
            "modules/broken.ko": packaging.PackageContent(b"\x7fELF", manifests.Role.MODULE),
        },
    )
    assert v2.index_entry()["parameters"] == {drm.name: dict(drm.parameters)}
