"""The real control plane for the real-cluster suites: one per session (etcd,
kube-apiserver, kube-controller-manager, kube-scheduler and KWOK, from `make
cluster-tools`), with three KWOK GPU nodes. Tests that change the cluster work in a namespace
of their own or on objects named after the test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kubernetes.aio import client, config

from tests.support import fleet
from tests.support.control_plane import ControlPlane

NODES, GPUS = 3, 8


@pytest.fixture(scope="session")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with ControlPlane(tmp_path_factory.mktemp("control-plane")) as running:
        fleet.create_nodes(running, NODES, GPUS)
        yield running


@pytest.fixture
async def api(plane: ControlPlane, tmp_path: Path) -> AsyncIterator[client.ApiClient]:
    """The official asyncio client as the cluster's admin."""
    configuration = client.Configuration()
    kubeconfig = plane.write_kubeconfig(tmp_path / "admin.kubeconfig")
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    async with client.ApiClient(configuration) as api_client:
        yield api_client


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The session's control plane starts inside the first test's time: give every test of
    this directory room for it (the default is 60 s)."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(300))
