"""Named configs: the file's two forms, its errors, and which config a node's label selects."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuop.events.device import ConfigOutcome, SharingStrategy
from gpuop.runtime.settings import SettingsError
from gpuop.services.device_plugin import selecting
from gpuop.services.device_plugin.config import (
    DEFAULT_NAME,
    DevicePluginConfig,
    MigStrategy,
    PluginConfigs,
    load_configs,
)
from tests.support.device_plugin import config

NAMED = """\
default: exclusive
configs:
  exclusive: {}
  shared:
    sharing:
      timeSlicing:
        resources: [{name: nvidia.com/gpu, replicas: 4}]
  mig-mixed:
    flags: {migStrategy: mixed}
"""
SHARED_4 = {"sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "device-plugin.yaml"
    path.write_text(text)
    return path


def named(default: str = "a", **configs: DevicePluginConfig) -> PluginConfigs:
    return PluginConfigs(configs, default, named=True)


def test_a_named_file_holds_each_config_and_the_default(tmp_path: Path) -> None:
    configs = load_configs(write(tmp_path, NAMED))
    assert configs.named
    assert sorted(configs.configs) == ["exclusive", "mig-mixed", "shared"]
    assert configs.default == "exclusive"
    assert configs.default_config == DevicePluginConfig()
    assert configs.configs["shared"].sharing.time_slicing.replicas("nvidia.com/gpu") == 4
    assert configs.configs["mig-mixed"].flags.mig_strategy is MigStrategy.MIXED


def test_a_single_config_file_is_still_what_every_node_runs(tmp_path: Path) -> None:
    configs = load_configs(write(tmp_path, "flags: {migStrategy: single}\n"))
    assert not configs.named
    assert list(configs.configs) == [DEFAULT_NAME] and configs.default == DEFAULT_NAME
    assert configs.default_config.flags.mig_strategy is MigStrategy.SINGLE
    assert load_configs(None) == PluginConfigs.single(DevicePluginConfig())


@pytest.mark.parametrize(
    ("text", "default"),
    [
        ("configs: {default: {}, other: {}}", "default"),  # upstream's fallback name
        ("configs: {only: {}}", "only"),  # the single config
    ],
)
def test_without_a_default_the_one_named_default_or_the_only_one_is(
    tmp_path: Path, text: str, default: str
) -> None:
    assert load_configs(write(tmp_path, text)).default == default


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (
            "configs: {a: {sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu,"
            " replicas: 0}]}}}}",
            "configs.a.sharing.timeSlicing.resources.0.replicas",
        ),
        ("configs: {a: {flags: {migStrategy: half}}}", "configs.a.flags.migStrategy"),
        ("configs: {a: {flgs: {}}}", "configs.a.flgs"),
        ("default: c\nconfigs: {a: {}, b: {}}", "default: Value error, 'c' is not one of"),
        ("configs: {a: {}, b: {}}", "default: Value error, name the default config: one of a, b"),
        ("configs: {Tesla_T4: {}}", "configs.Tesla_T4.[key]: Value error, 'Tesla_T4' is not a"),
        ("configs: {}", "configs: Dictionary should have at least 1 item"),
        ("configs: {a: {}}\nflags: {}", "flags: Extra inputs are not permitted"),
        ("configs: [a]", "configs: Input should be a valid dictionary"),
    ],
)
def test_a_wrong_named_file_names_the_config_and_key(tmp_path: Path, text: str, named: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(SettingsError) as error:
        load_configs(path)
    assert str(error.value).startswith(f"--config {path}: {named}")


@pytest.mark.parametrize("text", ["configs: {a: [\n", "- configs\n"])
def test_an_unreadable_file_is_refused(tmp_path: Path, text: str) -> None:
    with pytest.raises(SettingsError, match="--config"):
        load_configs(write(tmp_path, text))


def test_the_label_selects_its_config() -> None:
    shared = config(SHARED_4)
    chosen = selecting.select(named(a=config(), b=shared), "b")
    assert (chosen.name, chosen.config, chosen.requested) == ("b", shared, "b")
    assert chosen.outcome is ConfigOutcome.SELECTED and chosen.problem is None


@pytest.mark.parametrize("label", [None, ""])
def test_no_label_selects_the_default(label: str | None) -> None:
    chosen = selecting.select(named(a=config(), b=config(SHARED_4)), label)
    assert (chosen.name, chosen.requested, chosen.outcome) == ("a", None, ConfigOutcome.DEFAULT)


def test_a_label_naming_no_config_falls_back_to_the_default_with_the_reason() -> None:
    chosen = selecting.select(named("b", a=config(), b=config(SHARED_4)), "tesla-t4")
    assert (chosen.name, chosen.requested) == ("b", "tesla-t4")
    assert chosen.outcome is ConfigOutcome.UNKNOWN
    assert chosen.problem == (
        "nvidia.com/device-plugin.config=tesla-t4 names no config (there are a, b)"
    )


def test_a_single_config_answers_any_label_but_its_own_name_as_unknown() -> None:
    single = PluginConfigs.single(config(SHARED_4))
    assert selecting.select(single, "default").outcome is ConfigOutcome.SELECTED
    chosen = selecting.select(single, "shared")
    assert (chosen.name, chosen.outcome) == ("default", ConfigOutcome.UNKNOWN)
    assert chosen.problem is not None and "holds a single config" in chosen.problem


def test_a_refused_switch_keeps_the_config_in_force() -> None:
    current = selecting.select(named(a=config(), b=config(SHARED_4)), "b")
    answer = selecting.refused(current, "a", "--config x: configs.a.flags: ...")
    assert (answer.name, answer.config) == ("b", current.config)
    assert (answer.requested, answer.outcome) == ("a", ConfigOutcome.REFUSED)
    assert answer.problem == "--config x: configs.a.flags: ..."


def test_the_default_must_be_one_of_the_configs() -> None:
    with pytest.raises(ValueError, match="not one of the configs"):
        PluginConfigs({"a": config()}, "b")


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ({}, selecting.Sharing()),
        (SHARED_4, selecting.Sharing(4, SharingStrategy.TIME_SLICING)),
        (
            {
                "sharing": {
                    "timeSlicing": {
                        "renameByDefault": True,
                        "resources": [{"name": "nvidia.com/gpu", "replicas": 2}],
                    }
                }
            },
            selecting.Sharing(2, SharingStrategy.TIME_SLICING, renamed=True),
        ),
        (
            {  # only a MIG resource shared: nvidia.com/gpu itself is not
                "flags": {"migStrategy": "mixed"},
                "sharing": {
                    "timeSlicing": {
                        "renameByDefault": True,
                        "resources": [{"name": "nvidia.com/mig-1g.18gb", "replicas": 2}],
                    }
                },
            },
            selecting.Sharing(),
        ),
    ],
)
def test_sharing_is_what_the_config_does_to_nvidia_gpu(
    document: dict[str, object], expected: selecting.Sharing
) -> None:
    assert selecting.sharing(config(document)) == expected
