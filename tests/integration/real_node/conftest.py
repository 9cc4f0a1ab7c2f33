"""One real node for the real-node suites (module scope): a control plane without KWOK (its
manage-all-nodes would take the real node over) and the node registered with it
(`tests.support.real_node`), its host root a simulated node's with 8 GPUs; the apiserver
advertised at the node's address, which the node relays to it, so pods reach it through the
`kubernetes` Service. DNS leaving the machine is captured for the whole module; the node's
stop is checked to leave nothing behind."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support import real_node
from tests.support.control_plane import ControlPlane
from tests.support.dns_capture import DnsCapture
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
def started_node(tmp_path_factory: pytest.TempPathFactory, **plane: Any) -> Iterator[RealNode]:
    """A control plane (`plane`: its options) with the real node of `GPUS` GPUs registered;
    the node's stop is checked to leave nothing behind."""
    absent = real_node.missing()
    if absent:
        pytest.fail("the real node needs: " + ", ".join(absent))
    with ControlPlane(
        tmp_path_factory.mktemp("control-plane"), advertise=real_node.NODE_IP, **plane
    ) as started:
        running = RealNode(started, tmp_path_factory.mktemp("real-node"), gpus=GPUS)
        with running:
            yield running
        left = running.leftovers()
        assert left == [], f"the real node left behind: {left}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The module's control plane and node start inside the first test's time."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(400))
