"""The --config file: upstream's keys, defaults, and errors that name the key at fault."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuop.health import APPLICATION_XIDS
from gpuop.runtime.settings import SettingsError
from gpuop.services.device_plugin.config import (
    DeviceListStrategy,
    MigStrategy,
    load_config,
    load_configs,
)

UPSTREAM = """\
version: v1
flags:
  migStrategy: mixed
  plugin:
    deviceListStrategy: envvar,cdi
    passDeviceSpecs: true
sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: true
    resources:
      - name: nvidia.com/gpu
        replicas: 10
health:
  ignoredXids: [13, 43]
rdma:
  configList:
    - resourceName: roce_shared
      rdmaHcaMax: 64
      selectors: {vendors: ["15B3"], deviceIDs: ["1017"], drivers: [mlx5_core], linkTypes: [ether]}
    - resourceName: ib
      resourcePrefix: example.com
      rdmaHcaMax: 8
      devices: [ib0]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "device-plugin.yaml"
    path.write_text(text)
    return path


def test_no_file_gives_upstreams_defaults() -> None:
    config = load_config(None)
    assert config.flags.mig_strategy is MigStrategy.NONE
    assert config.flags.plugin.device_list_strategy == (DeviceListStrategy.ENVVAR,)
    assert config.health.ignored_xids == APPLICATION_XIDS == (13, 31, 43, 45, 68, 109)
    assert config.sharing.time_slicing.replicas("nvidia.com/gpu") == 1
    assert config.rdma.config_list == ()


def test_an_upstream_style_file_is_read_with_its_own_key_names(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, UPSTREAM))
    assert config.flags.mig_strategy is MigStrategy.MIXED
    assert config.flags.plugin.device_list_strategy == (
        DeviceListStrategy.ENVVAR,
        DeviceListStrategy.CDI,
    )
    assert config.flags.plugin.pass_device_specs
    slicing = config.sharing.time_slicing
    assert slicing.rename_by_default and slicing.fail_requests_greater_than_one
    assert slicing.replicas("nvidia.com/gpu") == 10
    assert config.health.ignored_xids == (13, 43)
    roce, ib = config.rdma.config_list
    assert roce.name == "rdma/roce_shared"
    assert roce.selectors.vendors == ("15b3",)
    assert roce.selectors.device_ids == ("1017",)
    assert ib.name == "example.com/ib"
    assert ib.effective_selectors().if_names == ("ib0",)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (
            "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 0}]}}",
            "sharing.timeSlicing.resources.0.replicas",
        ),
        (
            "sharing: {timeSlicing: {resources: [{name: amd.com/gpu, replicas: 2}]}}",
            "sharing.timeSlicing.resources.0.name",
        ),
        (
            "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2},"
            " {name: nvidia.com/gpu, replicas: 4}]}}",
            "sharing.timeSlicing.resources",
        ),
        ("flags: {migStrategy: half}", "flags.migStrategy"),
        (
            "flags: {plugin: {deviceListStrategy: volume-mounts}}",
            "flags.plugin.deviceListStrategy.0",
        ),
        ("flags: {plugin: {deviceListStrategy: []}}", "flags.plugin.deviceListStrategy"),
        ("flags: {plugn: {}}", "flags.plugn"),
        ("health: {ignoredXids: [-1]}", "health.ignoredXids.0"),
        ("version: v2", "version"),
        ("rdma: {configList: [{resourceName: a, rdmaHcaMax: 4}]}", "rdma.configList.0"),
        (
            "rdma: {configList: [{resourceName: a, rdmaHcaMax: 4, selectors: {vendors: [15b]}}]}",
            "rdma.configList.0.selectors.vendors",
        ),
        (
            "rdma: {configList: [{resourceName: a, rdmaHcaMax: 4, selectors: {linkTypes: [ib]}}]}",
            "rdma.configList.0.selectors.linkTypes.0",
        ),
        (
            "rdma: {configList: [{resourceName: a/b, rdmaHcaMax: 4, devices: [ib0]}]}",
            "rdma.configList.0.resourceName",
        ),
        ("rdma: {configList: [{resourceName: a, devices: [ib0]}]}", "rdma.configList.0.rdmaHcaMax"),
    ],
)
def test_a_wrong_value_is_refused_naming_its_key(tmp_path: Path, text: str, named: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(SettingsError) as refused:
        load_config(path)
    assert str(refused.value).startswith(f"--config {path}: {named}:")


def test_a_file_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="expected a mapping"):
        load_config(write(tmp_path, "- migStrategy: mixed\n"))


def test_a_file_that_is_not_yaml_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="cannot read it"):
        load_config(write(tmp_path, "flags: {migStrategy: [\n"))


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="cannot read it"):
        load_config(tmp_path / "absent.yaml")


def test_the_kubelet_root_dir_defaults_to_the_kubelets_and_is_read_from_flags(
    tmp_path: Path,
) -> None:
    assert load_configs(None).kubelet_root_dir == "var/lib/kubelet"
    path = write(tmp_path, "flags: {kubeletRootDir: /data/kubelet/}\n")
    assert load_configs(path).kubelet_root_dir == "data/kubelet"


@pytest.mark.parametrize("root", ["data/kubelet", "/data/../etc"])
def test_a_kubelet_root_dir_that_is_not_an_absolute_host_path_is_refused(
    tmp_path: Path, root: str
) -> None:
    path = write(tmp_path, f"flags: {{kubeletRootDir: '{root}'}}\n")
    with pytest.raises(SettingsError, match=r"flags\.kubeletRootDir: .*absolute host path"):
        load_configs(path)


def test_named_configs_that_name_two_kubelet_root_dirs_are_refused(tmp_path: Path) -> None:
    text = "configs:\n  a: {flags: {kubeletRootDir: /data/kubelet}}\n  b: {}\ndefault: a\n"
    with pytest.raises(SettingsError, match=r"the same in every config, not /data/kubelet, /var"):
        load_configs(write(tmp_path, text))
    same = text.replace("b: {}", "b: {flags: {kubeletRootDir: /data/kubelet}}")
    assert load_configs(write(tmp_path, same)).kubelet_root_dir == "data/kubelet"
