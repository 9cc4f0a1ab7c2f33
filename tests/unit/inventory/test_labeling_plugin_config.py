"""The sharing labels follow the device plugin config in force on the node, as GFD's follow
the config it shares with the plugin: replicas, sharing strategy, and the product's
`-SHARED` (not for a renamed resource)."""

from __future__ import annotations

import pytest

from gpuop.events.device import ConfigOutcome, DevicePluginConfigApplied, SharingStrategy
from gpuop.inventory.labeling import LabelSettings, MigStrategy, labels_for, with_plugin_config
from tests.support.inventories import inventory

SHARING = ("nvidia.com/gpu.replicas", "nvidia.com/gpu.sharing-strategy", "nvidia.com/gpu.product")


def applied(
    replicas: int = 1,
    strategy: SharingStrategy = SharingStrategy.NONE,
    *,
    renamed: bool = False,
    outcome: ConfigOutcome = ConfigOutcome.SELECTED,
) -> DevicePluginConfigApplied:
    return DevicePluginConfigApplied(
        config="shared" if replicas > 1 else "exclusive",
        requested="shared" if replicas > 1 else None,
        outcome=outcome,
        replicas=replicas,
        sharing_strategy=strategy,
        renamed=renamed,
    )


def sharing_labels(settings: LabelSettings) -> tuple[str, ...]:
    labels = labels_for(inventory(), settings)
    return tuple(labels[key] for key in SHARING)


@pytest.mark.parametrize(
    ("report", "expected"),
    [
        (applied(), ("1", "none", "NVIDIA-H200")),
        (applied(4, SharingStrategy.TIME_SLICING), ("4", "time-slicing", "NVIDIA-H200-SHARED")),
        # upstream: a renamed resource (nvidia.com/gpu.shared) keeps the plain product
        (
            applied(2, SharingStrategy.TIME_SLICING, renamed=True),
            ("2", "time-slicing", "NVIDIA-H200"),
        ),
        # the default after a label naming no config: what it shares, as any other
        (
            applied(8, SharingStrategy.TIME_SLICING, outcome=ConfigOutcome.UNKNOWN),
            ("8", "time-slicing", "NVIDIA-H200-SHARED"),
        ),
    ],
)
def test_the_labels_of_the_config_in_force(
    report: DevicePluginConfigApplied, expected: tuple[str, str, str]
) -> None:
    assert sharing_labels(with_plugin_config(LabelSettings(), report)) == expected


def test_the_plugins_report_overrides_discoverys_own_replicas() -> None:
    own = LabelSettings(mig_strategy=MigStrategy.MIXED, replicas=4)
    assert sharing_labels(own) == ("4", "time-slicing", "NVIDIA-H200-SHARED")

    settings = with_plugin_config(own, applied())
    assert sharing_labels(settings) == ("1", "none", "NVIDIA-H200")
    assert settings.mig_strategy is MigStrategy.MIXED, "the rest of the settings stay"


def test_without_a_report_discoverys_own_settings_hold() -> None:
    own = LabelSettings(replicas=2)
    assert with_plugin_config(own, None) is own


def test_a_report_of_no_sharing_whatever_its_replicas_is_unshared() -> None:
    odd = applied(3, SharingStrategy.NONE)
    assert sharing_labels(with_plugin_config(LabelSettings(), odd)) == ("1", "none", "NVIDIA-H200")
