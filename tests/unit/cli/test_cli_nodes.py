"""The node-reading commands' flags (`gpuop.cli.nodes`): a flag wins over the environment,
the environment over the default; a host root that is no directory is refused."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path
from typing import Any

import pytest

from gpuop.cli import nodes
from gpuop.runtime.settings import SettingsError


def parsed(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    nodes.add_host_root(parser)
    nodes.add_nvml(parser)
    return parser.parse_args(list(flags))


def test_the_host_root_comes_from_the_flag_then_the_environment(tmp_path: Path) -> None:
    flag, env = tmp_path / "flag", tmp_path / "env"
    flag.mkdir()
    env.mkdir()
    assert nodes.host_root(parsed("--host-root", str(flag)), {"GPUOP_HOST_ROOT": str(env)}) == flag
    assert nodes.host_root(parsed(), {"GPUOP_HOST_ROOT": str(env)}) == env


def test_a_host_root_that_is_no_directory_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SettingsError, match=f"--host-root {tmp_path / 'absent'}: no such"):
        nodes.host_root(parsed("--host-root", str(tmp_path / "absent")), {})
    # the default, wherever this machine has or lacks a /host
    monkeypatch.setattr(nodes, "DEFAULT_HOST_ROOT", tmp_path / "host")
    with pytest.raises(SettingsError, match=f"--host-root {tmp_path / 'host'}: no such directory"):
        nodes.host_root(parsed(), {})


def test_nvml_and_the_node_come_from_the_flags_then_the_environment_then_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(nodes, "open_backend", lambda spec, **kwargs: opened.append((spec, kwargs)))
    env = {"GPUOP_NVML": "sim:2", "GPUOP_NODE": "env-node"}
    nodes.open_nvml(parsed("--nvml", "sim:4", "--node", "n1"), env, tmp_path, "holder")
    nodes.open_nvml(parsed(), env, tmp_path, "holder")
    nodes.open_nvml(parsed(), {}, tmp_path, "holder")
    expected = {"host_root": tmp_path, "holder_id": "holder"}
    assert opened == [
        ("sim:4", {**expected, "node": "n1"}),
        ("sim:2", {**expected, "node": "env-node"}),
        ("real", {**expected, "node": socket.gethostname()}),
    ]
