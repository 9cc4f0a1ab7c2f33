"""Network-manager's node role: keeps the node's secondary networks as the published policy
says, and tells the cluster what came of it.

The node role holds NATS credentials only, so it never reads the GPUClusterPolicy itself:
the cluster role publishes the policy's `network` section in the `gpuop_config` KV bucket
(`gpuop.policy.networks.PublishedNetwork` under `CONFIG_KEY`) and this agent watches that
key. It converges (`applying.NodeNetworks.apply`) when the entry changes, when asked by
`ApplyNetwork`, after an OFED driver load or rollback on its node (the reload recreated the
NICs, and the links on them died with the old ones), and every `resync_interval_seconds`
to repair whatever else changed the links. Until the cluster role has published an entry
it changes nothing: an absent entry means "not told yet", not "no networks".

After each pass it publishes, per network, `NetworkConfigured`, `NetworkFailed` or
`NetworkRemoved` when the outcome differs from the last one it published (always, in answer
to `ApplyNetwork`), and `RdmaDevicesDiscovered` when the RDMA inventory changed. While NATS
is unreachable the links stay as they are; the agent converges again once it is back.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging

from pydantic import ValidationError

from gpuop.bus import Buckets, Bus, BusError, Delivery, KvEntry, TemporaryError
from gpuop.events import Envelope, Event, driver, network
from gpuop.host.errors import HostReadError
from gpuop.host.roots import HostRoot
from gpuop.policy import PublishedNetwork
from gpuop.policy.networks import CONFIG_KEY
from gpuop.runtime import waiting
from gpuop.runtime.node_agents import NodeAgentBase
from gpuop.runtime.services import Readiness, ServiceContext
from gpuop.services.network_manager import consumers, rdma
from gpuop.services.network_manager.addressing import Addresses
from gpuop.services.network_manager.applying import NodeNetworks
from gpuop.services.network_manager.config import NetworkManagerConfig
from gpuop.services.network_manager.netlink import NetlinkFailure
from gpuop.services.network_manager.outcomes import Pass, Removed

log = logging.getLogger(__name__)

SERVICE = consumers.SERVICE
RECONVERGE_AFTER = (driver.DriverLoaded, driver.DriverRolledBack)
"""Driver results after which an OFED reload may have recreated the NICs."""


class NodeAgent(NodeAgentBase):
    """Network-manager on one node."""

    def __init__(
        self,
        bus: Bus,
        node: str,
        root: HostRoot,
        config: NetworkManagerConfig,
        networks: NodeNetworks,
        *,
        readiness: Readiness | None = None,
    ) -> None:
        super().__init__(bus, SERVICE, node, readiness)
        self._root = root
        self._config = config
        self._networks = networks
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._published: dict[str, Event] = {}
        """Per network, the outcome last published."""
        self._rdma: network.RdmaDevicesDiscovered | None = None
        self._converged = False

    async def run(self, stopping: asyncio.Event) -> None:
        """Subscribe, then converge until `stopping` is set."""
        async with self._consuming(
            (consumers.node_commands, self.on_command),
            (consumers.node_driver_results, self.on_driver_event),
            retry_delay=self._config.retry_interval_seconds,
        ):
            watcher = asyncio.create_task(
                self._follow_config(stopping), name="network-config-watch"
            )
            try:
                await self._converge_loop(stopping)
            finally:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)

    async def converge(self, *, cause: Envelope | None = None) -> Pass | None:
        """One pass with the published network section; None while none is published. With
        a `cause` (a command), every outcome is published again as its answer.
        Raises `BusError` (NATS unreachable) and `NetlinkFailure` (namespace unreadable)."""
        async with self._lock:
            if cause is not None:
                self._published.clear()
            entry = await (await self._bus.kv(Buckets.CONFIG)).get(CONFIG_KEY)
            if entry is None:
                log.info("no network policy published yet; leaving the links as they are")
                self._ready()
                return None
            published = _decode(entry)
            if published is None:  # logged; the cluster role's next write replaces it
                self._ready()
                return None
            result = await self._networks.apply(published.spec)
            await self._report(result, entry.revision, cause)
            await self._inventory(result.management_interfaces, cause)
            self._ready()
            return result

    async def on_command(self, delivery: Delivery) -> None:
        """`ApplyNetwork`: converge now, to at least the command's policy revision, and
        publish every network's outcome."""
        command = delivery.payload
        if not isinstance(command, network.ApplyNetwork):
            return
        try:
            entry = await (await self._bus.kv(Buckets.CONFIG)).get(CONFIG_KEY)
            revision = entry.revision if entry is not None else 0
            if revision < command.policy_revision:
                raise TemporaryError(
                    f"the published network policy is at revision {revision}, the command "
                    f"asks for {command.policy_revision}",
                    delay=self._config.retry_interval_seconds,
                )
            if entry is not None and revision == command.policy_revision:
                digest = hashlib.sha256(entry.value).hexdigest()
                if digest != command.policy_hash:
                    log.warning(
                        "policy revision %d has hash %s, the command says %s",
                        revision,
                        digest[:12],
                        command.policy_hash[:12],
                    )
            await self.converge(cause=delivery.envelope)
        except (BusError, NetlinkFailure) as error:
            raise TemporaryError(
                f"could not apply the network policy: {error}",
                delay=self._config.retry_interval_seconds,
            ) from error

    async def on_driver_event(self, delivery: Delivery) -> None:
        """Converge soon after OFED was loaded or rolled back on this node."""
        payload = delivery.payload
        if isinstance(payload, RECONVERGE_AFTER) and payload.component is driver.Component.OFED:
            log.info("OFED was reloaded; converging the networks again")
            self._wake.set()

    def _ready(self) -> None:
        """The agent does its job once one pass went through (whatever the networks' fate)."""
        if not self._converged:
            self._converged = True
            self._readiness(True, "")

    async def _report(self, result: Pass, revision: int, cause: Envelope | None) -> None:
        for outcome in result.outcomes:
            payload = outcome.event(revision)
            if self._published.get(outcome.network) == payload:
                continue
            await self._publish(payload, cause=cause)
            if isinstance(outcome, Removed):
                self._published.pop(outcome.network, None)
            else:
                self._published[outcome.network] = payload

    async def _inventory(self, cut_off: tuple[str, ...], cause: Envelope | None) -> None:
        try:
            found = rdma.inventory(self._root, cut_off)
        except HostReadError as error:
            log.warning("cannot read the RDMA devices: %s", error)
            return
        if found != self._rdma:
            await self._publish(found, cause=cause)
            self._rdma = found

    async def _converge_loop(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            interval = self._config.resync_interval_seconds
            try:
                result = await self.converge()
                if result is not None and result.waiting:
                    interval = self._config.retry_interval_seconds
            except BusError as error:
                log.warning("NATS unreachable, links left as they are: %s", error)
                interval = self._config.retry_interval_seconds
            except NetlinkFailure as error:
                log.error("cannot reach the node's links: %s", error)
                if not self._converged:
                    self._readiness(False, str(error))
                interval = self._config.retry_interval_seconds
            await waiting.idle(interval, wake=self._wake, stopping=stopping)

    async def _follow_config(self, stopping: asyncio.Event) -> None:
        """Wake the convergence loop on every change of the published policy."""
        while not stopping.is_set():
            try:
                kv = await self._bus.kv(Buckets.CONFIG)
                watch = kv.watch(CONFIG_KEY)
                try:
                    async for entry in watch:
                        if entry is not None:
                            self._wake.set()
                finally:
                    close = getattr(watch, "aclose", None)  # an async generator in both buses
                    if close is not None:
                        await close()
            except BusError as error:
                log.warning("watching the network policy failed, watching again: %s", error)
            await waiting.stopped_within(stopping, self._config.retry_interval_seconds)


def _decode(entry: KvEntry) -> PublishedNetwork | None:
    try:
        return PublishedNetwork.model_validate_json(entry.value)
    except ValidationError as error:
        log.error(
            "the published network policy (revision %d) is unreadable: %s", entry.revision, error
        )
        return None


async def run(context: ServiceContext, config: NetworkManagerConfig) -> None:
    """The node role's entry point: one `NodeAgent` for `--node`, until the service stops."""
    settings = context.settings
    node, root = settings.require_node(), HostRoot(settings.require_host_root())
    context.not_ready_reason = "the first pass over the node's networks has not finished"
    addresses = Addresses(await context.bus.kv(Buckets.IPAM), node)
    networks = NodeNetworks(root, config.netns, addresses)
    agent = NodeAgent(context.bus, node, root, config, networks, readiness=context.set_readiness)
    await agent.run(context.stopping)
