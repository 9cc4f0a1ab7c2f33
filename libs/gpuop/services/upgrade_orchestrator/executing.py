"""Executes the decision core's Kubernetes actions and says how each ended, as an event.

`KubeActions` is the seam: `KubeExecutor` acts through `gpuop.kube` on a real (or the
simulated) API server; tests use a fake. The outbox (`acting`) calls `execute` for every
action of a persisted decision and publishes the returned outcome (`NodeCordoned`,
`NodeUncordoned`, `NodeUntainted`, `PodsDeleted` / `PodDeletionFailed`, `DrainCompleted` /
`DrainFailed`, `ValidationPodSucceeded` / `ValidationPodFailed`) carrying the action's id
as `action_id`; the core then reads that outcome from
the log like any other event; a remediation's release (`MirrorHealth` with `taint` False)
reports `NodeUntainted` once the condition and the taint (on a DRA node, the quarantined
devices' DeviceTaintRules, `gpuop.kube.dra`) were written, so the
remediation is done only after the API server shows the node released. Labels, the taint a
new node is brought up behind, the remediation's other marks and Kubernetes Events have no
outcome the core waits for.

Every request counts (the API requests test and the scale benchmark hold them per upgraded
node), so nothing here reads what it can know: a cordon or uncordon decides on the node as the
controller's node watch last saw it (`NodeWatcher.node`), or as this executor's last label
write returned it, and writes the decision's state label in the same PATCH when the outbox
folded it in (`Cordon.label`); a 409 says when that copy was not current, and only then is
the node read. An Event takes the node's uid from the same copies. Pod deletion and drain
read the node's pods from the informer the controller shares between the steps that need
them (`nodepods`), and open a list-watch of their own only when there is none. Pod deletion
removes the pods holding a device of the components upgraded (`DeletePods.components`,
`pods.holds`), reading the ResourceClaims of the pods that use any, one GET each: nothing
more for a node whose pods use none; the pods that reserve a claim of any DRA driver on the
node's GPUs are known from the bus (`gpuop.inventory.claims.NodeClaims`) and go too.

Executing an action twice is harmless: `nodes.cordon` records in an annotation whether the
node was cordoned before the first execution, so a repeat reports the same
`was_unschedulable`; deleting or evicting pods already gone succeeds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from gpuop.events import kube as observed
from gpuop.events.device_api_commands import DeviceApi, DeviceApiApplied
from gpuop.events.dra import DRIVER
from gpuop.events.fields import NamespacedName
from gpuop.events.upgrade import DRIVER_NOT_READY_TAINT, UpgradeState
from gpuop.inventory.claims import NodeClaims
from gpuop.kube import client, conditions, dra, draining, errors, nodes, pods, validationpods
from gpuop.kube.recording import EventRecorder, EventType
from gpuop.policy import selectors
from gpuop.saga import actions
from gpuop.saga.mig import actions as mig_actions
from gpuop.saga.remediation import actions as remedies
from gpuop.services.upgrade_orchestrator.nodepods import NodePods

ServedApi = Callable[[str], Awaitable[DeviceApiApplied | None]]
"""The node's device plugin's latest word on the API it serves, from the log."""

CLAIMS_READ_WAIT_SECONDS = 10.0
"""How long a pod deletion waits for the log's claim facts to be read before it goes on with
the claims it knows: pods of NVIDIA's DRA drivers are still found from the API server's
claims (`pods.holders_filter`); other drivers' claim holders may be missed, and a warning
says so. Without the bound a read that cannot start (its consumer name held by a reader
orphaned in a server loss) held every pod deletion until its step's deadline failed it."""

log = logging.getLogger(__name__)

PODS_REPORTED = 64
"""Pods named in a failure event at most (the event's limit)."""


class KubeActions(Protocol):
    """Something that can carry out the core's Kubernetes actions."""

    async def execute(self, node: str, action: Any) -> observed.KubeEvent | None:
        """Do `action` (an upgrade's `actions.KubeAction`, or a remediation's
        `remedies.RemediationAction`) on `node`; return its outcome, or None for actions
        without one.
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
            "labels": {actions.STATE_LABEL: nodes.labels_of(node).get(actions.STATE_LABEL)},
            "annotations": kept,
        },
        "spec": {"unschedulable": nodes.is_unschedulable(node)},
    }


def _state_label(value: UpgradeState | None) -> dict[str, str | None] | None:
    return None if value is None else {actions.STATE_LABEL: value.value}


def _narrowed(options: draining.DrainOptions) -> draining.DrainOptions:
    """`options` for the shared informer, which has every pod of the node: the pod selector
    applied here, as a filter, instead of by the server."""
    selector, accepted = options.pod_selector, options.pod_filter
    if not selector:
        return options

    def selected(pod: Mapping[str, Any]) -> bool:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        return selectors.matches(selector, labels) and (accepted is None or accepted(pod))

    return dataclasses.replace(options, pod_selector=None, pod_filter=selected)


class KubeExecutor:
    """`KubeActions` through the official client."""

    def __init__(
        self,
        kube: client.Kube,
        recorder: EventRecorder,
        *,
        watched_node: Callable[[str], Mapping[str, Any] | None] = lambda name: None,
        node_pods: NodePods | None = None,
        own_namespace: str = "default",
        claims: NodeClaims | None = None,
        served: ServedApi | None = None,
    ) -> None:
        self._kube = kube
        self._served = served
        """What the node's device plugin last said it serves (`device_apis.served`); None:
        every node serves the device plugin API."""
        self._claims = claims
        """Every node's ResourceClaims on its GPUs, from the bus: their pods hold the GPU."""
        self._own_namespace = own_namespace
        """Where a validation pod goes when the policy names no namespace."""
        self._recorder = recorder
        self._watched_node = watched_node
        """The node as a watch last saw it (`NodeWatcher.node`), or None."""
        self._node_pods = node_pods
        self._written: dict[str, client.Obj] = {}
        """Node -> the node as the state label's write returned it, trimmed to a few hundred
        bytes; dropped once a cordon or uncordon changed the node."""

    def _known(self, node: str) -> client.Obj | None:
        """The freshest copy of the node at hand, read from no server: the watch's, unless
        it does not show the state label this executor wrote last yet (the watch lags a
        moment behind a write). resourceVersions do not say which of two copies is newer;
        a wrong guess costs a 409 and a read, never a wrong write."""
        watched, written = self._watched_node(node), self._written.get(node)
        if watched is None:
            return written
        label = actions.STATE_LABEL
        if written is not None and (
            nodes.labels_of(watched).get(label) != nodes.labels_of(written).get(label)
        ):
            return written
        return dict(watched)

    def _uid(self, node: str) -> str | None:
        known = self._written.get(node) or self._watched_node(node) or {}
        uid = (known.get("metadata") or {}).get("uid")
        return str(uid) if uid else None

    async def execute(self, node: str, action: Any) -> observed.KubeEvent | None:
        if isinstance(action, remedies.MirrorHealth):
            await self._mirror_health(node, action)
            return observed.NodeUntainted(action_id=action.id) if action.taint is False else None
        if isinstance(action, remedies.EvictPods):
            return await self._evict_named(node, action)
        if isinstance(action, remedies.MarkReplacement):
            self._written.pop(node, None)
            await nodes.set_labels(self._kube, node, {remedies.REPLACEMENT_LABEL: action.value})
            return None
        if isinstance(action, mig_actions.SetConfigState):
            self._written.pop(node, None)
            await nodes.set_labels(self._kube, node, {action.key: action.value.value})
            return None
        if isinstance(action, actions.Cordon):
            was = await nodes.cordon(
                self._kube, node, known=self._known(node), labels=_state_label(action.label)
            )
            self._written.pop(node, None)
            return observed.NodeCordoned(action_id=action.id, was_unschedulable=was)
        if isinstance(action, actions.Uncordon):
            await nodes.uncordon(
                self._kube, node, known=self._known(node), labels=_state_label(action.label)
            )
            self._written.pop(node, None)
            return observed.NodeUncordoned(action_id=action.id)
        # the taint and untaint read the node: the copies at hand are trimmed of its taints
        if isinstance(action, actions.Taint):
            await nodes.taint(self._kube, node, DRIVER_NOT_READY_TAINT)
            self._written.pop(node, None)
            return None
        if isinstance(action, actions.Untaint):
            await nodes.untaint(self._kube, node, DRIVER_NOT_READY_TAINT)
            self._written.pop(node, None)
            return observed.NodeUntainted(action_id=action.id)
        if isinstance(action, actions.SetStateLabel):
            self._written.pop(node, None)
            written = await nodes.set_labels(
                self._kube, node, {actions.STATE_LABEL: action.value.value}
            )
            self._written[node] = _trimmed(written)
            return None
        if isinstance(action, actions.RecordEvent):
            kind = EventType.WARNING if action.warning else EventType.NORMAL
            await self._recorder.node_event(
                node, action.reason, action.message, event_type=kind, node_uid=self._uid(node)
            )
            return None
        if isinstance(action, actions.DeletePods):
            return await self._delete_holders(node, action)
        if isinstance(action, actions.RunValidationPod):
            return await self._validation_pod(node, action)
        return await self._drain(node, action)

    async def _mirror_health(self, node: str, action: remedies.MirrorHealth) -> None:
        """The `GPUHealthy` condition and the taint, as the remediation decided them; both
        written when this returns."""
        status, reason, message = conditions.gpu_healthy_condition(dict(action.unhealthy))
        if action.detail:
            message = f"{message}; {action.detail}"[: conditions.MAX_MESSAGE]
        await conditions.set_node_condition(
            self._kube, node, conditions.GPU_HEALTHY_CONDITION, status, reason, message
        )
        taint = conditions.GPU_UNHEALTHY_TAINT
        if action.devices is not None:
            await self._taint_devices(node, action.devices, action.taint)
        elif action.taint is True:
            await conditions.add_taint(self._kube, node, taint, "", "NoSchedule")
        elif action.taint is False:
            await conditions.remove_taint(self._kube, node, taint)
        self._written.pop(node, None)

    async def _taint_devices(self, node: str, devices: Sequence[str], taint: bool | None) -> None:
        """Put (`taint` True) or delete (False) the `NoSchedule` DeviceTaintRule of each of
        the node's DRA devices, named after node and device, so a repeat finds its own."""
        for device in devices:
            if taint is True:
                rule = dra.taint_rule(
                    driver=DRIVER, node=node, device=device, key=conditions.GPU_UNHEALTHY_TAINT
                )
                await dra.put_taint_rule(self._kube, rule)
            elif taint is False:
                await dra.delete_taint_rule(self._kube, dra.taint_rule_name(node, device))

    async def _evict_named(
        self, node: str, action: remedies.EvictPods
    ) -> observed.PodsDeleted | observed.PodDeletionFailed:
        """Evict the pods the remediation named (those holding the affected GPUs), no other."""
        named = {(pod.namespace, pod.name) for pod in action.pods}

        def holder(pod: Mapping[str, Any]) -> bool:
            metadata = pod.get("metadata") or {}
            return (metadata.get("namespace"), metadata.get("name")) in named

        return await self._delete_pods(node, action, pod_filter=holder)

    async def _validation_pod(
        self, node: str, action: actions.RunValidationPod
    ) -> observed.ValidationPodSucceeded | observed.ValidationPodFailed:
        namespace = action.namespace or self._own_namespace
        spec = validationpods.PodSpec(
            image=action.image,
            command=action.command,
            namespace=namespace,
            runtime_class_name=action.runtime_class_name,
            device_class=action.device_class or await self._dra_class(node),
            gpu_uuids=action.gpu_uuids,
            all_gpus=action.all_gpus,
        )
        ref = NamespacedName(namespace=namespace, name=validationpods.pod_name(node, action.id))
        reasons = observed.ValidationPodFailureReason
        try:
            end = await validationpods.run(
                self._kube, node, action.id, spec, float(max(action.timeout_seconds, 1))
            )
        except (errors.BadRequest, errors.Forbidden, errors.Invalid, errors.NotFound) as error:
            # refused for good (a namespace that does not exist, RBAC, a bad image name):
            # other KubeErrors are temporary and go to the outbox's retries
            message = f"the API server refused the pod: {error}"[:2048]
            return observed.ValidationPodFailed(
                action_id=action.id, pod=ref, reason=reasons.REFUSED, message=message
            )
        ref = NamespacedName(namespace=namespace, name=end.pod.name)
        if end.succeeded:
            return observed.ValidationPodSucceeded(action_id=action.id, pod=ref)
        reason = reasons.TIMEOUT if end.phase == "Timeout" else reasons.FAILED
        message = f"{end.phase}: {end.message}".rstrip(": ")[:2048]
        return observed.ValidationPodFailed(
            action_id=action.id, pod=ref, reason=reason, message=message
        )

    async def _dra_class(self, node: str) -> str:
        """`gpu.nvidia.com` when the node's device plugin last said it serves the node's GPUs
        through DRA, else empty (`nvidia.com/gpu`): the upgrade's and the remediation's pod
        rung ask a GPU the way the node serves them when the pod runs. A switch never runs
        meanwhile: every kind holds its node."""
        if self._served is None:
            return ""
        applied = await self._served(node)
        serves_dra = applied is not None and applied.serving and applied.api is DeviceApi.DRA
        return DRIVER if serves_dra else ""

    async def _remove_pods(self, node: str, options: draining.DrainOptions) -> draining.DrainResult:
        if self._node_pods is None:
            return await draining.drain_node(self._kube, node, options)
        async with self._node_pods.using(node) as watched:
            return await draining.drain_node(
                self._kube, node, _narrowed(options), node_pods=watched
            )

    async def _delete_holders(
        self, node: str, action: actions.DeletePods
    ) -> observed.PodsDeleted | observed.PodDeletionFailed:
        components = action.components
        claimants: frozenset[tuple[str, str]] = frozenset()
        if self._claims is not None:
            try:  # the log's claims read first: no holder overlooked
                await asyncio.wait_for(self._claims.ready.wait(), CLAIMS_READ_WAIT_SECONDS)
            except TimeoutError:
                log.warning(
                    "the claims of the log are not read yet after %.0f s: deleting the holders "
                    "on %s with the claims known (other DRA drivers' holders may be missed)",
                    CLAIMS_READ_WAIT_SECONDS,
                    node,
                )
            claimants = self._claims.claimants(node)

        async def holders_of(
            listed: Sequence[Mapping[str, Any]],
        ) -> Callable[[Mapping[str, Any]], bool]:
            return await pods.holders_filter(self._kube, components, listed, claimants)

        return await self._delete_pods(node, action, pod_filter_from=holders_of)

    async def _delete_pods(
        self, node: str, action: actions.DeletePods | remedies.EvictPods, **which: Any
    ) -> observed.PodsDeleted | observed.PodDeletionFailed:
        """Evict the pods of `node` that `which` selects (`DrainOptions.pod_filter` or
        `pod_filter_from`), with the action's force, emptyDir and timeout."""
        options = draining.DrainOptions(
            force=action.force,
            delete_emptydir=action.delete_empty_dir,
            timeout=float(max(action.timeout_seconds, 1)),
            retry_interval=1.0,
            **which,
        )
        try:
            result = await self._remove_pods(node, options)
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
            result = await self._remove_pods(node, options)
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
