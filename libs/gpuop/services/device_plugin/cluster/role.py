"""The device plugin's cluster role: DRA nodes' ResourceSlices out, claims' allocations out.

`run` (the service's cluster entry point, `gpuop run device-plugin --role cluster`) connects
to Kubernetes and runs one `DraPublisher`:

- it consumes every node's `hardware.discovered` and `device.api-applied` (durable
  `CONSUMER`), after restoring the latest of each from the `gpuop_nodes` bucket and the log,
  and syncs the slices of each node they change (`slices.SlicePublisher`);
- it watches every ResourceSlice: one of gpuop's that changed or vanished without this
  process writing it (the kubelet's wipe, an admin's edit) makes its node sync again, and
  the other drivers' devices are what `claims.DeviceIndex` matches foreign results with;
- it watches every ResourceClaim and publishes, on the node whose GPUs a claim holds,
  `dra.ClaimAllocated` and `dra.ClaimReleased` (`claims.ClaimPublisher`), after restoring
  what it told before from the log, so claims deleted while it was down are released once the
  first list shows them gone.

A failed sync or publish is tried again after `retry_delay`; every node is synced again
every `resync_interval`, which repairs what a lost watch event would leave behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from gpuop.bus import Buckets, Bus, BusError, ConsumerSpec, Delivery
from gpuop.events import MalformedMessage, UnknownEventType, decode_on, dra, hardware, subjects
from gpuop.events.device_api_commands import DeviceApiApplied
from gpuop.events.envelope import new_event
from gpuop.kube import client, errors
from gpuop.kube import dra as kube_dra
from gpuop.kube.watching import ListWatch, WatchEvent
from gpuop.runtime import waiting
from gpuop.runtime.services import ServiceContext
from gpuop.services.device_plugin.cluster.claims import ClaimPublisher, DeviceIndex, Tell
from gpuop.services.device_plugin.cluster.slices import SliceConflict, SlicePublisher

log = logging.getLogger(__name__)

CONSUMER = "device-plugin-dra"
"""The cluster role's durable consumer of inventories and device API answers."""
SOURCE = f"/gpuop/{CONSUMER}"
STORED = datetime.min.replace(tzinfo=UTC)
"""When a stored inventory counts as observed: before any event, which replaces it."""
RETRY_DELAY = 5.0
RESYNC_INTERVAL = 300.0


def consumer_spec(prefix: str, *, retry_delay: float = RETRY_DELAY) -> ConsumerSpec:
    """Every node's inventories and device API answers."""
    return ConsumerSpec(
        durable=CONSUMER,
        subjects=(
            subjects.events_filter(
                hardware.HardwareDiscovered.DOMAIN,
                name=hardware.HardwareDiscovered.NAME,
                prefix=prefix,
            ),
            api_applied_filter(prefix),
        ),
        retry_delay=retry_delay,
    )


def api_applied_filter(prefix: str) -> str:
    return subjects.events_filter(
        DeviceApiApplied.DOMAIN, name=DeviceApiApplied.NAME, prefix=prefix
    )


def dra_filter(prefix: str) -> str:
    return subjects.events_filter(dra.ClaimAllocated.DOMAIN, prefix=prefix)


class DraPublisher:
    """The role's state and loops; `run` until stopped."""

    def __init__(
        self,
        bus: Bus,
        kube: client.Kube,
        *,
        retry_delay: float = RETRY_DELAY,
        resync_interval: float = RESYNC_INTERVAL,
    ) -> None:
        self._bus = bus
        self._kube = kube
        self._retry_delay = retry_delay
        self._resync_interval = resync_interval
        self.slices = SlicePublisher(kube)
        self._slice_watch = ListWatch(kube, kube.resource.list_resource_slice)
        self.claims = ClaimPublisher(DeviceIndex(self._inventories, self._listed_slices))
        self._slices_listed = asyncio.Event()
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()

    def _inventories(self) -> Mapping[str, hardware.HardwareDiscovered]:
        return {
            node: state.inventory
            for node, state in self.slices.nodes.items()
            if state.inventory is not None
        }

    def _listed_slices(self) -> list[Mapping[str, Any]]:
        return list(self._slice_watch.objects.values())

    def mark(self, node: str) -> None:
        """Sync `node`'s slices soon."""
        self._dirty.add(node)
        self._wake.set()

    async def restore(self) -> None:
        """The latest inventories (bucket) and device API answers (log), and what the nodes
        were told of claims (log)."""
        inventories = await self._bus.kv(Buckets.NODES)
        for key in await inventories.keys():
            entry = await inventories.get(key)
            if entry is None:
                continue
            try:
                inventory = hardware.HardwareDiscovered.model_validate_json(entry.value)
            except ValidationError as error:
                log.warning("stored inventory %s is invalid: %s", key, error)
                continue
            node = subjects.decode_node(key)
            self.slices.inventory(node, inventory, STORED)
        async for node, applied, at in self._read(api_applied_filter(self._bus.prefix)):
            if isinstance(applied, DeviceApiApplied):
                self.slices.api_applied(node, applied, at)
        told: list[tuple[str, dra.ClaimAllocated | dra.ClaimReleased]] = []
        async for node, event, _ in self._read(dra_filter(self._bus.prefix)):
            if isinstance(event, dra.ClaimAllocated | dra.ClaimReleased):
                told.append((node, event))
        self.claims.restore(told)
        for node in self.slices.nodes:
            self.mark(node)

    async def _read(self, subject: str) -> AsyncIterator[tuple[str, object, datetime]]:
        async for message in self._bus.read(subject):
            try:
                envelope, payload = decode_on(message.subject, message.data)
            except (MalformedMessage, UnknownEventType):
                continue
            yield envelope.node, payload, envelope.time

    async def handle(self, delivery: Delivery) -> None:
        """The consumer's handler: a node's inventory or device API answer."""
        node, at = delivery.envelope.node, delivery.envelope.time
        payload = delivery.payload
        if isinstance(payload, hardware.HardwareDiscovered):
            changed = self.slices.inventory(node, payload, at)
        elif isinstance(payload, DeviceApiApplied):
            changed = self.slices.api_applied(node, payload, at)
        else:
            return
        if changed:
            self.mark(node)

    async def run(self, stopping: asyncio.Event) -> None:
        """Sync, watch and publish until `stopping` is set."""
        tasks = [
            asyncio.create_task(self._watch_slices(), name="dra-slice-watch"),
            asyncio.create_task(self._watch_claims(), name="dra-claim-watch"),
        ]
        try:
            await self._sync_loop(stopping)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._slice_watch.close()

    async def _sync_loop(self, stopping: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        next_resync = loop.time() + self._resync_interval
        while not stopping.is_set():
            if loop.time() >= next_resync:
                self._dirty |= set(self.slices.nodes)
                next_resync = loop.time() + self._resync_interval
            failed = False
            for node in sorted(self._dirty):
                self._dirty.discard(node)
                try:
                    await self.slices.sync(node)
                except (errors.KubeError, SliceConflict) as error:
                    log.warning("syncing the DRA slices of node %s: %s; retrying", node, error)
                    self._dirty.add(node)
                    failed = True
            self._wake.clear()
            if self._dirty and not failed:
                continue
            wait = self._retry_delay if failed else next_resync - loop.time()
            await waiting.idle(max(wait, 0.0), wake=self._wake, stopping=stopping)

    async def _watch_slices(self) -> None:
        await self._listed(self._slice_watch, "ResourceSlices")
        self._slices_listed.set()
        while True:
            try:
                async for event in self._slice_watch:
                    self._slice_changed(event)
            except errors.KubeError as error:
                log.warning("watching ResourceSlices: %s; retrying", error)
                await asyncio.sleep(self._retry_delay)

    def _slice_changed(self, event: WatchEvent) -> None:
        spec = event.object.get("spec") or {}
        if spec.get("driver") != dra.DRIVER or not spec.get("nodeName"):
            return
        if event.type == "DELETED" or not self.slices.is_own_write(event.object):
            self.mark(str(spec["nodeName"]))

    async def _listed(self, watch: ListWatch, what: str) -> Mapping[Any, Mapping[str, Any]]:
        while True:
            try:
                return await watch.list()
            except errors.KubeError as error:
                log.warning("listing %s: %s; retrying", what, error)
                await asyncio.sleep(self._retry_delay)

    async def _watch_claims(self) -> None:
        async with kube_dra.watch_claims(self._kube) as watch:
            listed = await self._listed(watch, "ResourceClaims")
            await self._slices_listed.wait()
            uids = [str((c.get("metadata") or {}).get("uid")) for c in listed.values()]
            await self._tell(self.claims.gone_since(uids))
            while True:
                try:
                    async for event in watch:
                        await self._claim_changed(event)
                except errors.KubeError as error:
                    log.warning("watching ResourceClaims: %s; retrying", error)
                    await asyncio.sleep(self._retry_delay)

    async def _claim_changed(self, event: WatchEvent) -> None:
        try:
            if event.type == "DELETED":
                tells = self.claims.forget(event.object)
            else:
                tells = self.claims.observe(event.object)
        except ValidationError as error:
            # a claim the events cannot carry (more results than a claim may have, a name
            # out of the API's rules) must not stop the watch of every other claim
            name = (event.object.get("metadata") or {}).get("name")
            log.warning("ResourceClaim %s: cannot tell its allocation: %s", name, error)
            return
        await self._tell(tells)

    async def _tell(self, tells: list[Tell]) -> None:
        for tell in tells:
            envelope = new_event(tell.event, node=tell.node, source=SOURCE)
            while True:
                try:
                    await self._bus.publish(envelope)
                    break
                except BusError as error:
                    log.warning(
                        "publishing %s on node %s: %s; retrying", envelope.type, tell.node, error
                    )
                    await asyncio.sleep(self._retry_delay)
            self.claims.told(tell)


async def run(context: ServiceContext) -> None:
    """The cluster role's entry point."""
    kube = await client.connect(context.settings.kubeconfig)
    try:
        publisher = DraPublisher(context.bus, kube)
        await publisher.restore()
        subscription = await context.bus.consume(
            consumer_spec(context.bus.prefix), publisher.handle
        )
        context.ready, context.not_ready_reason = True, ""
        try:
            await publisher.run(context.stopping)
        finally:
            with contextlib.suppress(BusError):
                await subscription.stop()
    finally:
        await kube.close()
