"""The DNS capture the real-node suites rely on sees a query that leaves by an interface it
watches (so its empty answer in test_real_node means something): a veth pair made here
stands for the machine's uplink."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.dns_capture import DnsCapture

pytestmark = [pytest.mark.real_node]

LINK, PEER = "dnscapt0", "dnscapt1"


@pytest.fixture
def uplink() -> Iterator[str]:
    subprocess.run(["ip", "link", "add", LINK, "type", "veth", "peer", "name", PEER], check=True)
    try:
        for link in (LINK, PEER):
            subprocess.run(["ip", "link", "set", link, "up"], check=True)
        subprocess.run(["ip", "addr", "add", "10.199.9.1/30", "dev", LINK], check=True)
        # a neighbour that never answers ARP: the query goes out at once
        neighbour = ["lladdr", "02:00:00:00:00:01", "dev", LINK, "nud", "permanent"]
        subprocess.run(["ip", "neigh", "add", "10.199.9.2", *neighbour], check=True)
        yield LINK
    finally:
        subprocess.run(["ip", "link", "del", LINK], check=False)


def test_a_query_leaving_by_a_watched_interface_is_captured(uplink: str, tmp_path: Path) -> None:
    query = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"  # a header, no question
    with (
        DnsCapture(tmp_path, interfaces=[uplink]) as capture,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock,
    ):
        sock.sendto(query, ("10.199.9.2", 53))
    assert any("10.199.9.2.53" in line for line in capture.packets()), capture.packets()
