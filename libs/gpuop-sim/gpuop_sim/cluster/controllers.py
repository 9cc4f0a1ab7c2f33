"""What the simulated workload controllers share: ownership, pods from templates, writes.

The Deployment, Job and DaemonSet controllers (``replication.py``, ``jobs.py``,
``daemons.py``) find the pods they control by the owner reference with
``controller: true`` (:func:`owned_pods`), count those neither terminating nor finished
(:func:`is_active`), and create pods from their ``spec.template`` the way
kube-controller-manager does: named after the owner with a random five-character suffix
(from the cluster's seeded random, so a run repeats), the template's labels and
annotations, and an owner reference with ``controller: true`` and
``blockOwnerDeletion: true``, which is what ``kubectl drain`` and the garbage collector
read. :func:`template_hash` is the stable name suffix of a Deployment's ReplicaSets
(label ``pod-template-hash``) and a DaemonSet's ``controller-revision-hash``. Writes shrug
off objects that vanished mid-pass and log a refused create, as a controller's
``FailedCreate`` event would say, instead of failing the pass.
"""

from __future__ import annotations

import abc
import copy
import hashlib
import json
import logging
import random
from collections import defaultdict
from typing import Any

from gpuop_sim.apiserver import errors, kinds
from gpuop_sim.apiserver.deletion import DeleteOptions
from gpuop_sim.apiserver.registry import Registry
from gpuop_sim.apiserver.resources import GroupResource, ResourceType
from gpuop_sim.apiserver.store import Change, Store
from gpuop_sim.cluster.wakeups import Wakeup, unless_gone

Obj = dict[str, Any]

logger = logging.getLogger(__name__)


class WorkloadController(abc.ABC):
    """The lifecycle every workload controller shares: a `Wakeup` that runs `sync` soon
    after a change to one of the resources in `watched`, until `close()`."""

    def __init__(
        self, registry: Registry, rng: random.Random, name: str, watched: set[GroupResource]
    ) -> None:
        self.registry = registry
        self.rng = rng
        self._watched = watched
        self.wakeup = Wakeup(name, self.sync)
        registry.store.observe(self._on_change)

    def close(self) -> None:
        self.wakeup.close()

    def _on_change(self, change: Change) -> None:
        if change.resource in self._watched:
            self.wakeup.soon()

    @abc.abstractmethod
    def sync(self) -> None:
        """One pass over the controller's objects."""


NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
"""The alphabet of apimachinery's random name suffixes (no vowels, no look-alikes)."""


def template_hash(template: Obj) -> str:
    """Ten characters of a hash of the pod template, in the name-suffix alphabet."""
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).digest()
    return "".join(NAME_ALPHABET[byte % len(NAME_ALPHABET)] for byte in digest[:10])


def free_name(
    store: Store, resource: ResourceType, namespace: str, prefix: str, rng: random.Random
) -> str:
    """``prefix`` plus a random suffix no object of ``resource`` in ``namespace`` has."""
    while True:
        name = prefix + "".join(rng.choices(NAME_ALPHABET, k=5))
        if store.get(resource.group_resource, namespace, name) is None:
            return name


def owner_reference(owner: Obj) -> Obj:
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def controller_uid(obj: Obj) -> str | None:
    """The uid of the object's controlling owner, if it has one."""
    for reference in obj["metadata"].get("ownerReferences") or []:
        if reference.get("controller"):
            return str(reference.get("uid"))
    return None


def from_template(owner: Obj, name: str, *, labels: dict[str, str] | None = None) -> Obj:
    """A new object from ``owner``'s ``spec.template``, controlled by ``owner``."""
    template = owner["spec"].get("template") or {}
    metadata = template.get("metadata") or {}
    return {
        "metadata": {
            "name": name,
            "namespace": owner["metadata"]["namespace"],
            "labels": {**(metadata.get("labels") or {}), **(labels or {})},
            "annotations": dict(metadata.get("annotations") or {}),
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": copy.deepcopy(template.get("spec") or {}),
    }


def owned_pods(store: Store) -> dict[str, list[Obj]]:
    """Every pod that has a controlling owner, by the owner's uid."""
    owned: dict[str, list[Obj]] = defaultdict(list)
    for pod in store.view(kinds.PODS.group_resource):
        uid = controller_uid(pod)
        if uid is not None:
            owned[uid].append(pod)
    return owned


def is_active(pod: Obj) -> bool:
    """Neither terminating nor finished: what a controller counts toward its replicas."""
    phase = (pod.get("status") or {}).get("phase")
    return not pod["metadata"].get("deletionTimestamp") and phase not in ("Succeeded", "Failed")


def live(store: Store, resource: ResourceType) -> list[Obj]:
    """The objects of ``resource`` that are not being deleted."""
    return [
        obj
        for obj in store.view(resource.group_resource)
        if not obj["metadata"].get("deletionTimestamp")
    ]


def key(obj: Obj) -> tuple[str, str]:
    return obj["metadata"]["namespace"], obj["metadata"]["name"]


def create(registry: Registry, resource: ResourceType, namespace: str, body: Obj) -> Obj | None:
    """Create, or log why not and return None; the next pass tries again."""
    try:
        return registry.create(resource, namespace, body)
    except errors.ApiError as error:
        name = body["metadata"].get("name", "")
        logger.warning("cannot create %s %s/%s: %s", resource.kind, namespace, name, error)
        return None


def new_pod(
    registry: Registry, rng: random.Random, owner: Obj, *, labels: dict[str, str] | None = None
) -> Obj:
    """The body of a new pod of ``owner``, named ``<owner>-<suffix>``."""
    namespace = owner["metadata"]["namespace"]
    prefix = f"{owner['metadata']['name']}-"
    name = free_name(registry.store, kinds.PODS, namespace, prefix, rng)
    return from_template(owner, name, labels=labels)


def create_pod(registry: Registry, rng: random.Random, owner: Obj) -> Obj | None:
    pod = new_pod(registry, rng, owner)
    return create(registry, kinds.PODS, owner["metadata"]["namespace"], pod)


def delete_pod(registry: Registry, pod: Obj) -> None:
    """Delete gracefully, as controllers do."""
    with unless_gone():
        registry.delete(kinds.PODS, *key(pod), DeleteOptions())


def write_status(registry: Registry, resource: ResourceType, obj: Obj, status: Obj) -> None:
    """Replace the status; an unchanged status is a no-op write the registry drops."""

    def write(current: Obj) -> None:
        current["status"] = status

    with unless_gone():
        registry.mutate(resource, *key(obj), write, subresource="status", validate=False)


def condition(old: Obj, kind: str, status: str, reason: str, message: str, stamp: str) -> Obj:
    """A workload condition; its times move only when its status or reason changes."""
    for previous in old.get("conditions") or []:
        if (previous.get("type"), previous.get("status"), previous.get("reason")) == (
            kind,
            status,
            reason,
        ):
            return dict(previous)
    return {
        "type": kind,
        "status": status,
        "lastUpdateTime": stamp,
        "lastTransitionTime": stamp,
        "reason": reason,
        "message": message,
    }
