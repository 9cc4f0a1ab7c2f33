"""A nats-server behind a link the test can cut: a network namespace joined to the host by a
veth pair (this kernel has no dummy devices), the host end and the namespace end each with an
address of a private /30. Cutting the link drops every packet without closing a connection,
which is what a partition does."""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise AssertionError(
            f"ip {' '.join(args)} failed ({done.stderr.strip()}): these tests need root and "
            "iproute2 (apt-get install -y iproute2)"
        )


@dataclass(frozen=True)
class Link:
    """A namespace and the veth pair that joins it to the host."""

    netns: str
    host_end: str
    host_ip: str
    inner_ip: str

    @property
    def prefix(self) -> list[str]:
        """The command that runs a program inside the namespace."""
        return ["ip", "netns", "exec", self.netns]

    def cut(self) -> None:
        _ip("link", "set", self.host_end, "down")

    def heal(self) -> None:
        _ip("link", "set", self.host_end, "up")


@contextlib.contextmanager
def link(subnet: int = 77) -> Iterator[Link]:
    """A namespace reachable at 10.`subnet`.0.2 from the host's 10.`subnet`.0.1; removed (with
    its veth pair) on exit."""
    tag = uuid.uuid4().hex[:6]
    netns, host_end, inner_end = f"gpuop-part-{tag}", f"gph{tag}", f"gpn{tag}"
    host_ip, inner_ip = f"10.{subnet}.0.1", f"10.{subnet}.0.2"
    _ip("netns", "add", netns)
    try:
        _ip("link", "add", host_end, "type", "veth", "peer", "name", inner_end)
        _ip("link", "set", inner_end, "netns", netns)
        _ip("addr", "add", f"{host_ip}/30", "dev", host_end)
        _ip("link", "set", host_end, "up")
        _ip("-n", netns, "addr", "add", f"{inner_ip}/30", "dev", inner_end)
        _ip("-n", netns, "link", "set", inner_end, "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        yield Link(netns, host_end, host_ip, inner_ip)
    finally:
        subprocess.run(["ip", "link", "del", host_end], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", netns], capture_output=True, check=False)
