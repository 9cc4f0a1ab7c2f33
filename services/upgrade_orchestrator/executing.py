"""Executes the decision core's Kubernetes actions and says how each ended, as an event.

`KubeActions` is the seam: `KubeExecutor` acts through `gpuop.kube` on a real (or the
simulated) API server; tests use a fake. The outbox (`acting`) calls `execute` for every
action of a persisted decision and publishes the returned outcome (`NodeCordoned`,
`NodeUncordoned`, `PodsDeleted` / `PodDeletionFailed`, `DrainCompleted` / `DrainFailed`)
carrying the action's id as `action_id`; the core then reads that outcome from the log like
any other event. Labels and Kubernetes Events have no outcome the core waits for.

Every transition's state label is written first (`gpuop.saga.drafting`); the node that
write returns serves the Event and the cordon or uncordon that follow it, which then need
not read the node (`KubeExecutor._written`).

Executing an action twice is harmless: `nodes.cordon` records in an annotation whether the
node was cordoned before the first execution, so a repeat reports the same
`was_unschedulable`; deleting or evicting pods already gone succeeds.
"""

from __future__ import annotations

from typing import Protocol

from gpuop.events import kube as observed
from gpuop.events.fields import NamespacedName
from gpuop.kube import client, draining, errors, nodes, pods
from gpuop.kube.recording import EventRecorder, EventType
from gpuop.saga import actions

PODS_REPORTED = 64
"""Pods named in a failure event at most (the event's limit)."""


class KubeActions(Protocol):
    """Something that can carry out the core's Kubernetes actions."""

    async def execute(self, node: str, action: actions.KubeAction) -> observed.KubeEvent | None:
        """Do `action` on `node`; return its outcome, or None for actions without one.
        Raises `errors.KubeError` when the API server could not be reached or refused."""
        ...


def _names(refs: tuple[str, ...] | list[str]) -> tuple[NamespacedName, ...]:
    named = []
    for ref in refs[:PODS_REPORTED]:
        namespace, _, name = ref.partition("/")
        named.append(NamespacedName(namespace=namespace, name=name))
    return tuple(named)


def _failure_reason(error: errors.DrainError) -> observed.EvictionFailureReason:
    reasons = observed.EvictionFailureReason
    if isinstance(error, errors.DrainTimedOut):
        return reasons.PDB_BLOCKED if error.pdb else reasons.TIMEOUT
    if isinstance(error, errors.DrainRefused) and "emptydir" in error.reason.lower():
        return reasons.LOCAL_STORAGE
    return reasons.UNMANAGED_PODS


def _trimmed(node: client.Obj) -> client.Obj:
    """What a cordon, an uncordon or an Event needs of a node written a moment ago."""
    metadata = node.get("metadata") or {}
    annotations = nodes.annotations_of(node)
    kept = {
        key: annotations[key] for key in (nodes.INITIAL_STATE_ANNOTATION,) if key in annotations
    }
    return {
        "metadata": {
            "name": metadata.get("name"),
            "uid": metadata.get("uid"),
            "resourceVersion": metadata.get("resourceVersion"),
            "annotations": kept,
        },
        "spec": {"unschedulable": nodes.is_unschedulable(node)},
    }


class KubeExecutor:
    """`KubeActions` through the official client."""

    def __init__(self, kube: client.Kube, recorder: EventRecorder) -> None:
        self._kube = kube
        self._recorder = recorder
        self._written: dict[str, client.Obj] = {}
        """Node -> the node as the state label's write returned it, trimmed to a few hundred
        bytes. Every transition writes the label first, so the Event that follows takes the
        node's uid from here and a cordon or uncordon decides on it instead of reading the
        node again (a 409 says when it is not current)."""

    async def execute(self, node: str, action: actions.KubeAction) -> observed.KubeEvent | None:
        if isinstance(action, actions.Cordon):
            was = await nodes.cordon(self._kube, node, known=self._written.pop(node, None))
            return observed.NodeCordoned(action_id=action.id, was_unschedulable=was)
        if isinstance(action, actions.Uncordon):
            await nodes.uncordon(self._kube, node, known=self._written.pop(node, None))
            return observed.NodeUncordoned(action_id=action.id)
        if isinstance(action, actions.SetStateLabel):
            self._written.pop(node, None)
            written = await nodes.set_labels(
                self._kube, node, {actions.STATE_LABEL: action.value.value}
            )
            self._written[node] = _trimmed(written)
            return None
        if isinstance(action, actions.RecordEvent):
            kind = EventType.WARNING if action.warning else EventType.NORMAL
            uid = (self._written.get(node) or {}).get("metadata", {}).get("uid")
            await self._recorder.node_event(
                node, action.reason, action.message, event_type=kind, node_uid=uid
            )
            return None
        if isinstance(action, actions.DeletePods):
            return await self._delete_gpu_pods(node, action)
        return await self._drain(node, action)

    async def _delete_gpu_pods(
        self, node: str, action: actions.DeletePods
    ) -> observed.PodsDeleted | observed.PodDeletionFailed:
        options = draining.DrainOptions(
            force=action.force,
            delete_emptydir=action.delete_empty_dir,
            timeout=float(max(action.timeout_seconds, 1)),
            pod_filter=pods.uses_gpu,
            retry_interval=1.0,
        )
        try:
            result = await draining.drain_node(self._kube, node, options)
        except errors.DrainError as error:
            return observed.PodDeletionFailed(
                action_id=action.id,
                reason=_failure_reason(error),
                pods=_names(error.pods),
                message=str(error)[:2048],
            )
        return observed.PodsDeleted(action_id=action.id, deleted=len(result.evicted))

    async def _drain(
        self, node: str, action: actions.Drain
    ) -> observed.DrainCompleted | observed.DrainFailed:
        options = draining.DrainOptions(
            force=action.force,
            delete_emptydir=action.delete_empty_dir,
            timeout=float(max(action.timeout_seconds, 1)),
            pod_selector=action.pod_selector or None,
            retry_interval=1.0,
        )
        try:
            result = await draining.drain_node(self._kube, node, options)
        except errors.DrainError as error:
            blocking = None
            if isinstance(error, errors.DrainTimedOut) and error.pdb:
                blocking = _names([error.pdb])[0]
            return observed.DrainFailed(
                action_id=action.id,
                reason=_failure_reason(error),
                blocking_pdb=blocking,
                pods=_names(error.pods),
                message=str(error)[:2048],
            )
        return observed.DrainCompleted(action_id=action.id, evicted=len(result.evicted))
