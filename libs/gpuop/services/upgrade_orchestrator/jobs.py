"""The pods on a node whose saga waits for jobs, recorded as `kube.PodsObserved` events.

A saga in wait-for-jobs-required moves on when a `PodsObserved` reports no pod of the
policy's `waitForCompletion.podSelector` Running or Pending on the node (or when the wait's
deadline passes). The controller hands `PodWatches.follow` every saga on each reconcile;
the node of each that waits is followed through its shared informer (`nodepods`: one LIST,
then one WATCH, which the pod deletion and the drain after it read as well), matched
against the selector here, and an observation is published whenever the counts change,
until the saga moves on. Jobs can run for hours: a LIST per reconcile would cost the API
server a request per node and second meanwhile. The event id is derived from the saga, its
attempt and the counts, so an unchanged observation is stored once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from gpuop.bus import Bus
from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.events import ids
from gpuop.events import kube as observed
from gpuop.events.fields import NamespacedName
from gpuop.events.upgrade import UpgradeState
from gpuop.kube import client, draining, errors, pods
from gpuop.policy import selectors
from gpuop.saga import NodeSaga
from gpuop.services.upgrade_orchestrator.nodepods import POD_STATES, NodePods
from gpuop.services.upgrade_orchestrator.publishing import Publisher

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
    """Observations of the pods of every node whose saga waits for jobs."""

    def __init__(self, bus: Bus, kube: client.Kube, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self._publisher = Publisher(bus, clock)
        self._clock = clock
        self.node_pods = NodePods(kube, clock=clock)
        """The informers of the nodes' pods, shared with the executor's pod deletions and
        drains."""
        self._watches: dict[str, tuple[tuple[str, int, str], asyncio.Task[None]]] = {}

    def follow(self, sagas: Iterable[NodeSaga], selector: str) -> None:
        """Keep the pods of the nodes of `sagas` in the steps that read them followed
        (`nodepods.POD_STATES`), observe those waiting for jobs for pods that `selector`
        selects, and stop for every other node; an observer that failed is started again."""
        sagas = list(sagas)
        self.node_pods.hold(saga.node for saga in sagas if saga.state in POD_STATES)
        waiting = [saga for saga in sagas if saga.state is UpgradeState.WAIT_FOR_JOBS_REQUIRED]
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
            async with self.node_pods.using(saga.node) as watch:
                while True:
                    since = watch.version
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
                        await _publish(self._publisher, saga, seen)
                        reported = seen
                    await watch.changed(since)
        except errors.KubeError as error:
            # the next reconcile starts the watch again
            log.warning("watching the pods of node %s failed: %s", saga.node, error)

    async def close(self) -> None:
        """Stop every observer and close the informers no one uses."""
        tasks = [task for _, task in self._watches.values()]
        self._watches.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.node_pods.close()


async def _publish(publisher: Publisher, saga: NodeSaga, seen: observed.PodsObserved) -> None:
    counts = (seen.job_pods, seen.gpu_pods, seen.drainable_pods)
    await publisher.event(
        seen,
        node=saga.node,
        id=ids.pods_observed(saga.saga_id, counts, saga.attempt),
        correlationid=saga.saga_id,
    )
