"""network-manager's `--config` file and its service definition."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuop.runtime import services
from gpuop.runtime.settings import Role, SettingsError
from gpuop.services import network_manager
from gpuop.services.network_manager import config


def test_the_defaults_suit_a_real_node() -> None:
    settings = config.load_config(None)

    assert settings.netns is None
    assert (settings.resync_interval_seconds, settings.retry_interval_seconds) == (300.0, 5.0)


def test_a_simulated_node_names_its_namespace(tmp_path: Path) -> None:
    path = tmp_path / "network-manager.yaml"
    path.write_text("netns: gpu-node-1\nresync_interval_seconds: 30\n")

    assert config.load_config(path).netns == "gpu-node-1"


@pytest.mark.parametrize(
    ("text", "wrong"),
    [
        ("netns: ../../etc\n", "netns"),
        ("resync_interval_seconds: 0\n", "resync_interval_seconds"),
        ("netnss: x\n", "netnss"),
    ],
)
def test_a_wrong_key_is_refused_by_name(tmp_path: Path, text: str, wrong: str) -> None:
    path = tmp_path / "network-manager.yaml"
    path.write_text(text)

    with pytest.raises(SettingsError, match=wrong):
        config.load_config(path)


def test_the_service_is_built_with_both_roles() -> None:
    definition = services.lookup("network-manager")

    assert definition is network_manager.SERVICE
    assert definition.main is not None
    assert definition.roles == {Role.NODE, Role.CLUSTER}
