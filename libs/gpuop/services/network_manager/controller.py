"""Network-manager's cluster role: from the GPUClusterPolicy's `network` section to the
published config the node roles follow and to Multus NetworkAttachmentDefinitions.

Each pass (`NetworkController.reconcile`) lists the policies, follows the first by name as
the orchestrator does, and reads its `network` section. A section with a wrong field
changes nothing (the orchestrator reports the field in the policy's `Valid` condition; the
rest of the spec being wrong does not hold the networks back). Then it:

1. publishes the section in the `gpuop_config` KV bucket under `CONFIG_KEY`, with
   compare-and-set and only when the section changed, so node agents converge once per
   change; with no policy at all it publishes an empty section, and the nodes take their
   networks down;
2. gives every node (of `block_node_selector`) one address block of each pool with a
   `perNodeBlockSize`, and frees the blocks of nodes that are gone (`blocks`);
3. makes the cluster's NetworkAttachmentDefinitions match (`attachments.reconcile`).

Passes run at start, on every change of a policy and every Node added or deleted (watches
wake the loop), and every
`resync_interval_seconds` to repair attachments someone edited or deleted. Kubernetes or
NATS being unreachable ends the pass; it is tried again after `retry_interval_seconds`.
Without the GPUClusterPolicy CRD there is no policy; without Multus' CRD the nodes still
get their networks, and the attachments are written once Multus is installed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from gpuop.bus import Buckets, Bus, BusError, RevisionConflict
from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.kube import client, customobjects, errors
from gpuop.kube.watching import ListWatch
from gpuop.policy import NetworkSpec, PolicyInvalid, PublishedNetwork, validate_spec
from gpuop.policy.networks import CONFIG_KEY
from gpuop.runtime import waiting
from gpuop.runtime.services import ServiceContext
from gpuop.services.network_manager import attachments, blocks
from gpuop.services.network_manager.config import NetworkManagerConfig

log = logging.getLogger(__name__)

POLICIES = customobjects.GPU_CLUSTER_POLICIES


def network_section(policy: Mapping[str, Any]) -> NetworkSpec | None:
    """The policy's `network` section when it is valid; None (with the reasons logged)
    when a field in it is wrong. Mistakes elsewhere in the spec do not matter here."""
    raw = policy.get("spec") or {}
    try:
        return validate_spec(raw).network
    except PolicyInvalid as invalid:
        wrong = [p for p in invalid.problems if p.path.startswith("spec.network")]
        if wrong:
            name = (policy.get("metadata") or {}).get("name")
            log.warning(
                "GPUClusterPolicy %s: the network section is invalid, keeping the networks "
                "as they are: %s",
                name,
                "; ".join(str(problem) for problem in wrong),
            )
            return None
        return NetworkSpec.model_validate(raw.get("network") or {})


class NetworkController:
    """Publishes the network section and keeps the attachments in line with it."""

    def __init__(
        self,
        bus: Bus,
        kube: client.Kube,
        config: NetworkManagerConfig,
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._bus = bus
        self._kube = kube
        self._config = config
        self._clock = clock
        self._wake = asyncio.Event()

    async def run(self, stopping: asyncio.Event) -> None:
        """Reconcile until `stopping` is set."""
        watcher = asyncio.gather(
            asyncio.create_task(self._watch_policies(), name="network-policy-watch"),
            asyncio.create_task(self._watch_nodes(), name="network-node-watch"),
        )
        try:
            while not stopping.is_set():
                interval = self._config.resync_interval_seconds
                try:
                    await self.reconcile()
                except (errors.KubeError, BusError) as error:
                    log.warning("network pass failed, trying again: %s", error)
                    interval = self._config.retry_interval_seconds
                await waiting.idle(interval, wake=self._wake, stopping=stopping)
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)

    async def reconcile(self) -> PublishedNetwork | None:
        """One pass; the section in force, or None when the policy's section is invalid."""
        try:
            policies = await customobjects.list_objects(self._kube, POLICIES)
        except errors.NotFound:
            log.info("the GPUClusterPolicy CRD is not installed: no policy, no networks")
            policies = []
        if not policies:
            published = PublishedNetwork()
        else:
            policy = min(policies, key=lambda item: str(item["metadata"]["name"]))
            spec = network_section(policy)
            if spec is None:
                return None
            metadata = policy["metadata"]
            published = PublishedNetwork(
                policy=metadata["name"], generation=metadata.get("generation"), spec=spec
            )
        await self.publish(published)
        await self.allocate(published.spec)
        try:
            report = await attachments.reconcile(self._kube, published.spec)
        except errors.NotFound:
            if published.spec.networks:
                log.warning(
                    "Multus' NetworkAttachmentDefinition CRD is not installed: the nodes get "
                    "their networks, pods cannot join them"
                )
            return published
        for line in (
            *(f"created {name}" for name in report.created),
            *(f"updated {name}" for name in report.updated),
            *(f"deleted {name}" for name in report.deleted),
        ):
            log.info("NetworkAttachmentDefinition %s", line)
        for refusal in report.refused:
            log.warning("NetworkAttachmentDefinition %s", refusal)
        return published

    async def publish(self, published: PublishedNetwork) -> bool:
        """Write `published` under `CONFIG_KEY` unless the section there is the same;
        whether it wrote. A concurrent writer makes it read and decide again."""
        kv = await self._bus.kv(Buckets.CONFIG)
        for _ in range(8):
            entry = await kv.get(CONFIG_KEY)
            if entry is not None and _same_section(entry.value, published):
                return False
            try:
                if entry is None:
                    await kv.create(CONFIG_KEY, published.encode())
                else:
                    await kv.update(CONFIG_KEY, published.encode(), entry.revision)
            except RevisionConflict:
                continue
            log.info(
                "published the network section of %s: %d networks",
                published.policy or "no policy",
                len(published.spec.networks),
            )
            return True
        raise BusError(f"{CONFIG_KEY} keeps changing under this writer")

    async def allocate(self, spec: NetworkSpec) -> blocks.Allocation | None:
        """Give the nodes their blocks of every pool with a `perNodeBlockSize`; None when
        no pool has one (nothing is read or written)."""
        pools = [network.ipam for network in spec.networks]
        if all(pool.per_node_block_size is None for pool in pools):
            return None
        allocator = blocks.BlockAllocator(await self._bus.kv(Buckets.IPAM))
        return await allocator.reconcile(pools, self._node_names)

    async def _node_names(self) -> list[str]:
        selector = self._config.block_node_selector
        if selector:
            listed = await self._kube.call(self._kube.core.list_node, label_selector=selector)
        else:
            listed = await self._kube.call(self._kube.core.list_node)
        return [str(item["metadata"]["name"]) for item in listed.get("items") or []]

    async def _watch_nodes(self) -> None:
        selector = self._config.block_node_selector or None
        while True:
            try:
                async with ListWatch(
                    self._kube, self._kube.core.list_node, label_selector=selector
                ) as watch:
                    async for change in watch:
                        if change.type in ("ADDED", "DELETED"):
                            self._wake.set()
            except errors.KubeError as error:
                log.warning("watching the Nodes failed: %s", error)
            await self._clock.sleep(self._config.retry_interval_seconds)

    async def _watch_policies(self) -> None:
        while True:
            try:
                async with customobjects.watch(self._kube, POLICIES, clock=self._clock) as watch:
                    async for _ in watch:
                        self._wake.set()
            except errors.KubeError as error:
                log.warning("watching GPUClusterPolicies failed: %s", error)
            await self._clock.sleep(self._config.retry_interval_seconds)


def _same_section(stored: bytes, published: PublishedNetwork) -> bool:
    try:
        return PublishedNetwork.model_validate_json(stored).spec == published.spec
    except ValueError:
        return False


async def run(context: ServiceContext, config: NetworkManagerConfig) -> None:
    """The cluster role's entry point."""
    kube = await client.connect(context.settings.kubeconfig)
    try:
        context.ready, context.not_ready_reason = True, ""
        await NetworkController(context.bus, kube, config).run(context.stopping)
    finally:
        await kube.close()
