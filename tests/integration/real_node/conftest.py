"""One real node for the real-node suites (module scope): a control plane without KWOK (its
manage-all-nodes would take the real node over) and the node registered with it
(`tests.support.real_node`), its host root a simulated node's with 8 GPUs; the apiserver
advertised at the node's address, which the node relays to it, so pods reach it through the
`kubernetes` Service. DNS leaving the machine is captured for the whole module; the node's
stop is checked to leave nothing behind."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import real_node
from tests.support.control_plane import ControlPlane
from tests.support.dns_capture import DnsCapture
from tests.support.fleet import create_nodes
from tests.support.real_node import RealNode

GPUS = 8


@pytest.fixture(scope="module")
def dns_capture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DnsCapture]:
    """Every DNS packet (port 53) on the machine's own interfaces, from before the node
    starts; the module's last test reads it."""
    with DnsCapture(tmp_path_factory.mktemp("dns-capture")) as capture:
        yield capture


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, dns_capture: DnsCapture) -> Iterator[RealNode]:
    with started_node(tmp_path_factory, kwok=False) as running:
        yield running


@contextmanager
def started_node(
    tmp_path_factory: pytest.TempPathFactory, gpus: int = GPUS, **plane: Any
) -> Iterator[RealNode]:
    """A control plane (`plane`: its options) with the real node of `gpus` GPUs registered;
    the node's stop is checked to leave nothing behind."""
    absent = real_node.missing()
    if absent:
        pytest.fail("the real node needs: " + ", ".join(absent))
    with ControlPlane(
        tmp_path_factory.mktemp("control-plane"), advertise=real_node.NODE_IP, **plane
    ) as started:
        running = RealNode(started, tmp_path_factory.mktemp("real-node"), gpus=gpus)
        with running:
            yield running
        left = running.leftovers()
        assert left == [], f"the real node left behind: {left}"


@dataclass
class Cluster:
    """The real node among KWOK nodes on one control plane."""

    plane: ControlPlane
    node: RealNode
    kwok: list[str]


@contextmanager
def started_cluster(
    tmp_path_factory: pytest.TempPathFactory, *, gpus: int = GPUS, kwok_nodes: int = 2
) -> Iterator[Cluster]:
    """The control plane with KWOK managing its own nodes only, the real node (`gpus`
    simulated GPUs, labelled a GPU node as discovery's cluster role labels one) and
    `kwok_nodes` KWOK GPU nodes of 8 GPUs."""
    with started_node(tmp_path_factory, gpus=gpus, kwok_fake_only=True) as node:
        kwok = create_nodes(node.plane, kwok_nodes, GPUS, workloads=False)
        patch = {"metadata": {"labels": {"nvidia.com/gpu.present": "true"}}}
        node.plane.call(
            "PATCH", f"/api/v1/nodes/{node.name}", patch,
            content_type="application/merge-patch+json",
        )  # fmt: skip
        yield Cluster(node.plane, node, kwok)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The module's control plane and node start inside the first test's time."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(400))
