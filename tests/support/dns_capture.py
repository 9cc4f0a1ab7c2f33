"""Every DNS packet (UDP or TCP port 53) on the machine's own network interfaces, for as long
as a block runs: one `tcpdump` (Debian's package) per interface that was there when it
started, loopback and the real node's own links left out (what stays on them stays on the
machine). A test that must send nothing off the machine asserts `packets()` is empty, or,
on a machine shared with other work, that none of `queries()` is a name it could have asked."""

from __future__ import annotations

import re
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.control_plane import Component, Launcher

OWN_LINKS = ("lo", "gpuop-", "veth", "cni")
"""Prefixes of links whose traffic never leaves the machine."""
START_TIMEOUT = 30.0
IFF_UP = 0x1
_PACKET = re.compile(r"^\d\d:\d\d:\d\d\.\d+ ")
"""A packet's line in tcpdump's output (its other lines say what it listens on)."""
_QUESTION = re.compile(r" [A-Z0-9]+\? (\S+?)\.? \(")
"""A query's name in tcpdump's line: `... 25561+ A? pypi.org. (26)`."""


class CaptureError(RuntimeError):
    """tcpdump is missing or did not start."""


def outward_interfaces() -> list[str]:
    """The machine's interfaces a packet could leave by: those up (a link down sends
    nothing; tcpdump refuses it), loopback and the node's own left out."""
    return sorted(
        link.name
        for link in Path("/sys/class/net").iterdir()
        if not link.name.startswith(OWN_LINKS) and int((link / "flags").read_text(), 16) & IFF_UP
    )


@dataclass
class DnsCapture(Launcher):
    """`with DnsCapture(work) as capture: ...; capture.packets()`."""

    work: Path
    interfaces: list[str] = field(default_factory=outward_interfaces)
    components: list[Component] = field(default_factory=list)

    def start(self) -> None:
        tcpdump = shutil.which("tcpdump", path="/usr/sbin:/usr/bin:/sbin:/bin")
        if tcpdump is None:
            raise CaptureError("tcpdump is missing: apt-get install tcpdump")
        self.work.mkdir(parents=True, exist_ok=True)
        for interface in self.interfaces:
            self._spawn(
                interface,
                [tcpdump, "-i", interface, "-n", "-l", "-p", "--immediate-mode", "port 53"],
            )
        deadline = time.monotonic() + START_TIMEOUT
        for component in self.components:
            while "listening on" not in component.tail():
                self._check_running()
                if time.monotonic() > deadline:
                    raise CaptureError(f"tcpdump on {component.name}: {component.tail(500)}")
                time.sleep(0.05)

    def stop(self) -> None:
        for component in reversed(list(self.components)):
            self._stop_component(component, signal.SIGINT)  # tcpdump flushes what it saw

    def queries(self) -> list[str]:
        """The names asked in the captured queries (answers left out), as written."""
        return [found.group(1) for line in self.packets() if (found := _QUESTION.search(line))]

    def packets(self) -> list[str]:
        """What was captured so far, one line per packet, `interface: line`."""
        lines = []
        for interface in self.interfaces:
            log = self.work / f"{interface}.log"
            if log.exists():
                lines += [
                    f"{interface}: {line}"
                    for line in log.read_text().splitlines()
                    if _PACKET.match(line)
                ]
        return lines
