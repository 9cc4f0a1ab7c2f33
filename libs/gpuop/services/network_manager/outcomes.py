"""What a convergence pass came to for each network, and the event that reports it.

`applying.NodeNetworks.apply` returns a `Pass` of outcomes; `node_agent.NodeAgent`
publishes `outcome.event(revision)` for those that differ from what it published last.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuop.events import network as events
from gpuop.services.network_manager.netlink import Interface


@dataclass(frozen=True)
class Configured:
    """The network is set up on the node as the policy says."""

    network: str
    interface: str
    master: str
    mode: events.LinkMode
    mtu: int
    address: Interface
    changed: bool
    """Whether this pass changed anything for the network."""

    def event(self, revision: int) -> events.NetworkConfigured:
        return events.NetworkConfigured(
            network=self.network,
            interface=self.interface,
            master=self.master,
            mode=self.mode,
            mtu=self.mtu,
            addresses=(self.address,),
            policy_revision=revision,
        )


@dataclass(frozen=True)
class Failed:
    """The network could not be set up (or taken down); nothing this pass did is left."""

    network: str
    reason: events.NetworkFailureReason
    message: str

    def event(self, revision: int) -> events.NetworkFailed:
        return events.NetworkFailed(
            network=self.network,
            reason=self.reason,
            message=self.message[:2048],
            policy_revision=revision,
        )


@dataclass(frozen=True)
class Removed:
    """A network the policy no longer has is gone from the node."""

    network: str
    interface: str | None
    """The link deleted; None when the node held only an address."""
    addresses: tuple[Interface, ...]

    def event(self, revision: int) -> events.NetworkRemoved:
        return events.NetworkRemoved(
            network=self.network,
            interface=self.interface,
            addresses=self.addresses,
            policy_revision=revision,
        )


Outcome = Configured | Failed | Removed


@dataclass(frozen=True)
class Pass:
    """What one pass found and did."""

    outcomes: tuple[Outcome, ...]
    management_interfaces: tuple[str, ...] = ()
    """Default-route interfaces an OFED reload would reset (for the RDMA inventory)."""
    changes: tuple[str, ...] = ()
    """Every netlink change made, in order, for the log and for tests."""
    waiting: bool = False
    """Whether a network waits for its node's address block (`addressing.BlockPending`):
    the agent then tries again after its retry interval, not its resync interval."""
