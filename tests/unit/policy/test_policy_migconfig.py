"""mig-parted's config format: what parses, what mig-parted would refuse (named by config and
entry), and a config resolved to one layout per GPU of a node."""

from __future__ import annotations

import textwrap

import pytest

from gpuop.events.hardware import MigInstance, MigMode
from gpuop.events.mig_commands import GpuMigLayout, MigDeviceCount
from gpuop.policy import migconfig
from gpuop.policy.migconfig import GpuFacts, MigConfigError, ProfileShape
from tests.support.inventories import H200 as H200_GPU

H200 = "0x233510DE"
H200_SHAPES = {
    "1g.18gb": ProfileShape(1, 7),
    "1g.18gb+me": ProfileShape(1, 1),
    "1g.35gb": ProfileShape(1, 4),
    "2g.35gb": ProfileShape(2, 3),
    "3g.71gb": ProfileShape(3, 2),
    "4g.71gb": ProfileShape(4, 1),
    "7g.141gb": ProfileShape(7, 1),
}
NODE = [GpuFacts(i, H200, H200_SHAPES) for i in range(8)]


def config(body: str) -> str:
    return "version: v1\nmig-configs:\n" + textwrap.indent(textwrap.dedent(body), "  ")


MIXED = config(
    """
    split:
      - devices: [0, 1]
        device-filter: ["0x233510de"]
        mig-enabled: true
        mig-devices: {"3g.71gb": 1, "1g.18gb": 2}
      - devices: [2, 3]
        mig-enabled: false
    """
)


def test_a_config_resolves_to_a_layout_per_selected_gpu() -> None:
    layouts = migconfig.resolve(migconfig.parse(MIXED), "split", NODE)
    carved = (
        MigDeviceCount(profile="1g.18gb", count=2),
        MigDeviceCount(profile="3g.71gb", count=1),
    )
    assert layouts == (
        GpuMigLayout(gpu_index=0, mig_enabled=True, devices=carved),
        GpuMigLayout(gpu_index=1, mig_enabled=True, devices=carved),
        GpuMigLayout(gpu_index=2, mig_enabled=False),
        GpuMigLayout(gpu_index=3, mig_enabled=False),
    )


def test_the_default_file_has_upstreams_h200_configs() -> None:
    file = migconfig.load_default()
    assert {"all-disabled", "all-enabled", "all-1g.18gb", "all-balanced", "all-7g.141gb"} <= set(
        file.names()
    )
    for name in file.names():
        layouts = migconfig.resolve(file, name, NODE)
        assert [layout.gpu_index for layout in layouts] == list(range(8)), name
    (first, *_) = migconfig.resolve(file, "all-balanced", NODE)
    assert migconfig.layout_devices(first) == {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}


def test_a_device_filter_skips_other_models_and_takes_subsystem_ids() -> None:
    file = migconfig.load_default()
    nvl = [GpuFacts(0, "0x233B10DE", H200_SHAPES), GpuFacts(1, "0x20B510DE")]
    assert [lay.gpu_index for lay in migconfig.resolve(file, "all-1g.18gb", nvl)] == [0]
    assert migconfig.resolve(file, "all-1g.35gb", nvl) == ()  # filtered to the H200 141 GB
    with_subsystem = config(
        """
        c:
          - devices: all
            device-filter: "0x233510DE:0x18BF10DE"
            mig-enabled: false
        """
    )
    assert len(migconfig.resolve(migconfig.parse(with_subsystem), "c", NODE)) == 8


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("version: v2\nmig-configs: {a: [{devices: all, mig-enabled: false}]}", "version must"),
        ("version: v1\nmig-configs: {}", "at least one config"),
        ("version: v1\nextra: 1\nmig-configs: {a: []}", "unknown key"),
        ("version: v1\nmig-configs: {a: []}", "a: a config is a non-empty list"),
        ("version: v1\nmig-configs: {a: [{mig-enabled: false}]}", r"a\[0\]: `devices` is required"),
        ("version: v1\nmig-configs: {a: [{devices: all}]}", r"a\[0\]: `mig-enabled` is required"),
        (
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true}]}",
            "`mig-devices` is required when MIG is enabled",
        ),
        (
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false, "
            "mig-devices: {1g.18gb: 1}}]}",
            "must be empty when MIG is disabled",
        ),
        (
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true}, "
            "{devices: [0, 0], mig-enabled: false}]}",
            r"a\[0\]: `mig-devices` is required",
        ),
        (
            "version: v1\nmig-configs: {a: [{devices: [1, 1], mig-enabled: false}]}",
            "listed twice",
        ),
        ("version: v1\nmig-configs: {a: [{devices: [-1], mig-enabled: false}]}", "whole numbers"),
        (
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, "
            "mig-devices: {huge: 1}}]}",
            "'huge' is not a MIG profile",
        ),
        (
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, "
            "mig-devices: {1g.18gb: 0}}]}",
            "count of 1g.18gb must be a whole number >= 1",
        ),
        (
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, "
            "mig-devices: {1g.18gb: 9}}]}",
            "9 of 1g.18gb: no GPU fits more than 7",
        ),
        (
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false, "
            "device-filter: [2335]}]}",
            "`device-filter` is a PCI id",
        ),
        (
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false, colour: red}]}",
            r"a\[0\]: unknown key\(s\): colour",
        ),
        ("version: v1\nmig-configs: [oops", "not YAML"),
        ("- a\n- b", "a mapping"),
    ],
)
def test_what_mig_parted_refuses_is_refused(text: str, complaint: str) -> None:
    with pytest.raises(MigConfigError, match=complaint):
        migconfig.parse(text)


def entry(devices: str, mig: str) -> str:
    return config(
        f"""
        c:
          - devices: {devices}
            mig-enabled: true
            mig-devices: {mig}
        """
    )


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        (entry("all", '{"1g.10gb": 1}'), r"c\[0\]: GPU 0 has no MIG profile 1g.10gb"),
        (entry("all", '{"3g.71gb": 3}'), r"c\[0\]: GPU 0 fits at most 2 of 3g.71gb, not 3"),
        (
            entry("all", '{"4g.71gb": 1, "3g.71gb": 1, "1g.18gb": 1}'),
            "need 8 compute slices, more than the 7",
        ),
        (entry("[8]", '{"1g.18gb": 1}'), r"c\[0\]: no GPU at index \[8\] \(the node has 8\)"),
        (entry("all", '{"1c.2g.35gb": 2}'), "compute-instance profiles are not supported"),
    ],
)
def test_a_layout_the_gpus_cannot_take_names_the_entry(text: str, complaint: str) -> None:
    with pytest.raises(MigConfigError, match=complaint):
        migconfig.resolve(migconfig.parse(text), "c", NODE)


def test_a_gpu_two_entries_select_is_refused() -> None:
    text = config(
        """
        c:
          - devices: all
            mig-enabled: false
          - devices: [3]
            mig-enabled: false
        """
    )
    with pytest.raises(MigConfigError, match=r"c\[1\]: GPU 3 is selected by c\[0\] already"):
        migconfig.resolve(migconfig.parse(text), "c", NODE)


def test_an_unknown_config_name_lists_the_known_ones() -> None:
    with pytest.raises(MigConfigError, match=r"no MIG config named 'nope'.*all-balanced"):
        migconfig.resolve(migconfig.load_default(), "nope", NODE)


def test_unknown_profiles_pass_when_the_gpu_profiles_are_not_known() -> None:
    text = entry("all", '{"1g.10gb": 7}')
    (layout,) = migconfig.resolve(migconfig.parse(text), "c", [GpuFacts(0)])
    assert layout.devices == (MigDeviceCount(profile="1g.10gb", count=7),)


def test_the_node_checks_a_resolved_layout_against_its_own_profiles() -> None:
    layout = GpuMigLayout(
        gpu_index=0, mig_enabled=True, devices=(MigDeviceCount(profile="7g.141gb", count=2),)
    )
    with pytest.raises(MigConfigError, match="all-7g GPU 0: GPU 0 fits at most 1"):
        migconfig.check(layout, NODE[0], "all-7g")
    assert migconfig.pci_id("10de", "2335") == H200


def test_an_inventoried_gpu_reads_as_the_layout_a_config_would_give() -> None:
    def instance(profile: str, n: int) -> MigInstance:
        return MigInstance(
            uuid=f"MIG-{n:08d}-0000-0000-0000-000000000000",
            profile=profile,
            gpu_instance_slices=int(profile[0]),
            compute_instance_slices=int(profile[0]),
            memory_bytes=2**34,
            multiprocessors=16,
        )

    gpu = H200_GPU.model_copy(
        update={
            "mig_mode": MigMode.ENABLED,
            "mig_devices": (instance("3g.71gb", 1), instance("1g.18gb", 2), instance("1g.18gb", 3)),
        }
    )
    (wanted,) = migconfig.resolve(
        migconfig.parse(entry("[0]", '{"1g.18gb": 2, "3g.71gb": 1}')), "c", NODE
    )
    assert migconfig.inventory_layout(gpu) == wanted
    assert migconfig.inventory_layout(H200_GPU) == GpuMigLayout(gpu_index=0, mig_enabled=False)
