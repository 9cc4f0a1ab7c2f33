"""The kubelet's root directory (`nodeAgents.kubeletRootDir`): the device plugin's and
telemetry's mounts of its plugin, registration and PodResources directories follow it, and
so do their configs (`flags.kubeletRootDir` in every device plugin config, telemetry's
`kubelet_root_dir`), which the services' own loaders read; a config naming another root
is refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from gpuop.services.device_plugin import config as device_plugin_config
from gpuop.services.telemetry import config as telemetry_config
from tests.support.charts import Rendering, render, render_with

ROOT = "/data/kubelet"
MOVED = {"nodeAgents": {"kubeletRootDir": ROOT + "/"}}


def host_paths(rendering: Rendering, agent: str) -> dict[str, str]:
    """The agent's hostPath volumes' paths on the node, by their mount path in the container."""
    spec = rendering.get("DaemonSet", f"gpuop-{agent}")["spec"]["template"]["spec"]
    volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    (container,) = spec["containers"]
    return {
        m["mountPath"]: volumes[m["name"]]
        for m in container["volumeMounts"]
        if m["name"] in volumes
    }


def config_file(rendering: Rendering, service: str, tmp_path: Path) -> Path:
    config_map = rendering.get("ConfigMap", f"gpuop-{service}-config")
    path = tmp_path / f"{service}.yaml"
    path.write_text(config_map["data"]["config.yaml"], encoding="utf-8")
    return path


def kubelet_mounts(rendering: Rendering, agent: str) -> dict[str, str]:
    return {
        mount: path for mount, path in host_paths(rendering, agent).items() if "kubelet" in mount
    }


def test_by_default_the_agents_mount_var_lib_kubelet_and_their_configs_say_so(
    tmp_path: Path,
) -> None:
    rendering = render("defaults")

    assert kubelet_mounts(rendering, "device-plugin") == {
        f"/host/var/lib/kubelet/{d}": f"/var/lib/kubelet/{d}"
        for d in ("device-plugins", "pod-resources", "plugins_registry", "plugins")
    }
    assert kubelet_mounts(rendering, "telemetry") == {
        "/host/var/lib/kubelet/pod-resources": "/var/lib/kubelet/pod-resources"
    }
    plugin = device_plugin_config.load_configs(config_file(rendering, "device-plugin", tmp_path))
    assert plugin.kubelet_root_dir == "var/lib/kubelet"
    telemetry = telemetry_config.load_config(config_file(rendering, "telemetry", tmp_path))
    assert telemetry.socket_under(Path("/host")) == Path(
        "/host/var/lib/kubelet/pod-resources/kubelet.sock"
    )


def test_the_kubelet_root_dir_moves_the_mounts_and_the_configs_alike(tmp_path: Path) -> None:
    rendering = render_with(MOVED)

    # the device plugin API's directory is the kubelet's fixed one, whatever its root
    moved = ("pod-resources", "plugins_registry", "plugins")
    assert kubelet_mounts(rendering, "device-plugin") == {
        "/host/var/lib/kubelet/device-plugins": "/var/lib/kubelet/device-plugins",
        **{f"/host{ROOT}/{d}": f"{ROOT}/{d}" for d in moved},
    }
    assert kubelet_mounts(rendering, "telemetry") == {
        f"/host{ROOT}/pod-resources": f"{ROOT}/pod-resources"
    }
    plugin = device_plugin_config.load_configs(config_file(rendering, "device-plugin", tmp_path))
    assert plugin.kubelet_root_dir == ROOT.lstrip("/")
    telemetry = telemetry_config.load_config(config_file(rendering, "telemetry", tmp_path))
    assert telemetry.socket_under(Path("/host")) == Path(f"/host{ROOT}/pod-resources/kubelet.sock")


def test_under_a_host_root_the_kubelet_directories_are_mounted_from_it() -> None:
    rendering = render_with({"nodeAgents": {"hostRoot": "/sim/node", "kubeletRootDir": ROOT}})

    assert host_paths(rendering, "telemetry")[f"/host{ROOT}/pod-resources"] == (
        f"/sim/node{ROOT}/pod-resources"
    )


def test_every_named_device_plugin_config_gets_the_kubelet_root_dir(tmp_path: Path) -> None:
    named: dict[str, Any] = {
        "default": "plain",
        "configs": {"plain": {}, "sliced": {"flags": {"migStrategy": "single"}}},
    }
    rendering = render_with({**MOVED, "devicePlugin": {"config": named}})

    loaded = yaml.safe_load(
        rendering.get("ConfigMap", "gpuop-device-plugin-config")["data"]["config.yaml"]
    )
    plugin = device_plugin_config.load_configs(config_file(rendering, "device-plugin", tmp_path))

    assert {name: c["flags"]["kubeletRootDir"] for name, c in loaded["configs"].items()} == {
        "plain": ROOT,
        "sliced": ROOT,
    }
    assert loaded["configs"]["sliced"]["flags"]["migStrategy"] == "single"
    assert plugin.kubelet_root_dir == ROOT.lstrip("/")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"devicePlugin": {"config": {"flags": {"kubeletRootDir": ROOT}}}},
            'devicePlugin.config.flags.kubeletRootDir "/data/kubelet" is not '
            'nodeAgents.kubeletRootDir "/var/lib/kubelet"',
        ),
        (
            {"devicePlugin": {"config": {"configs": {"a": {"flags": {"kubeletRootDir": ROOT}}}}}},
            "devicePlugin.config.configs.a.flags.kubeletRootDir",
        ),
        (
            {"telemetry": {"config": {"kubelet_root_dir": ROOT}}},
            'telemetry.config.kubelet_root_dir "/data/kubelet" is not',
        ),
        (
            {"nodeAgents": {"kubeletRootDir": "data/kubelet"}},
            "nodeAgents.kubeletRootDir must be an absolute path without '..' (the kubelet's "
            '--root-dir), not "data/kubelet"',
        ),
    ],
)
def test_a_kubelet_root_dir_set_elsewhere_or_relative_fails_by_name(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmError) as refused:
        render_with(overrides)

    assert message in str(refused.value)


def test_a_config_naming_the_same_root_is_accepted() -> None:
    same = {**MOVED, "telemetry": {"config": {"kubelet_root_dir": ROOT}}}

    rendering = render_with(same)

    config = rendering.get("ConfigMap", "gpuop-telemetry-config")["data"]["config.yaml"]
    assert yaml.safe_load(config)["kubelet_root_dir"] == ROOT
