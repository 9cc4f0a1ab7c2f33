"""Settings: flags over GPUOP_* variables over defaults, and errors that name the flag."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from gpuop.runtime import services
from gpuop.runtime import settings as settings_module
from gpuop.runtime.launching import check_role
from gpuop.runtime.settings import Role, Settings, SettingsError, load, load_config_file


def test_flags_win_over_environment_which_wins_over_defaults() -> None:
    environ = {
        "GPUOP_NODE": "from-env",
        "GPUOP_NATS": "nats://a:1, nats://b:2",
        "GPUOP_NVML": "sim:4",
    }
    settings = load({"service": "discovery", "node": "from-flag"}, environ)
    assert settings.node == "from-flag"
    assert settings.nats == ("nats://a:1", "nats://b:2")
    assert settings.nvml == "sim:4"
    assert settings.host_root == Path("/host")
    assert settings.role is Role.NODE


def test_the_replica_count_comes_from_the_flag_or_the_environment() -> None:
    assert load({"service": "discovery", "node": "n1"}, {}).nats_replicas == 1
    environ = {"GPUOP_NATS_REPLICAS": "3"}
    assert load({"service": "discovery", "node": "n1"}, environ).nats_replicas == 3
    flags = {"service": "discovery", "node": "n1", "nats_replicas": 5}
    assert load(flags, environ).nats_replicas == 5


def test_the_store_budget_comes_from_the_flag_or_the_environment() -> None:
    assert load({"service": "discovery", "node": "n1"}, {}).nats_store_bytes == 6 << 30
    environ = {"GPUOP_NATS_STORE_BYTES": str(3 << 30)}
    assert load({"service": "discovery", "node": "n1"}, environ).nats_store_bytes == 3 << 30


def test_node_role_requires_a_node_name() -> None:
    with pytest.raises(SettingsError, match="--node"):
        load({"service": "discovery"}, {})


@pytest.mark.parametrize(
    ("flags", "flag"),
    [
        ({"node": "Bad_Name"}, "--node"),
        ({"node": "n1", "nvml": "gpu"}, "--nvml"),
        ({"node": "n1", "metrics_listen": "nowhere"}, "--metrics-listen"),
        ({"node": "n1", "prefix": "a.b"}, "--prefix"),
        ({"node": "n1", "role": "edge"}, "--role"),
        ({"node": "n1", "nats_replicas": "7"}, "--nats-replicas"),
        ({"node": "n1", "nats_replicas": "0"}, "--nats-replicas"),
        ({"node": "n1", "nats_store_bytes": "1000"}, "--nats-store-bytes"),
        ({"node": "n1", "nats_store_bytes": "6GiB"}, "--nats-store-bytes"),
    ],
)
def test_invalid_values_name_the_flag(flags: dict[str, str], flag: str) -> None:
    with pytest.raises(SettingsError, match=flag):
        load({"service": "discovery", **flags}, {})


def test_listen_address_parses_ipv4_and_ipv6() -> None:
    assert load(
        {"service": "x", "role": "cluster", "metrics_listen": "0.0.0.0:9400"}, {}
    ).listen_address == ("0.0.0.0", 9400)
    assert load(
        {"service": "x", "role": "cluster", "metrics_listen": "[::1]:80"}, {}
    ).listen_address == ("::1", 80)


def test_all_six_services_are_installed_with_their_roles() -> None:
    installed = services.installed()
    assert sorted(installed) == [
        "device-plugin", "discovery", "driver-manager", "network-manager",
        "telemetry", "upgrade-orchestrator",
    ]  # fmt: skip
    assert installed["upgrade-orchestrator"].roles == {Role.CLUSTER}
    assert installed["driver-manager"].roles == {Role.NODE}


def test_a_service_refuses_a_role_it_does_not_have() -> None:
    settings = load({"service": "driver-manager", "role": "cluster"}, {})
    with pytest.raises(SettingsError, match="driver-manager has no cluster role"):
        check_role(services.lookup("driver-manager"), settings)


def test_unknown_service_lists_the_installed_ones() -> None:
    with pytest.raises(services.UnknownService, match="installed: device-plugin"):
        services.lookup("gpu-fixer")


class _Knobs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    interval_seconds: float = 30.0


def test_config_file_defaults_values_and_errors_naming_the_file(tmp_path: Path) -> None:
    assert load_config_file(None, _Knobs).interval_seconds == 30.0
    good = tmp_path / "good.yaml"
    good.write_text("interval_seconds: 2\n")
    assert load_config_file(good, _Knobs).interval_seconds == 2.0
    as_json = tmp_path / "good.json"
    as_json.write_text('{"interval_seconds": 3}')
    assert load_config_file(as_json, _Knobs).interval_seconds == 3.0
    for name, text, message in [
        ("typo.yaml", "intervl_seconds: 2\n", "intervl_seconds"),
        ("list.yaml", "- 1\n", "expected a mapping"),
        ("broken.yaml", "a: [\n", "cannot read it"),
    ]:
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(SettingsError, match=message) as raised:
            load_config_file(path, _Knobs)
        assert str(path) in str(raised.value)
    with pytest.raises(SettingsError, match="cannot read it"):
        load_config_file(tmp_path / "missing.yaml", _Knobs)


def test_a_node_role_names_its_missing_node_and_host_root(tmp_path: Path) -> None:
    settings = Settings(service="discovery", host_root=tmp_path / "missing")

    with pytest.raises(SettingsError, match="--node is required"):
        settings.require_node()
    with pytest.raises(SettingsError, match=r"--host-root .*missing: no such directory"):
        settings.require_host_root()
    found = settings.model_copy(update={"node": "gpu-1", "host_root": tmp_path})
    assert (found.require_node(), found.require_host_root()) == ("gpu-1", tmp_path)


def test_a_missing_default_host_root_says_which_flag_to_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    absent = tmp_path / "host"
    monkeypatch.setattr(settings_module, "DEFAULT_HOST_ROOT", absent)

    with pytest.raises(SettingsError) as raised:
        Settings(service="network-manager", host_root=absent).require_host_root()

    assert f"--host-root {absent}: no such directory (the default" in str(raised.value)
    assert "pass --host-root DIR or set GPUOP_HOST_ROOT" in str(raised.value)
