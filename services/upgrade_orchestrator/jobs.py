"""The pods on a node whose saga waits for jobs, recorded as `kube.PodsObserved` events.

A saga in wait-for-jobs-required moves on when a `PodsObserved` reports no pod of the
policy's `waitForCompletion.podSelector` Running or Pending on the node (or when the wait's
deadline passes). The controller hands `PodWatches.follow` the sagas that wait on each
reconcile; each such node gets one list-watch of its pods (`pods.watch_on_node`: a LIST,
then a WATCH), matched against the selector here, and an observation is published whenever
the counts change, until the saga moves on. Jobs can run for hours: a LIST per reconcile
would cost the API server a request per node and second meanwhile. The event id is derived
from the saga, its attempt and the counts, so an unchanged observation is stored once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from gpuop.bus import Bus
from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.events import command_id, new_event
from gpuop.events import kube as observed
from gpuop.events.fields import NamespacedName
from gpuop.kube import client, draining, errors, pods
from gpuop.policy import selectors
from gpuop.saga import NodeSaga
from gpuop.services.upgrade_orchestrator.acting import SOURCE

log = logging.getLogger(__name__)

SAMPLE = 32
"""Pods named in one observation at most (the event's limit)."""


def _active(pod: Mapping[str, Any]) -> bool:
    return pods.phase(pod) in ("Running", "Pending") and not pods.is_terminating(pod)


def count(
    node_pods: Iterable[dict[str, Any]], job_pods: Iterable[Mapping[str, Any]]
) -> observed.PodsObserved:
    """The observation for the node's pods and, among them, the selected job pods."""
    active = [pod for pod in node_pods if _active(pod)]
    jobs = [pod for pod in job_pods if _active(pod)]
    drainable = draining.plan(active, draining.DrainOptions()).remove
    sample = [pods.PodRef.of(pod) for pod in jobs[:SAMPLE]]
    return observed.PodsObserved(
        gpu_pods=sum(pods.uses_gpu(pod) for pod in active),
        job_pods=len(jobs),
        drainable_pods=len(drainable),
        sample=tuple(NamespacedName(namespace=ref.namespace, name=ref.name) for ref in sample),
    )


def _key(saga: NodeSaga, selector: str) -> tuple[str, int, str]:
    return (saga.saga_id, saga.attempt, selector)


class PodWatches:
    """One list-watch per node whose saga waits for jobs, publishing its observations."""

    def __init__(self, bus: Bus, kube: client.Kube, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self._bus = bus
        self._kube = kube
        self._clock = clock
        self._watches: dict[str, tuple[tuple[str, int, str], asyncio.Task[None]]] = {}

    def follow(self, waiting: Iterable[NodeSaga], selector: str) -> None:
        """Watch the nodes of `waiting` (sagas in wait-for-jobs-required) for pods that
        `selector` selects, and stop watching every other node; a watch that failed is
        started again."""
        wanted = {saga.node: saga for saga in waiting} if selector else {}
        for node, (key, task) in list(self._watches.items()):
            saga = wanted.get(node)
            if saga is None or _key(saga, selector) != key or task.done():
                task.cancel()
                del self._watches[node]
        for node, saga in wanted.items():
            if node not in self._watches:
                task = asyncio.create_task(self._watch(saga, selector), name=f"jobs-{node}")
                self._watches[node] = (_key(saga, selector), task)

    async def _watch(self, saga: NodeSaga, selector: str) -> None:
        reported: observed.PodsObserved | None = None
        try:
            async with pods.watch_on_node(self._kube, saga.node, clock=self._clock) as watch:
                await watch.list()
                while True:
                    on_node = list(watch.objects.values())
                    selected = [
                        pod
                        for pod in on_node
                        if selectors.matches(
                            selector, (pod.get("metadata") or {}).get("labels") or {}
                        )
                    ]
                    seen = count(on_node, selected)
                    if seen != reported:
                        await _publish(self._bus, saga, seen, self._clock)
                        reported = seen
                    await anext(watch)
        except errors.KubeError as error:
            # the next reconcile starts the watch again
            log.warning("watching the pods of node %s failed: %s", saga.node, error)

    async def close(self) -> None:
        """Stop every watch."""
        tasks = [task for _, task in self._watches.values()]
        self._watches.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _publish(bus: Bus, saga: NodeSaga, seen: observed.PodsObserved, clock: Clock) -> None:
    key = f"pods-{seen.job_pods}-{seen.gpu_pods}-{seen.drainable_pods}"
    await bus.publish(
        new_event(
            seen,
            node=saga.node,
            source=SOURCE,
            id=command_id(saga.saga_id, key, saga.attempt),
            correlationid=saga.saga_id,
            now=clock.now(),
        )
    )
