"""The pods of the nodes in the steps that need them: one informer per node, shared.

Three steps of a saga look at the node's pods: wait-for-jobs-required counts the selected
jobs (`jobs`), pod-deletion-required and drain-required plan their evictions from them and
wait until the evicted pods are gone (`executing`, through `draining.drain_node`). Each
used to list and watch the node's pods on its own; `NodePods` gives them one
`informers.Informer` per node (every pod bound to the node, in every namespace), so a node
costs one LIST and one WATCH for all three, whatever they wait for.

An informer is opened by the first `using(node)` and stays open while someone uses it or
the node is held: the controller holds the nodes whose saga is in one of those steps
(`hold`, through `jobs.PodWatches.follow`), so the informer outlives the gaps between the
steps and is closed when the saga leaves them. One that failed is replaced at the next use.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.events.upgrade import UpgradeState
from gpuop.kube import client, pods
from gpuop.kube.informers import Informer

S = UpgradeState

POD_STATES = frozenset({S.WAIT_FOR_JOBS_REQUIRED, S.POD_DELETION_REQUIRED, S.DRAIN_REQUIRED})
"""The states whose steps read the node's pods."""


@dataclass
class _Shared:
    informer: Informer
    users: int = 0


class NodePods:
    """One informer of the pods of each node in use or held."""

    def __init__(self, kube: client.Kube, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self._kube = kube
        self._clock = clock
        self._shared: dict[str, _Shared] = {}
        self._held: frozenset[str] = frozenset()
        self._closing: set[asyncio.Task[None]] = set()

    @contextlib.asynccontextmanager
    async def using(self, node: str) -> AsyncIterator[Informer]:
        """The node's informer, listed; open at least until the block ends. A failed LIST
        raises its `KubeError`."""
        shared = previous = self._shared.get(node)
        if shared is None or shared.informer.failed:
            watch = pods.watch_on_node(self._kube, node, clock=self._clock)
            shared = self._shared[node] = _Shared(Informer(watch))
        shared.users += 1
        try:
            if previous is not None and previous is not shared and previous.users == 0:
                await previous.informer.close()  # one still in use is closed by its last user
            await shared.informer.synced()
            yield shared.informer
        finally:
            shared.users -= 1
            if shared.users == 0 and (node not in self._held or shared.informer.failed):
                await self._close(node, shared)

    def hold(self, nodes: Iterable[str]) -> None:
        """Keep the informers of `nodes` open between uses, and no other: those of the nodes
        no longer held close now, or when their last user is done."""
        self._held = frozenset(nodes)
        for node, shared in list(self._shared.items()):
            if shared.users == 0 and (node not in self._held or shared.informer.failed):
                del self._shared[node]
                closing = asyncio.create_task(shared.informer.close(), name=f"pods-{node}-close")
                self._closing.add(closing)
                closing.add_done_callback(self._closing.discard)

    async def _close(self, node: str, shared: _Shared) -> None:
        if self._shared.get(node) is shared:
            del self._shared[node]
        await shared.informer.close()

    async def close(self) -> None:
        """Close every informer no one uses; those in use close when their user is done."""
        self._held = frozenset()
        for node, shared in list(self._shared.items()):
            if shared.users == 0:
                await self._close(node, shared)
        await asyncio.gather(*self._closing, return_exceptions=True)
