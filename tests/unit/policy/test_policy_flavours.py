"""`driver.gpu.kernelModuleType` and its resolution per node (`gpuop.policy.flavours`): the
`auto` table as NVIDIA's installer decides, the PCI device ids that stand in for NVML while no
driver is loaded, the recorded H200 (Hopper), and the field's validation."""

from __future__ import annotations

import pytest

from gpuop.events.driver import Flavour
from gpuop.events.hardware import Gpu, HardwareDiscovered, MigMode, PciFunction
from gpuop.host.roots import HostRoot
from gpuop.inventory import scanning
from gpuop.policy import PolicyInvalid, validate_spec
from gpuop.policy.flavours import (
    architecture_of,
    branch_of,
    gpu_architectures,
    recommended,
    resolve,
)
from gpuop_sim import recordings

OPEN, PROPRIETARY = Flavour.OPEN, Flavour.PROPRIETARY


@pytest.mark.parametrize(
    ("architectures", "version", "grace_hopper", "flavour"),
    [
        # rule 1: a GPU that runs only the open modules decides, whatever the branch
        (("blackwell",), "535.261.03", False, OPEN),
        (("rubin",), "580.159.04", False, OPEN),
        (("blackwell", "volta"), "580.159.04", False, OPEN),  # required wins, as upstream
        (("hopper",), "535.261.03", True, OPEN),  # Grace Hopper
        # rule 2: a GPU the open modules do not support
        (("volta",), "580.159.04", False, PROPRIETARY),
        (("pascal",), "535.261.03", False, PROPRIETARY),
        (("maxwell",), "570.1", False, PROPRIETARY),
        (("hopper", "volta"), "580.159.04", False, PROPRIETARY),
        # rule 3: Turing to Hopper follow the branch
        (("hopper",), "580.159.04", False, OPEN),
        (("hopper",), "560.28.03", False, OPEN),
        (("hopper",), "555.42.06", False, PROPRIETARY),
        (("hopper",), "535.261.03", False, PROPRIETARY),
        (("turing",), "570.86.15", False, OPEN),
        (("ampere", "ada-lovelace"), "550.1", False, PROPRIETARY),
        # rule 4: no known GPU: the branch alone, the driver container's fallback
        ((), "580.159.04", False, OPEN),
        ((), "535.261.03", False, PROPRIETARY),
        ((), "not-a-branch", False, PROPRIETARY),
    ],
)
def test_auto_picks_the_flavour_nvidias_installer_recommends(
    architectures: tuple[str, ...], version: str, grace_hopper: bool, flavour: Flavour
) -> None:
    assert recommended(architectures, version, grace_hopper=grace_hopper).flavour is flavour


@pytest.mark.parametrize(
    ("device_id", "architecture"),
    [
        ("2335", "hopper"),  # H200, as recorded
        ("2330", "hopper"),  # H100 SXM5
        ("20b0", "ampere"),  # A100
        ("2236", "ampere"),  # A10
        ("1eb8", "turing"),  # T4
        ("2182", "turing"),  # TU116
        ("1db4", "volta"),  # V100
        ("15f8", "pascal"),  # P100
        ("13bb", "maxwell"),
        ("1024", "kepler"),  # K40
        ("26b9", "ada-lovelace"),  # L40S
        ("27b8", "ada-lovelace"),  # L4
        ("2901", "blackwell"),  # B200
        ("2b85", "blackwell"),  # RTX 5090
        ("3182", "blackwell"),  # newer than the table: Blackwell or later
        ("0df8", None),  # Fermi, below the table
        ("zzzz", None),
    ],
)
def test_a_pci_device_id_names_its_architecture(device_id: str, architecture: str | None) -> None:
    assert architecture_of(device_id) == architecture


def test_the_branch_is_the_versions_first_number() -> None:
    assert (branch_of("580.159.04"), branch_of("535"), branch_of("r580.1")) == (580, 535, None)


def inventory(*functions: tuple[str, str, str], gpus: tuple[Gpu, ...] = ()) -> HardwareDiscovered:
    """An inventory with PCI functions given as (address, device id, class id), NVIDIA's."""
    return HardwareDiscovered(
        gpus=gpus,
        pci_functions=tuple(
            PciFunction(
                address=address,
                vendor_id="10de",
                device_id=device,
                class_id=class_id,
                subsystem_vendor_id="10de",
                subsystem_device_id="0000",
            )
            for address, device, class_id in functions
        ),
        kernel_release="6.1.0-57-amd64",
        machine="x86_64",
        boot_id="8c1f2f5e-0c53-4d57-a0a4-3e3c1b0c9a11",
        inventory_hash="0" * 64,
    )


def gpu(address: str, architecture: str | None, model: str = "NVIDIA H200") -> Gpu:
    return Gpu(
        uuid="GPU-20bce083-dbf9-2d4f-3c35-c858915accc5",
        index=0,
        minor_number=0,
        pci_bus_id=address,
        model_name=model,
        memory_bytes=1 << 30,
        mig_mode=MigMode.DISABLED,
        compute_capability="9.0",
        architecture=architecture,
    )


def test_without_a_driver_the_pci_ids_of_display_functions_stand_in_for_nvml() -> None:
    node = inventory(
        ("0000:00:06.0", "2335", "030200"),  # H200, 3D controller
        ("0000:00:07.0", "1db4", "040300"),  # an audio function: no GPU
        ("0000:00:08.0", "22a3", "068000"),  # an NVSwitch: no GPU
    )

    assert gpu_architectures(node) == ("hopper",)
    assert resolve("auto", node, "535.261.03").flavour is PROPRIETARY
    assert resolve("auto", node, "580.159.04").flavour is OPEN


def test_nvmls_architecture_wins_over_the_device_id() -> None:
    node = inventory(
        ("0000:00:06.0", "2335", "030200"),
        gpus=(gpu("0000:00:06.0", "blackwell"),),
    )

    assert gpu_architectures(node) == ("blackwell",)
    assert resolve("auto", node, "535.261.03").flavour is OPEN


def test_a_grace_hopper_runs_only_open_modules_by_device_id_or_name() -> None:
    by_id = inventory(("0009:01:00.0", "2342", "030200"))
    by_name = inventory(gpus=(gpu("0009:01:00.0", "hopper", "NVIDIA GH200 480GB"),))

    for node in (by_id, by_name):
        resolution = resolve("auto", node, "535.261.03")
        assert resolution.flavour is OPEN
        assert "grace-hopper" in resolution.reason


def test_an_explicit_kernel_module_type_is_taken_as_it_is() -> None:
    volta = inventory(("0000:00:06.0", "1db4", "030200"))
    blackwell = inventory(("0000:00:06.0", "2901", "030200"))

    assert resolve("open", volta, "535.261.03").flavour is OPEN
    assert resolve("proprietary", blackwell, "580.159.04").flavour is PROPRIETARY
    assert resolve("auto", None, "580.159.04").flavour is OPEN  # not reported yet


def test_the_recorded_h200_is_hopper_and_runs_the_open_modules() -> None:
    recorded = scanning.scan(HostRoot(recordings.H200_HOST_ROOT), None)

    assert gpu_architectures(recorded) == ("hopper",)
    assert recorded.driver_flavour is OPEN  # "NVIDIA UNIX Open Kernel Module" in procfs
    assert resolve("auto", recorded, recorded.driver_version or "").flavour is OPEN
    assert resolve("auto", recorded, "535.261.03").flavour is PROPRIETARY


def test_kernel_module_type_defaults_to_auto_per_component_and_pool() -> None:
    spec = validate_spec(
        {
            "driver": {
                "gpu": {"version": "580.159.04", "kernelModuleType": "open"},
                "pools": [
                    {"name": "old", "nodeSelector": "gen=volta", "gpu": {"version": "535.1"}}
                ],
            }
        }
    )

    assert spec.driver.gpu.kernel_module_type == "open"
    assert spec.driver.components_of("old")[0].kernel_module_type == "auto"
    assert spec.to_wire()["driver"]["gpu"]["kernelModuleType"] == "open"


@pytest.mark.parametrize("value", ["Open", "closed", "", 1])
def test_an_unknown_kernel_module_type_is_refused_naming_the_choices(value: object) -> None:
    with pytest.raises(PolicyInvalid) as refused:
        validate_spec({"driver": {"gpu": {"version": "580.1", "kernelModuleType": value}}})

    message = str(refused.value)
    assert "driver.gpu.kernelModuleType" in message
    assert "'auto', 'open' or 'proprietary'" in message


def test_ofed_has_no_kernel_module_type() -> None:
    with pytest.raises(PolicyInvalid) as refused:
        validate_spec(
            {
                "driver": {
                    "gpu": {"version": "580.1"},
                    "ofed": {"version": "24.10-1.1.4.0", "kernelModuleType": "open"},
                }
            }
        )

    assert "driver.ofed.kernelModuleType" in str(refused.value)
