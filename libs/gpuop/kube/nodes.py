"""Nodes: cordon and uncordon that remember the initial state, taints, labels and annotations.

Called by the upgrade orchestrator (`cordon-required`, `uncordon-required`, the state
label it mirrors onto each node) and by discovery's cluster role (feature labels).

Labels and annotations are strategic merge patches: a value sets a key, None removes it,
other keys stay as they are; such a patch needs no read and cannot conflict. Cordon and
uncordon decide from what they read, so they patch with the read `resourceVersion` as a
precondition and, on 409, read again and decide again; a caller that knows the node (what
its last write returned, or a watch's copy) passes it as `known`, which spares the read
while it is current. Both take `labels` to set in the same write, so a caller that labels
the node as it cordons it makes one request, not two.

Cordon remembers whether the node was already unschedulable before the upgrade touched
it, in the annotation `INITIAL_STATE_ANNOTATION` (upstream's
`nvidia.com/<drv>-driver-upgrade.node-initial-state.unschedulable` pattern; pass
`annotation=` to share upstream's key). Upstream writes only "true"; we also write
"false", so that a cordon repeated after a crash, which finds the node unschedulable
because of its own first run, does not mistake that for the initial state. Uncordon then
leaves a node that started cordoned cordoned, and removes the annotation either way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from gpuop.kube import errors
from gpuop.kube.client import Kube

Obj = dict[str, Any]

INITIAL_STATE_ANNOTATION = "gpuop.io/driver-upgrade.node-initial-state.unschedulable"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
CONFLICT_ATTEMPTS = 5
"""Fresh reads a read-decide-write makes before it gives up and raises `Conflict`."""

log = logging.getLogger(__name__)


async def get(kube: Kube, name: str) -> Obj:
    return await kube.call(kube.core.read_node, name)


def is_unschedulable(node: Mapping[str, Any]) -> bool:
    return bool((node.get("spec") or {}).get("unschedulable"))


def labels_of(node: Mapping[str, Any]) -> dict[str, str]:
    return dict((node.get("metadata") or {}).get("labels") or {})


def annotations_of(node: Mapping[str, Any]) -> dict[str, str]:
    return dict((node.get("metadata") or {}).get("annotations") or {})


async def patch(kube: Kube, name: str, body: Obj) -> Obj:
    """Apply a strategic merge patch to a node and return the node as written."""
    return await kube.call(kube.core.patch_node, name, body, _content_type=STRATEGIC_MERGE_PATCH)


async def set_labels(kube: Kube, name: str, labels: Mapping[str, str | None]) -> Obj:
    """Set the labels given a value and remove those given None."""
    return await patch(kube, name, {"metadata": {"labels": dict(labels)}})


async def set_annotations(kube: Kube, name: str, annotations: Mapping[str, str | None]) -> Obj:
    """Set the annotations given a value and remove those given None."""
    return await patch(kube, name, {"metadata": {"annotations": dict(annotations)}})


async def update_on_fresh_read(
    kube: Kube,
    name: str,
    decide: Callable[[Obj], Obj | None],
    *,
    attempts: int = CONFLICT_ATTEMPTS,
    known: Obj | None = None,
) -> Obj:
    """Read the node, let `decide` turn it into a patch (None: nothing to do), and apply
    that patch only if the node is still as read; on 409, start over from a fresh read.
    `known`, the node as a write just returned it, stands in for the first read: if it is
    not current any more the patch gets 409 and the node is read (and it is read anyway
    when `decide` finds nothing to do on it)."""
    attempt = 1
    node, fresh = known, False
    while True:
        if node is None:
            node, fresh = await get(kube, name), True
        body = decide(node)
        if body is None:
            if fresh:
                return node
            node = None  # only a patch proves `known` current: read before doing nothing
            continue
        body.setdefault("metadata", {})["resourceVersion"] = node["metadata"]["resourceVersion"]
        try:
            return await patch(kube, name, body)
        except errors.Conflict:
            if attempt >= attempts:
                raise
            attempt += 1
            node = None
            log.info("node %s changed while being updated; reading it again", name)


def _metadata_patch(
    labels: Mapping[str, str | None] | None, annotations: Mapping[str, str | None]
) -> Obj:
    metadata: Obj = {}
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"metadata": metadata} if metadata else {}


async def cordon(
    kube: Kube,
    name: str,
    *,
    annotation: str = INITIAL_STATE_ANNOTATION,
    known: Obj | None = None,
    labels: Mapping[str, str | None] | None = None,
) -> bool:
    """Make the node unschedulable, and set `labels` in the same write; returns whether it
    already was before the first cordon (as recorded in `annotation`, so a repeated cordon
    returns the same answer). `known`: as for `update_on_fresh_read`."""
    initially: bool = False

    def decide(node: Obj) -> Obj | None:
        nonlocal initially
        recorded = annotations_of(node).get(annotation)
        initially = recorded == "true" if recorded is not None else is_unschedulable(node)
        record = {annotation: "true" if initially else "false"} if recorded is None else {}
        body = _metadata_patch(labels, record)
        if not is_unschedulable(node):
            body["spec"] = {"unschedulable": True}
        return body or None

    await update_on_fresh_read(kube, name, decide, known=known)
    return initially


async def uncordon(
    kube: Kube,
    name: str,
    *,
    annotation: str = INITIAL_STATE_ANNOTATION,
    known: Obj | None = None,
    labels: Mapping[str, str | None] | None = None,
) -> bool:
    """Make the node schedulable again unless `annotation` records that it was already
    cordoned before the upgrade; forget the record; set `labels` in the same write. Returns
    whether it is schedulable. `known`: as for `update_on_fresh_read`."""
    schedulable: bool = False

    def decide(node: Obj) -> Obj | None:
        nonlocal schedulable
        recorded = annotations_of(node).get(annotation)
        schedulable = recorded != "true"
        body = _metadata_patch(labels, {annotation: None} if recorded is not None else {})
        if schedulable and is_unschedulable(node):
            body["spec"] = {"unschedulable": None}
        elif not schedulable and not is_unschedulable(node):
            schedulable = True  # someone else uncordoned it meanwhile; that stands
        return body or None

    await update_on_fresh_read(kube, name, decide, known=known)
    return schedulable


def taints_of(node: Mapping[str, Any]) -> list[Obj]:
    return list((node.get("spec") or {}).get("taints") or [])


def _is(taint: Mapping[str, Any], key: str, effect: str) -> bool:
    return taint.get("key") == key and taint.get("effect") == effect


async def taint(
    kube: Kube, name: str, key: str, effect: str = "NoSchedule", *, known: Obj | None = None
) -> None:
    """Put the taint `key:effect` on the node unless it is there. `spec.taints` is replaced
    whole by any patch (no merge key), so the list is written as read, with the read
    `resourceVersion` as a precondition: a taint someone else adds meanwhile is kept."""

    def decide(node: Obj) -> Obj | None:
        taints = taints_of(node)
        if any(_is(t, key, effect) for t in taints):
            return None
        return {"spec": {"taints": [*taints, {"key": key, "effect": effect}]}}

    await update_on_fresh_read(kube, name, decide, known=known)


async def untaint(
    kube: Kube, name: str, key: str, effect: str = "NoSchedule", *, known: Obj | None = None
) -> None:
    """Remove the taint `key:effect` from the node, keeping every other (as `taint`)."""

    def decide(node: Obj) -> Obj | None:
        taints = taints_of(node)
        kept = [t for t in taints if not _is(t, key, effect)]
        if len(kept) == len(taints):
            return None
        return {"spec": {"taints": kept or None}}

    await update_on_fresh_read(kube, name, decide, known=known)
