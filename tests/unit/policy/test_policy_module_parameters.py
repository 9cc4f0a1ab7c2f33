"""`driver.gpu.kernelModuleParameters` (`gpuop.policy.parameters`): the shape the policy
accepts (default and per pool, with the CRD's schema agreeing), the words modprobe gets, and
the check against the parameters the package's modules declare (`modinfo`'s `parm:`): a
misspelt name is refused naming the nearest declared ones, a value of another type too."""

from __future__ import annotations

from typing import Any

import pytest

from gpuop.policy import parameters, validate_spec
from tests.unit.policy.support import assert_schema_agrees, problems

# Some of the `parm:` entries of Debian's 535.261.03 modules (`modinfo nvidia.ko`): the
# NVreg_* are `uint` but for the string ones (`charp`)
DECLARED = {
    "nvidia": {
        "NVreg_EnableGpuFirmware": "uint",
        "NVreg_EnableGpuFirmwareLogs": "uint",
        "NVreg_EnablePCIeGen3": "uint",
        "NVreg_EnableStreamMemOPs": "uint",
        "NVreg_RegistryDwords": "charp",
        "NVreg_RestrictProfilingToAdminUsers": "uint",
        "NVreg_NvLinkDisable": "uint",
        "rm_firmware_active": "charp",
    },
    "nvidia_uvm": {"uvm_disable_hmm": "bool", "uvm_perf_prefetch_enable": "uint"},
    "nvidia_drm": {"modeset": "bool"},
    "nvidia_modeset": {"output_rounding_fix": "bool"},
}


def given(raw: dict[str, Any]) -> parameters.ModuleParameters:
    return parameters.ModuleParameters.model_validate(raw)


def spec(gpu: dict[str, Any], *pools: dict[str, Any]) -> dict[str, Any]:
    driver: dict[str, Any] = {"gpu": {"version": "535.261.03", **gpu}}
    if pools:
        driver["pools"] = list(pools)
    return {"driver": driver}


def test_parameters_are_read_at_the_top_and_per_pool_and_become_modprobe_words() -> None:
    top = {"nvidia": {"NVreg_RegistryDwords": "RMUseSwI2c=0x01", "NVreg_EnableGpuFirmware": 0}}
    pool = {"nvidia_uvm": {"uvm_disable_hmm": "Y"}}
    raw = spec(
        {"kernelModuleParameters": top},
        {
            "name": "h200",
            "nodeSelector": "pool=h200",
            "gpu": {"version": "535.261.03", "kernelModuleParameters": pool},
        },
    )
    assert_schema_agrees(raw)
    policy = validate_spec(raw)
    default, _ = policy.driver.components_of(None)
    pooled, _ = policy.driver.components_of("h200")
    assert parameters.options(default.kernel_module_parameters) == {
        "nvidia": {"NVreg_EnableGpuFirmware": "0", "NVreg_RegistryDwords": "RMUseSwI2c=0x01"}
    }
    assert parameters.options(pooled.kernel_module_parameters) == {
        "nvidia_uvm": {"uvm_disable_hmm": "Y"}
    }
    assert policy.to_wire()["driver"]["gpu"]["kernelModuleParameters"] == top
    assert parameters.options(None) == {}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"nvidia": {"NVreg_EnableGpuFirmware": True}}, "kernelModuleParameters.nvidia"),
        ({"nvidia": {"NVreg_EnableGpuFirmware": 1.5}}, "kernelModuleParameters.nvidia"),
        ({"nvidia": "NVreg_EnableGpuFirmware=1"}, "kernelModuleParameters.nvidia"),
    ],
)
def test_a_parameter_of_the_wrong_shape_is_refused_by_the_policy_and_the_crd(
    raw: dict[str, Any], expected: str
) -> None:
    wire = spec({"kernelModuleParameters": raw})
    found = problems(wire)
    assert any(expected in p for p in found), found
    assert_schema_agrees(wire)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"nvidia_foo": {"x": 1}}, "kernelModuleParameters.nvidia_foo: unknown field"),
        ({"nvidia": {"NVreg-Enable": 1}}, "must be a parameter name"),
        ({"nvidia": {"NVreg_RegistryDwords": "a=1; b=2"}}, "without blanks, quotes"),
        ({"nvidia": {"NVreg_RegistryDwords": 'a="1"'}}, "without blanks, quotes"),
        ({"nvidia": {"NVreg_RegistryDwords": ""}}, "without blanks, quotes"),
    ],
)
def test_a_parameter_name_or_text_modprobe_would_misread_is_refused_when_the_policy_is_read(
    raw: dict[str, Any], expected: str
) -> None:
    found = problems(spec({"kernelModuleParameters": raw}))
    assert len(found) == 1 and expected in found[0], found
    assert found[0].startswith("spec.driver.gpu.kernelModuleParameters.nvidia")  # the API
    # server would prune an unknown module and cannot check a map's keys: the model does


def test_declared_parameters_of_the_right_type_are_taken() -> None:
    wanted = {
        "nvidia": {
            "NVreg_EnableGpuFirmware": 0,
            "NVreg_NvLinkDisable": "0x1",
            "NVreg_RegistryDwords": "RMUseSwI2c=0x01;RMI2cSpeed=100",
        },
        "nvidia_uvm": {"uvm_disable_hmm": "Y"},
        "nvidia_drm": {"modeset": 1},
    }
    assert parameters.check_declared(given(wanted), DECLARED) == []
    assert parameters.check_declared(None, DECLARED) == []


def test_a_misspelt_parameter_is_refused_with_the_nearest_declared_names() -> None:
    found = parameters.check_declared(
        given({"nvidia": {"NVreg_EnableGpuFirmwre": 0, "nvreg_enablepciegen3": 1}}), DECLARED
    )
    assert found == [
        "nvidia: no parameter NVreg_EnableGpuFirmwre; did you mean NVreg_EnableGpuFirmware or "
        "NVreg_EnableGpuFirmwareLogs or NVreg_EnablePCIeGen3? (8 declared)",
        "nvidia: no parameter nvreg_enablepciegen3; did you mean NVreg_EnablePCIeGen3 or "
        "NVreg_EnableGpuFirmware or NVreg_EnableStreamMemOPs? (8 declared)",
    ]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            {"nvidia": {"NVreg_EnableGpuFirmware": "Y"}},
            "nvidia.NVreg_EnableGpuFirmware: is an uint",
        ),
        ({"nvidia": {"NVreg_EnableGpuFirmware": -1}}, "is an uint: at least 0, not -1"),
        ({"nvidia": {"NVreg_EnableGpuFirmware": "on"}}, "an integer, not 'on'"),
        ({"nvidia_uvm": {"uvm_disable_hmm": 2}}, "nvidia_uvm.uvm_disable_hmm: is a bool"),
        ({"nvidia_uvm": {"uvm_disable_hmm": "true"}}, "is a bool: Y or N"),
        ({"nvidia_peermem": {"peerdirect_support": 1}}, "nvidia_peermem: the package has no such"),
    ],
)
def test_a_value_of_another_type_or_a_module_the_package_lacks_is_refused(
    raw: dict[str, Any], expected: str
) -> None:
    found = parameters.check_declared(given(raw), DECLARED)
    assert len(found) == 1 and expected in found[0], found


def test_array_parameters_check_each_element() -> None:
    declared = {"nvidia": {"NVreg_Ids": "array of uint"}}
    assert parameters.check_declared(given({"nvidia": {"NVreg_Ids": "1,2,0x3"}}), declared) == []
    found = parameters.check_declared(given({"nvidia": {"NVreg_Ids": "1,x"}}), declared)
    assert found and "an integer, not 'x'" in found[0]
