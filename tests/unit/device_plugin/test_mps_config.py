"""`sharing.mps` in the --config file: upstream's shape, its defaults, and the configs it
refuses, each with an error that names the key and says why."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuop.runtime.settings import SettingsError
from gpuop.services.device_plugin.config import (
    DEFAULT_MPS_ROOT,
    MPS_MAX_REPLICAS,
    load_config,
    load_configs,
)

UPSTREAM_MPS = """\
version: v1
flags:
  migStrategy: mixed
sharing:
  mps:
    renameByDefault: true
    resources:
      - name: nvidia.com/gpu
        replicas: 10
        devices: all
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "device-plugin.yaml"
    path.write_text(text)
    return path


def refusal(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(SettingsError) as refused:
        load_config(path)
    message = str(refused.value)
    assert message.startswith(f"--config {path}: ")
    return message.removeprefix(f"--config {path}: ")


def test_an_upstream_mps_file_is_read_with_its_own_key_names(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, UPSTREAM_MPS))
    sharing = config.sharing
    assert sharing.uses_mps
    assert sharing.replicas("nvidia.com/gpu") == 10
    assert sharing.rename_by_default
    # upstream: a container is one MPS client, so a request for more than one replica
    # fails unless the config says otherwise
    assert sharing.fail_requests_greater_than_one
    assert sharing.time_slicing.replicas("nvidia.com/gpu") == 1
    assert config.flags.mps_root == DEFAULT_MPS_ROOT == "/run/nvidia/mps"


def test_fail_requests_greater_than_one_may_be_turned_off_for_mps(tmp_path: Path) -> None:
    text = (
        "sharing: {mps: {failRequestsGreaterThanOne: false,"
        " resources: [{name: nvidia.com/gpu, replicas: 2}]}}\n"
        "flags: {mpsRoot: /var/run/mps/}\n"
    )
    config = load_config(write(tmp_path, text))
    assert not config.sharing.fail_requests_greater_than_one
    assert config.flags.mps_root == "/var/run/mps"


def test_time_slicing_keeps_its_own_default_for_requests_over_one(tmp_path: Path) -> None:
    text = "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2}]}}"
    sharing = load_config(write(tmp_path, text)).sharing
    assert not sharing.uses_mps
    assert not sharing.fail_requests_greater_than_one


def test_an_mps_section_without_resources_shares_nothing(tmp_path: Path) -> None:
    sharing = load_config(write(tmp_path, "sharing: {mps: {}}")).sharing
    assert not sharing.uses_mps
    assert sharing.replicas("nvidia.com/gpu") == 1


def test_mps_and_time_slicing_together_are_refused_naming_both_keys(tmp_path: Path) -> None:
    message = refusal(
        tmp_path,
        "sharing:\n"
        "  timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2}]}\n"
        "  mps: {resources: [{name: nvidia.com/gpu, replicas: 2}]}\n",
    )
    assert message.startswith("sharing: ")
    assert "sharing.timeSlicing and sharing.mps are exclusive" in message


@pytest.mark.parametrize("replicas", [0, 1])
def test_fewer_than_two_mps_replicas_are_refused(tmp_path: Path, replicas: int) -> None:
    message = refusal(
        tmp_path,
        f"sharing: {{mps: {{resources: [{{name: nvidia.com/gpu, replicas: {replicas}}}]}}}}",
    )
    assert message.startswith("sharing.mps.resources.0.replicas: ")
    assert f"MPS needs at least 2 replicas ({replicas} shares nothing)" in message


def test_more_mps_replicas_than_an_mps_server_takes_are_refused(tmp_path: Path) -> None:
    too_many = MPS_MAX_REPLICAS + 1
    message = refusal(
        tmp_path,
        f"sharing: {{mps: {{resources: [{{name: nvidia.com/gpu, replicas: {too_many}}}]}}}}",
    )
    assert message.startswith("sharing.mps.resources.0.replicas: ")
    assert f"at most 48 clients, not {too_many}" in message


def test_a_mig_resource_under_mps_is_refused(tmp_path: Path) -> None:
    message = refusal(
        tmp_path,
        "flags: {migStrategy: mixed}\n"
        "sharing: {mps: {resources: [{name: nvidia.com/mig-1g.18gb, replicas: 2}]}}",
    )
    assert message.startswith("sharing.mps.resources.0.name: ")
    assert "MPS does not share MIG devices" in message
    assert "sharing.timeSlicing" in message, "says what shares MIG devices"


def test_mps_under_the_single_mig_strategy_is_refused(tmp_path: Path) -> None:
    message = refusal(
        tmp_path,
        "flags: {migStrategy: single}\n"
        "sharing: {mps: {resources: [{name: nvidia.com/gpu, replicas: 2}]}}",
    )
    assert "sharing.mps with flags.migStrategy single" in message
    assert "MPS does not share MIG devices" in message


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (
            "sharing: {mps: {resources: [{name: amd.com/gpu, replicas: 2}]}}",
            "sharing.mps.resources.0.name",
        ),
        (
            "sharing: {mps: {resources: [{name: nvidia.com/gpu, replicas: 2, devices: [0, 1]}]}}",
            "sharing.mps.resources.0.devices",
        ),
        (
            "sharing: {mps: {resources: [{name: nvidia.com/gpu, replicas: 2},"
            " {name: nvidia.com/gpu, replicas: 4}]}}",
            "sharing.mps.resources",
        ),
        ("sharing: {mps: {renameByDefult: true}}", "sharing.mps.renameByDefult"),
        ("flags: {mpsRoot: run/mps}", "flags.mpsRoot"),
        ("flags: {mpsRoot: /run/../etc}", "flags.mpsRoot"),
    ],
)
def test_a_wrong_mps_value_is_refused_naming_its_key(tmp_path: Path, text: str, named: str) -> None:
    assert refusal(tmp_path, text).startswith(f"{named}: ")


def test_a_named_mps_config_names_its_config_in_the_error(tmp_path: Path) -> None:
    text = (
        "configs:\n  mps-4: {sharing: {mps: {resources: [{name: nvidia.com/gpu, replicas: 1}]}}}\n"
    )
    path = write(tmp_path, text)
    with pytest.raises(SettingsError, match=r"configs\.mps-4\.sharing\.mps\.resources\.0"):
        load_configs(path)


@pytest.mark.parametrize("strategy", ["mps", "timeSlicing"])
def test_a_resource_listed_twice_is_refused_under_either_sharing(
    tmp_path: Path, strategy: str
) -> None:
    twice = "[{name: nvidia.com/gpu, replicas: 2}, {name: nvidia.com/gpu, replicas: 4}]"
    message = refusal(tmp_path, f"sharing:\n  {strategy}:\n    resources: {twice}\n")
    assert f"sharing.{strategy}.resources" in message
    assert "nvidia.com/gpu listed more than once" in message
