"""One convergence pass of a node's secondary networks: links, MTUs, addresses, claims.

`NodeNetworks.apply(spec)` (called by `node_agent.NodeAgent` whenever the published policy
changes, on `ApplyNetwork` and on every resync) reads the namespace's links, then:

1. removes what the policy no longer has: gpuop's links of networks that are gone, and the
   addresses the node held on them (`NetworkRemoved`);
2. for each network, in order: picks its NIC (`planning.choose_master`), makes sure no
   foreign interface has its link's name, holds an address (the recorded one while the pool
   still allows it, else a fresh claim), and only then changes links: the NIC's MTU when it
   is too low, the link (recreated if its type, mode or NIC changed), its MTU, its address,
   its state. A network that fails leaves nothing behind that this pass made: a link it
   created is deleted again and a fresh claim is given back (`NetworkFailed`);
3. reports each network's outcome (`NetworkConfigured`).

A pass that finds everything in place changes nothing: every step compares first. Only
`BusError` (the IPAM bucket unreachable) escapes; the pass is then tried again later, and
what it did so far is consistent (a link is only configured with an address it holds).
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Mapping

from gpuop.events import network as events
from gpuop.host import netdevs
from gpuop.host.errors import HostReadError
from gpuop.host.netdevs import NetDevice
from gpuop.host.roots import HostRoot
from gpuop.policy import NetworkSpec, SecondaryNetwork
from gpuop.services.network_manager import planning
from gpuop.services.network_manager.addressing import Addresses, BlockPending, PoolExhausted
from gpuop.services.network_manager.netlink import (
    Interface,
    Link,
    Netlink,
    NetlinkFailure,
    Snapshot,
)
from gpuop.services.network_manager.outcomes import Configured, Failed, Outcome, Pass, Removed

log = logging.getLogger(__name__)


_Facts = Callable[[Snapshot], Mapping[str, NetDevice]]
"""Reads what sysfs says of each link of a snapshot."""


class NodeNetworks:
    """A node's secondary networks in one network namespace."""

    def __init__(self, root: HostRoot, netns: str | None, addresses: Addresses) -> None:
        self._root = root
        self._netns = netns
        self._addresses = addresses

    async def apply(self, spec: NetworkSpec) -> Pass:
        """Converge the namespace to `spec`; raises `NetlinkFailure` when the namespace
        cannot be read at all, `BusError` when the IPAM bucket cannot be reached."""
        async with Netlink(self._netns) as netlink:
            run = _Run(netlink, self._addresses, spec, self._facts)
            snapshot = await netlink.snapshot()
            devices = planning.devices(snapshot, self._facts(snapshot))
            cut_off = planning.ofed_reload_cuts_off(snapshot, devices)
            outcomes: list[Outcome] = await run.remove_unwanted(snapshot)
            for network in spec.networks:
                outcomes.append(await run.converge(network))
        for line in run.changes:
            log.info("%s", line)
        return Pass(tuple(outcomes), cut_off, tuple(run.changes), run.waiting)

    def _facts(self, snapshot: Snapshot) -> dict[str, NetDevice]:
        """What sysfs says of each link (PCI function, ids, driver), by name."""
        facts: dict[str, NetDevice] = {}
        for link in snapshot.links:
            try:
                facts[link.name] = netdevs.net_device(self._root, link.name)
            except HostReadError as error:
                log.warning("cannot read sysfs of %s: %s", link.name, error)
        return facts


class _Run:
    """The state of one pass: the session, and the changes made so far."""

    def __init__(
        self,
        netlink: Netlink,
        addresses: Addresses,
        spec: NetworkSpec,
        facts: _Facts,
    ) -> None:
        self.netlink = netlink
        self.addresses = addresses
        self.spec = spec
        self.facts = facts
        self.changes: list[str] = []
        self.waiting = False

    async def remove_unwanted(self, snapshot: Snapshot) -> list[Outcome]:
        wanted = {network.name for network in self.spec.networks}
        protected = self._protected(snapshot)
        outcomes: list[Outcome] = []
        owned = planning.owned_links(snapshot)
        records = await self.addresses.records()
        for name in sorted(set(owned) | set(records)):
            if name in wanted:
                continue
            link = owned.get(name)
            if link is not None and link.name in protected:
                outcomes.append(
                    Failed(
                        name,
                        events.NetworkFailureReason.MANAGEMENT_INTERFACE,
                        f"link {link.name} of the removed network {name} carries the node's "
                        "default route; it stays until allowManagementNicReconfigure is set",
                    )
                )
                continue
            if link is not None:
                try:
                    await self.netlink.delete_link(link)
                except NetlinkFailure as failure:
                    outcomes.append(
                        Failed(name, events.NetworkFailureReason.NETLINK_ERROR, failure.message)
                    )
                    continue
                self.changes.append(f"deleted link {link.name} of the removed network {name}")
            released = await self.addresses.release(name)
            outcomes.append(
                Removed(name, link.name if link else None, (released,) if released else ())
            )
        return outcomes

    async def converge(self, network: SecondaryNetwork) -> Outcome:
        snapshot = await self.netlink.snapshot()
        devices = planning.devices(snapshot, self.facts(snapshot))
        protected = planning.management_links(snapshot, devices)
        allow = self.spec.allow_management_nic_reconfigure
        master = planning.choose_master(
            network, snapshot, devices, protected, allow_management=allow
        )
        if isinstance(master, planning.Refusal):
            return Failed(network.name, master.reason, master.message)
        existing = snapshot.named(network.link_name)
        if existing is not None and planning.owner_of(existing) != network.name:
            return Failed(
                network.name,
                events.NetworkFailureReason.CONFLICT,
                f"an interface named {network.link_name} exists and gpuop does not own it; "
                "set the network's interface to another name",
            )
        try:
            address, fresh, previous = await self._hold_address(network)
        except PoolExhausted as exhausted:
            return Failed(
                network.name, events.NetworkFailureReason.ADDRESSES_EXHAUSTED, str(exhausted)
            )
        except BlockPending as pending:
            log.warning("%s", pending)
            self.waiting = True
            return Failed(network.name, events.NetworkFailureReason.OTHER, str(pending))
        before = len(self.changes)
        renamed = planning.owned_links(snapshot).get(network.name)
        try:
            if renamed is not None and renamed.name != network.link_name:
                await self.netlink.delete_link(renamed)
                self.changes.append(f"deleted link {renamed.name}: the network's link is renamed")
            link = await self._configure(network, master, existing, address)
        except NetlinkFailure as failure:
            await self._undo(network, master, existing, address if fresh else None)
            return Failed(network.name, events.NetworkFailureReason.NETLINK_ERROR, failure.message)
        if fresh:
            await self.addresses.record(network.name, address)
            if previous is not None and previous != address:
                await self.addresses.give_back(network.name, previous)
        return Configured(
            network=network.name,
            interface=link.name,
            master=master.name,
            mode=events.LinkMode(network.type),
            mtu=link.mtu,
            address=address,
            changed=len(self.changes) > before,
        )

    async def _hold_address(
        self, network: SecondaryNetwork
    ) -> tuple[Interface, bool, Interface | None]:
        """(address, claimed now, the address held before if it is no longer valid)."""
        previous = await self.addresses.recorded(network.name)
        if previous is not None and await self.addresses.confirm(network, previous):
            return previous, False, None
        return await self.addresses.claim(network), True, previous

    async def _configure(
        self, network: SecondaryNetwork, master: Link, existing: Link | None, address: Interface
    ) -> Link:
        """Make the network's link what the policy says; returns it as it is now."""
        mtu = network.mtu or master.mtu
        raised = mtu if mtu > master.mtu else None
        if raised is not None or not master.up:
            await self.netlink.set_link(master, mtu=raised, up=None if master.up else True)
            what = [f"mtu {raised}"] if raised is not None else []
            self.changes.append(f"set {master.name}: {', '.join([*what, 'up'])}")
        if existing is not None and planning.must_recreate(existing, network, master):
            await self.netlink.delete_link(existing)
            self.changes.append(f"deleted link {existing.name}: type, mode or NIC changed")
            existing = None
        if existing is None:
            await self.netlink.add_link(
                network.link_name,
                network.type,
                network.link_mode,
                master.index,
                mtu=mtu,
                alias=planning.alias_for(network.name),
            )
            self.changes.append(f"created {network.type} link {network.link_name} on {master.name}")
        link = await self._link(network.link_name)
        if link.mtu != mtu:
            await self.netlink.set_link(link, mtu=mtu)
            self.changes.append(f"set {link.name}: mtu {mtu}")
        for stale in link.addresses:
            if stale != address:
                await self.netlink.remove_address(link, stale)
                self.changes.append(f"removed {stale} from {link.name}")
        if address not in link.addresses:
            await self.netlink.add_address(link, address)
            self.changes.append(f"added {address} to {link.name}")
        if not link.up:
            await self.netlink.set_link(link, up=True)
            self.changes.append(f"set {link.name}: up")
        return await self._link(network.link_name)

    async def _undo(
        self,
        network: SecondaryNetwork,
        master: Link,
        existing: Link | None,
        claimed: Interface | None,
    ) -> None:
        """After a failed configuration: delete the link this pass created and put the NIC's
        MTU and state back as they were before this network's changes (links of networks
        converged earlier were there then), give back a fresh claim. A link that was there
        before, and needed no replacing, stays with its held address."""
        try:
            snapshot = await self.netlink.snapshot()
            link = snapshot.named(network.link_name)
            if existing is None and link is not None and planning.owner_of(link) == network.name:
                await self.netlink.delete_link(link)
                self.changes.append(f"deleted link {link.name} after a failure")
            now = snapshot.at(master.index)
            if (
                existing is None
                and now is not None
                and (now.mtu, now.up) != (master.mtu, master.up)
            ):
                await self.netlink.set_link(now, mtu=master.mtu, up=master.up)
                self.changes.append(f"set {master.name} back: mtu {master.mtu}, up {master.up}")
        except NetlinkFailure as failure:
            log.error("could not undo the changes for network %s: %s", network.name, failure)
        if claimed is not None:
            await self.addresses.give_back(network.name, claimed)

    async def _link(self, name: str) -> Link:
        link = (await self.netlink.snapshot()).named(name)
        if link is None:
            raise NetlinkFailure(f"reading link {name}", errno.ENOENT, "it vanished")
        return link

    def _protected(self, snapshot: Snapshot) -> frozenset[str]:
        if self.spec.allow_management_nic_reconfigure:
            return frozenset()
        return planning.management_links(snapshot, planning.devices(snapshot, self.facts(snapshot)))
