"""The node's links through rtnetlink (pyroute2's `AsyncIPRoute`), in the namespace the
settings name: what is there (`Snapshot`), and the few changes network-manager makes.

`applying.NodeNetworks` opens one `Netlink` session per pass (`async with Netlink(netns)`):
it reads a `Snapshot` (links, their global addresses, the links default routes leave by),
decides, then creates, changes or deletes links and addresses. A namespace is never created
here (pyroute2 would by default, `flags=0` stops it): a missing one is `NetnsMissing`.
Kernel refusals become `NetlinkFailure` with the errno, so nothing above this module sees
pyroute2's exceptions.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from ipaddress import IPv4Interface, IPv6Interface
from typing import Any

from pyroute2 import AsyncIPRoute
from pyroute2.netlink.exceptions import NetlinkError

from gpuop import lifecycles

Interface = IPv4Interface | IPv6Interface

IFF_UP = 1
MAIN_TABLE = 254
UNIVERSE_SCOPE = 0
IPVLAN_MODES = {"l2": 0, "l3": 1, "l3s": 2}
"""ipvlan modes as the kernel numbers them (`IPVLAN_MODE_*`)."""


class NetlinkFailure(Exception):
    """The kernel refused a request; `code` is the errno (17 EEXIST, 22 EINVAL, 95
    EOPNOTSUPP: no such link driver)."""

    def __init__(self, action: str, code: int, detail: str = "") -> None:
        name = "EOPNOTSUPP" if code == errno.EOPNOTSUPP else errno.errorcode.get(code, str(code))
        message = f"{action}: {detail or os.strerror(code)} ({name})"
        super().__init__(message)
        self.code = code
        self.message = message


class NetnsMissing(NetlinkFailure):
    """The network namespace the settings name does not exist."""

    def __init__(self, netns: str) -> None:
        super().__init__(f"network namespace {netns}", errno.ENOENT, "does not exist")


@dataclass(frozen=True)
class Link:
    """One link as the kernel reports it."""

    index: int
    name: str
    kind: str | None
    """`macvlan`, `ipvlan`, `veth`, `bond`, ...; None for a physical NIC."""
    mtu: int
    up: bool
    """Administratively up (IFF_UP)."""
    lower: int | None = None
    """The link it is stacked on (IFLA_LINK): a macvlan's NIC; a veth's peer."""
    master: int | None = None
    """The bond or bridge it is enslaved to (IFLA_MASTER)."""
    alias: str | None = None
    """IFLA_IFALIAS, where gpuop marks the links it owns."""
    mode: str | None = None
    """A macvlan's or ipvlan's mode: `bridge`, `l2`, ..."""
    addresses: tuple[Interface, ...] = ()
    """Global-scope addresses, with their prefix lengths."""


@dataclass(frozen=True)
class Snapshot:
    """The namespace's links, and which of them a default route leaves by."""

    links: tuple[Link, ...]
    default_routes: frozenset[int]
    """Indexes of the links of every IPv4 and IPv6 default route in the main table."""

    def named(self, name: str) -> Link | None:
        return next((link for link in self.links if link.name == name), None)

    def at(self, index: int | None) -> Link | None:
        return next((link for link in self.links if link.index == index), None)


class Netlink(lifecycles.Closable):
    """One rtnetlink session in one network namespace (None: the agent's own)."""

    def __init__(self, netns: str | None) -> None:
        self._netns = netns
        self._ipr: Any = None

    async def __aenter__(self) -> Netlink:
        ipr = AsyncIPRoute(netns=self._netns, flags=0) if self._netns else AsyncIPRoute()
        try:
            await ipr.__aenter__()
        except FileNotFoundError:
            raise NetnsMissing(self._netns or "") from None
        self._ipr = ipr
        return self

    async def close(self) -> None:
        ipr, self._ipr = self._ipr, None
        if ipr is not None:
            await ipr.__aexit__(None, None, None)

    async def snapshot(self) -> Snapshot:
        """Every link with its addresses, and the default routes."""
        try:
            addresses = _addresses([msg async for msg in await self._ipr.addr("dump")])
            links = [
                _link(msg, addresses.get(msg["index"], ()))
                async for msg in await self._ipr.link("dump")
            ]
            routes: set[int] = set()
            for family in (socket.AF_INET, socket.AF_INET6):
                dump = await self._ipr.route("dump", family=family)
                routes.update(_default_route_links([msg async for msg in dump]))
        except NetlinkError as error:
            raise NetlinkFailure("reading links", error.code) from None
        return Snapshot(tuple(sorted(links, key=lambda link: link.index)), frozenset(routes))

    async def add_link(
        self, name: str, kind: str, mode: str, lower: int, *, mtu: int | None, alias: str
    ) -> None:
        """Create a macvlan or ipvlan link `name` on link `lower`, down."""
        arguments: dict[str, Any] = {"ifname": name, "kind": kind, "link": lower}
        if kind == "ipvlan":
            arguments["ipvlan_mode"] = IPVLAN_MODES[mode]
        else:
            arguments["macvlan_mode"] = mode
        try:
            await self._ipr.link("add", **arguments)
        except NetlinkError as error:
            missing = f"the kernel has no {kind} driver" if error.code == errno.EOPNOTSUPP else ""
            raise NetlinkFailure(f"creating {kind} link {name}", error.code, missing) from None
        index = await self._index_of(name)
        changes: dict[str, Any] = {"ifalias": alias}
        if mtu is not None:
            changes["mtu"] = mtu
        await self._request(
            f"setting up link {name}", self._ipr.link, "set", index=index, **changes
        )

    async def set_link(self, link: Link, *, mtu: int | None = None, up: bool | None = None) -> None:
        """Change a link's MTU or bring it up (or down)."""
        changes: dict[str, Any] = {}
        if mtu is not None:
            changes["mtu"] = mtu
        if up is not None:
            changes["state"] = "up" if up else "down"
        if changes:
            action = f"setting {', '.join(f'{k} {v}' for k, v in changes.items())} on {link.name}"
            await self._request(action, self._ipr.link, "set", index=link.index, **changes)

    async def delete_link(self, link: Link) -> None:
        await self._request(f"deleting link {link.name}", self._ipr.link, "del", index=link.index)

    async def add_address(self, link: Link, address: Interface) -> None:
        await self._address(f"adding {address} to {link.name}", "add", link, address)

    async def remove_address(self, link: Link, address: Interface) -> None:
        await self._address(f"removing {address} from {link.name}", "del", link, address)

    async def _address(self, action: str, verb: str, link: Link, address: Interface) -> None:
        await self._request(
            action,
            self._ipr.addr,
            verb,
            index=link.index,
            address=str(address.ip),
            prefixlen=address.network.prefixlen,
        )

    async def _index_of(self, name: str) -> int:
        """The index of link `name`, just created; a link gone again by now (an OFED reload
        or another tool removed it) is a `NetlinkFailure` the next converge retries."""
        try:
            found = await self._ipr.link_lookup(ifname=name)
        except NetlinkError as error:
            raise NetlinkFailure(f"looking up the new link {name}", error.code) from None
        if len(found) != 1:
            raise NetlinkFailure(
                f"looking up the new link {name}", errno.ENODEV, "it vanished after it was created"
            )
        index: int = found[0]
        return index

    async def _request(self, action: str, method: Any, *args: Any, **kwargs: Any) -> None:
        try:
            await method(*args, **kwargs)
        except NetlinkError as error:
            raise NetlinkFailure(action, error.code) from None


def _link(msg: Any, addresses: tuple[Interface, ...]) -> Link:
    info = msg.get("IFLA_LINKINFO")
    kind = info.get("IFLA_INFO_KIND") if info else None
    data = info.get("IFLA_INFO_DATA") if info else None
    mode: str | None = None
    if data and kind == "macvlan":
        mode = data.get("IFLA_MACVLAN_MODE")
    elif data and kind == "ipvlan":
        number = data.get("IFLA_IPVLAN_MODE")
        mode = next((name for name, value in IPVLAN_MODES.items() if value == number), None)
    return Link(
        index=msg["index"],
        name=msg.get("IFLA_IFNAME"),
        kind=kind,
        mtu=msg.get("IFLA_MTU") or 0,
        up=bool(msg["flags"] & IFF_UP),
        lower=msg.get("IFLA_LINK"),
        master=msg.get("IFLA_MASTER"),
        alias=msg.get("IFLA_IFALIAS"),
        mode=str(mode) if mode is not None else None,
        addresses=addresses,
    )


def _addresses(messages: Iterable[Any]) -> dict[int, tuple[Interface, ...]]:
    found: dict[int, list[Interface]] = {}
    for msg in messages:
        address = msg.get("IFA_ADDRESS")
        if msg["scope"] != UNIVERSE_SCOPE or address is None:
            continue
        found.setdefault(msg["index"], []).append(
            ipaddress.ip_interface(f"{address}/{msg['prefixlen']}")
        )
    return {index: tuple(sorted(items, key=str)) for index, items in found.items()}


def _default_route_links(messages: Iterable[Any]) -> set[int]:
    found: set[int] = set()
    for msg in messages:
        table = msg.get("RTA_TABLE") or msg["table"]
        if msg["dst_len"] != 0 or table != MAIN_TABLE:
            continue
        if msg.get("RTA_OIF") is not None:
            found.add(msg.get("RTA_OIF"))
        for hop in msg.get("RTA_MULTIPATH") or ():
            found.add(hop["oif"])
    return found
