"""The pods on a node whose saga waits for jobs, recorded as `kube.PodsObserved` events.

A saga in wait-for-jobs-required moves on when a `PodsObserved` reports no pod of the
policy's `waitForCompletion.podSelector` Running or Pending on the node (or when the wait's
deadline passes). The controller calls `observe` for every such saga on each reconcile; the
event id is derived from the saga, its attempt and the counts, so an unchanged observation
is stored once and the log holds one event per change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuop.bus import Bus
from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.events import command_id, new_event
from gpuop.events import kube as observed
from gpuop.events.fields import NamespacedName
from gpuop.kube import client, draining, pods
from gpuop.saga import NodeSaga
from gpuop.services.upgrade_orchestrator.acting import SOURCE

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


async def observe(
    bus: Bus, kube: client.Kube, saga: NodeSaga, selector: str, *, clock: Clock = SYSTEM_CLOCK
) -> observed.PodsObserved:
    """Publish what runs on the saga's node now; returns the observation."""
    on_node = await pods.on_node(kube, saga.node)
    selected = await pods.on_node(kube, saga.node, label_selector=selector)
    seen = count(on_node, selected)
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
    return seen
