"""RDMA shared devices: the host's HCAs from sysfs, selectors, and Allocate's device nodes."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gpuop.host.roots import HostRoot
from gpuop.services.device_plugin import hcas
from gpuop.services.device_plugin.config import RdmaResourceConfig
from gpuop.services.device_plugin.errors import AllocationError
from gpuop.services.device_plugin.rdma import rdma_resources
from tests.support.device_plugin import add_hca, config


@pytest.fixture
def root(tmp_path: Path) -> HostRoot:
    add_hca(
        tmp_path,
        "mlx5_0",
        address="0000:3b:00.0",
        interfaces=("ens1f0",),
        uverbs=0,
    )
    add_hca(
        tmp_path,
        "mlx5_1",
        address="0000:3b:00.1",
        device="101b",
        link_layers=("InfiniBand",),
        interfaces=("ib0",),
        uverbs=1,
        umad=1,
    )
    return HostRoot(tmp_path)


def rdma(*entries: dict[str, object]) -> list[RdmaResourceConfig]:
    return list(config({"rdma": {"configList": list(entries)}}).rdma.config_list)


def test_the_hcas_are_read_from_sysfs(root: HostRoot) -> None:
    roce, ib = hcas.hcas(root)
    assert roce == hcas.Hca(
        name="mlx5_0",
        pci_address="0000:3b:00.0",
        vendor="15b3",
        device="1017",
        driver="mlx5_core",
        link_types=("ether",),
        interfaces=("ens1f0",),
        character_devices=("/dev/infiniband/uverbs0",),
    )
    assert ib.link_types == ("infiniband",)
    assert ib.character_devices == ("/dev/infiniband/umad1", "/dev/infiniband/uverbs1")


def test_a_host_without_rdma_has_no_hca(tmp_path: Path) -> None:
    assert hcas.hcas(HostRoot(tmp_path)) == ()


@pytest.mark.parametrize(
    ("selectors", "picked"),
    [
        ({"vendors": ["15b3"]}, ["mlx5_0", "mlx5_1"]),
        ({"linkTypes": ["ether"]}, ["mlx5_0"]),
        ({"vendors": ["15b3"], "deviceIDs": ["101b", "1021"]}, ["mlx5_1"]),
        ({"drivers": ["mlx5_core"], "ifNames": ["ib0", "ens9"]}, ["mlx5_1"]),
    ],
)
def test_selectors_or_within_and_across(
    root: HostRoot, selectors: dict[str, list[str]], picked: list[str]
) -> None:
    (resource,) = rdma_resources(
        root, rdma({"resourceName": "shared", "rdmaHcaMax": 3, "selectors": selectors})
    )
    assert [hca.name for hca in resource.hcas] == picked
    assert resource.name == "rdma/shared"
    assert [device.id for device in resource.devices] == ["0", "1", "2"]


def test_allocate_mounts_the_selected_hcas_device_nodes(root: HostRoot) -> None:
    (resource,) = rdma_resources(
        root, rdma({"resourceName": "shared", "rdmaHcaMax": 8, "selectors": {"vendors": ["15b3"]}})
    )
    response = resource.allocate(["5"])
    assert [(d.host_path, d.container_path, d.permissions) for d in response.devices] == [
        (path, path, "rwm")
        for path in (
            "/dev/infiniband/uverbs0",
            "/dev/infiniband/umad1",
            "/dev/infiniband/uverbs1",
            "/dev/infiniband/rdma_cm",
        )
    ]
    with pytest.raises(AllocationError, match="unknown device id '8'"):
        resource.allocate(["8"])


def test_a_selection_of_nothing_advertises_nothing_and_says_why(
    root: HostRoot, caplog: pytest.LogCaptureFixture
) -> None:
    entry = {"resourceName": "ib", "rdmaHcaMax": 4, "devices": ["ib7"]}
    with caplog.at_level(logging.INFO):
        (resource,) = rdma_resources(root, rdma(entry))
    assert resource.devices == ()
    assert "HCA mlx5_1 not selected by ifNames ['ib7'] (it has ['ib0'])" in caplog.text
    assert "selects none of the 2 RDMA devices" in caplog.text
