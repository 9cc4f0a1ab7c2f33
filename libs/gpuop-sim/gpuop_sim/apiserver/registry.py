"""The write rules of the simulated API server, and its in-process API.

``Registry`` is what the generic registry store and the per-kind strategies are in a real
API server: it turns a create, update, patch or delete into the object the store records,
enforcing optimistic concurrency (409 on a stale ``resourceVersion``), server-set metadata
(``uid``, ``creationTimestamp``, ``generation`` bumped only on spec changes), the split
between a resource and its ``status`` subresource, no-op writes that bump nothing, and
deletion with finalizers and graceful pod termination.

Callers: the HTTP handlers (``handlers.py``), eviction, the controllers, and in-process
simulation components such as the simulated kubelet, which use :meth:`Registry.mutate`
and :meth:`Registry.complete_pod_termination`.
"""

from __future__ import annotations

import copy
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop_sim.apiserver import (
    applying,
    deletion,
    errors,
    kinds,
    patching,
    updates,
    validation,
)
from gpuop_sim.apiserver.deletion import DeleteOptions, Deletion
from gpuop_sim.apiserver.resources import Catalog, ResourceType
from gpuop_sim.apiserver.selectors import FieldSelector, LabelSelector
from gpuop_sim.apiserver.store import Store
from gpuop_sim.apiserver.timestamps import format_time

Obj = dict[str, Any]

_GENERATED_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


@dataclass(frozen=True)
class _Updated:
    """Who made an Update, for its managedFields entry."""

    manager: str
    subresource: str | None
    sent: list[Obj] | None
    """Valid managedFields the client sent, which replace the stored ones."""


class Registry:
    """Create, read, update, patch and delete with Kubernetes' rules, over the store."""

    def __init__(
        self,
        store: Store,
        catalog: Catalog,
        *,
        clock: Clock = SYSTEM_CLOCK,
        kubelet_delay: float | None = 0.0,
    ) -> None:
        self.store = store
        self.catalog = catalog
        self.clock = clock
        self.kubelet = deletion.StandInKubelet(kubelet_delay, self._kubelet_confirms)
        """Confirms terminating pods after ``kubelet_delay`` seconds (capped by the grace
        period); with None, :meth:`complete_pod_termination` is left to a simulated kubelet."""
        self.orphaned_owners: set[str] = set()
        """UIDs deleted with ``propagationPolicy: Orphan``: the garbage collector keeps
        their dependents."""

    def close(self) -> None:
        self.kubelet.close()

    # Reads.

    def get(self, resource: ResourceType, namespace: str, name: str) -> Obj:
        obj = self.store.get(resource.group_resource, namespace, name)
        if obj is None:
            raise errors.not_found(resource.group_resource, name)
        return self._present(resource, obj)

    def list_objects(
        self,
        resource: ResourceType,
        namespace: str | None = None,
        *,
        label_selector: LabelSelector | None = None,
        field_selector: FieldSelector | None = None,
    ) -> tuple[list[Obj], int]:
        """Matching objects sorted by namespace and name, and the list's resourceVersion."""
        items = [
            self._present(resource, obj)
            for obj in self.store.view(resource.group_resource, namespace)
            if (label_selector is None or label_selector.matches(obj))
            and (field_selector is None or field_selector.matches(obj))
        ]
        return items, self.store.resource_version

    # Writes.

    def create(
        self,
        resource: ResourceType,
        namespace: str,
        body: Obj,
        *,
        dry_run: bool = False,
        manager: str = applying.IN_PROCESS_MANAGER,
        applied: bool = False,
    ) -> Obj:
        """Create ``body``; with ``applied``, its managedFields are an apply's, kept as
        given, else the creator gets an Update entry for every field."""
        obj = copy.deepcopy(body)
        metadata = updates.metadata_of(obj)
        self._place(resource, metadata, namespace)
        if metadata.get("resourceVersion"):
            raise errors.bad_request("resourceVersion should not be set on objects to be created")
        if not metadata.get("name") and metadata.get("generateName"):
            suffix = "".join(random.choices(_GENERATED_NAME_ALPHABET, k=5))
            metadata["name"] = metadata["generateName"] + suffix
        name = metadata.get("name", "")
        if resource.namespaced:
            self._check_namespace_open(resource, namespace, name)
        managed = metadata.get("managedFields") if applied else None
        for key in (*updates.SERVER_METADATA, "managedFields", "selfLink"):
            metadata.pop(key, None)
        metadata["uid"] = str(uuid.uuid4())
        metadata["creationTimestamp"] = format_time(self.clock.now())
        metadata["generation"] = 1
        obj["apiVersion"], obj["kind"] = resource.api_version, resource.kind
        if resource.prepare_create is not None:
            resource.prepare_create(obj)
        if resource.normalize is not None:
            resource.normalize(obj)
        if managed is None:
            managed = applying.record_update(
                resource,
                None,
                obj,
                manager=manager,
                subresource=None,
                now=self._now(),
                managed=None,
            )
        metadata["managedFields"] = managed
        updates.tidy_metadata(obj)
        self._validate(resource, obj, None)
        if self.store.get(resource.group_resource, namespace if resource.namespaced else "", name):
            raise errors.already_exists(resource.group_resource, name)
        if dry_run:
            return self._present(resource, obj)
        return self._present(resource, self._put(resource, obj))

    def update(
        self,
        resource: ResourceType,
        namespace: str,
        name: str,
        body: Obj,
        *,
        subresource: str | None = None,
        dry_run: bool = False,
        validate: bool = True,
        manager: str = applying.IN_PROCESS_MANAGER,
    ) -> Obj:
        obj = copy.deepcopy(body)
        metadata = updates.metadata_of(obj)
        updates.check_name(metadata, name)
        self._place(resource, metadata, namespace)
        old = self._existing(resource, namespace, name)
        return self._commit_sent(resource, old, obj, subresource, dry_run, validate, manager)

    def patch(
        self,
        resource: ResourceType,
        namespace: str,
        name: str,
        content_type: str,
        patch: Any,
        *,
        subresource: str | None = None,
        dry_run: bool = False,
        manager: str = applying.IN_PROCESS_MANAGER,
    ) -> Obj:
        accepted = (patching.JSON_PATCH, patching.MERGE_PATCH) + (
            (patching.STRATEGIC_MERGE_PATCH,) if resource.strategic_merge else ()
        )
        if content_type not in accepted:
            raise errors.unsupported_media_type(accepted)
        old = self._existing(resource, namespace, name)
        try:
            patched = patching.apply_patch(content_type, self._present(resource, old), patch)
        except patching.PatchError as error:
            raise error.error from None
        updates.check_name(updates.metadata_of(patched), name)
        return self._commit_sent(resource, old, patched, subresource, dry_run, True, manager)

    def apply(
        self,
        resource: ResourceType,
        namespace: str,
        name: str,
        body: Any,
        *,
        manager: str,
        force: bool = False,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> tuple[Obj, bool]:
        """Server-side apply of the configuration ``body`` by ``manager``: the object and
        whether it was created."""
        applied = applying.check_applied(resource, body, name)
        metadata = updates.metadata_of(applied)
        self._place(resource, metadata, namespace)
        old = self.store.get(
            resource.group_resource, namespace if resource.namespaced else "", name
        )
        if old is None:
            if subresource is not None:
                raise errors.not_found(resource.group_resource, name)
            made = applying.apply(
                resource,
                None,
                applied,
                manager=manager,
                subresource=None,
                force=force,
                now=self._now(),
            )
            return self.create(resource, namespace, made, dry_run=dry_run, applied=True), True
        updates.check_preconditions(resource, old, metadata)
        merged = applying.apply(
            resource,
            self._present(resource, old),
            applied,
            manager=manager,
            subresource=subresource,
            force=force,
            now=self._now(),
        )
        managed = merged["metadata"].pop("managedFields")
        new = updates.merge(resource, old, merged, subresource)
        new["metadata"]["managedFields"] = managed
        updated = self._commit_update(resource, old, new, dry_run=dry_run, validate=True)
        return updated, False

    def mutate(
        self,
        resource: ResourceType,
        namespace: str,
        name: str,
        change: Callable[[Obj], None],
        *,
        subresource: str | None = None,
        validate: bool = True,
    ) -> Obj:
        """Read, change in place and write back without a conflict check: how in-process
        components (the simulated kubelet, controllers) update what they own. With
        ``validate=False`` the write skips validation, as a privileged writer that also
        binds pods to nodes needs."""
        current = self.get(resource, namespace, name)
        change(current)
        current.setdefault("metadata", {}).pop("resourceVersion", None)
        return self.update(
            resource, namespace, name, current, subresource=subresource, validate=validate
        )

    def delete(
        self,
        resource: ResourceType,
        namespace: str,
        name: str,
        options: DeleteOptions | None = None,
    ) -> Deletion:
        options = options or DeleteOptions()
        old = self._existing(resource, namespace, name)
        deletion.check_preconditions(resource, old, options)
        if options.propagation_policy == "Orphan" and not options.dry_run:
            self.orphaned_owners.add(old["metadata"]["uid"])
        if resource.group_resource == kinds.NAMESPACES.group_resource:
            return self._terminate_namespace(old, options)
        metadata = old["metadata"]
        grace = deletion.grace_period(resource, old, options)
        if grace > 0:
            current_grace = metadata.get("deletionGracePeriodSeconds")
            if (
                metadata.get("deletionTimestamp")
                and current_grace is not None
                and grace >= current_grace
            ):
                return Deletion(self._present(resource, old), removed=False)
            new = copy.deepcopy(old)
            new["metadata"]["deletionTimestamp"] = format_time(
                self.clock.now() + timedelta(seconds=grace)
            )
            new["metadata"]["deletionGracePeriodSeconds"] = grace
            if options.dry_run:
                return Deletion(self._present(resource, new), removed=False)
            stored = self._put(resource, new)
            self.kubelet.pod_terminating(stored, grace)
            return Deletion(self._present(resource, stored), removed=False)
        if metadata.get("finalizers"):
            if (
                metadata.get("deletionTimestamp")
                and metadata.get("deletionGracePeriodSeconds") == 0
            ):
                return Deletion(self._present(resource, old), removed=False)
            new = copy.deepcopy(old)
            new["metadata"]["deletionTimestamp"] = format_time(self.clock.now())
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            if options.dry_run:
                return Deletion(self._present(resource, new), removed=False)
            return Deletion(self._present(resource, self._put(resource, new)), removed=False)
        if options.dry_run:
            return Deletion(self._present(resource, old), removed=True)
        return Deletion(self._present(resource, self._remove(resource, old)), removed=True)

    def complete_pod_termination(self, namespace: str, name: str) -> None:
        """The kubelet's confirmation that a terminating pod's containers are gone: its
        final zero-grace delete. The pod disappears now, or once its finalizers clear."""
        pod = self.store.get(kinds.PODS.group_resource, namespace, name)
        if pod is None or not pod["metadata"].get("deletionTimestamp"):
            return
        self.delete(
            kinds.PODS,
            namespace,
            name,
            DeleteOptions(grace_period_seconds=0, precondition_uid=pod["metadata"]["uid"]),
        )

    def seed(self, body: Obj) -> Obj:
        """Insert or replace an object directly, as a fixture: server fields are filled in
        when missing, status is kept as given, and nothing is validated."""
        resource = self.catalog.for_kind(body.get("apiVersion", ""), body.get("kind", ""))
        if resource is None:
            raise ValueError(f"no served kind {body.get('apiVersion')}/{body.get('kind')}")
        obj = copy.deepcopy(body)
        metadata = updates.metadata_of(obj)
        if resource.namespaced:
            metadata.setdefault("namespace", "default")
        else:
            metadata.pop("namespace", None)
        metadata.setdefault("uid", str(uuid.uuid4()))
        metadata.setdefault("creationTimestamp", format_time(self.clock.now()))
        metadata.setdefault("generation", 1)
        if resource.normalize is not None:
            resource.normalize(obj)
        return self._present(resource, self._put(resource, obj))

    # Internals.

    def _put(self, resource: ResourceType, obj: Obj) -> Obj:
        """Store under the storage version's apiVersion, whichever version was written."""
        storage = self.catalog.storage_type(resource.group_resource) or resource
        obj["apiVersion"] = storage.api_version
        return self.store.put(resource.group_resource, obj)

    def _present(self, resource: ResourceType, obj: Obj) -> Obj:
        """The object as the requested version serves it (the store keeps one copy for all
        versions, as a CRD without conversion does)."""
        obj["apiVersion"], obj["kind"] = resource.api_version, resource.kind
        return obj

    def _place(self, resource: ResourceType, metadata: Obj, namespace: str) -> None:
        if resource.namespaced:
            if metadata.get("namespace") and metadata["namespace"] != namespace:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent "
                    "on the request"
                )
            metadata["namespace"] = namespace
        else:
            metadata.pop("namespace", None)

    def _existing(self, resource: ResourceType, namespace: str, name: str) -> Obj:
        old = self.store.get(
            resource.group_resource, namespace if resource.namespaced else "", name
        )
        if old is None:
            raise errors.not_found(resource.group_resource, name)
        return old

    def _check_namespace_open(self, resource: ResourceType, namespace: str, name: str) -> None:
        found = self.store.get(kinds.NAMESPACES.group_resource, "", namespace)
        if found is None:
            raise errors.not_found(kinds.NAMESPACES.group_resource, namespace)
        if found["metadata"].get("deletionTimestamp"):
            raise errors.forbidden(
                resource.group_resource,
                name,
                f"unable to create new content in namespace {namespace} because it is being "
                "terminated",
            )

    def _now(self) -> str:
        return format_time(self.clock.now())

    def _commit_sent(
        self,
        resource: ResourceType,
        old: Obj,
        sent_obj: Obj,
        subresource: str | None,
        dry_run: bool,
        validate: bool,
        manager: str,
    ) -> Obj:
        """An Update's or a Patch's object (named as the request): its preconditions
        checked against ``old``, merged over it, stored with ``manager`` credited for it."""
        metadata = updates.metadata_of(sent_obj)
        updates.check_preconditions(resource, old, metadata)
        sent = applying.sent_entries(metadata.get("managedFields"))
        new = updates.merge(resource, old, sent_obj, subresource)
        ownership = _Updated(manager, subresource, sent)
        return self._commit_update(
            resource, old, new, dry_run=dry_run, validate=validate, ownership=ownership
        )

    def _commit_update(
        self,
        resource: ResourceType,
        old: Obj,
        new: Obj,
        *,
        dry_run: bool,
        validate: bool,
        ownership: _Updated | None = None,
    ) -> Obj:
        """Store ``new`` over ``old``; ``ownership`` credits an Update's manager (None: the
        caller, an apply, has set the managedFields)."""
        if resource.normalize is not None:
            resource.normalize(new)
        if ownership is not None:
            start = (
                old["metadata"].get("managedFields") if ownership.sent is None else ownership.sent
            )
            new["metadata"]["managedFields"] = applying.record_update(
                resource,
                old,
                new,
                manager=ownership.manager,
                subresource=ownership.subresource,
                now=self._now(),
                managed=start,
            )
        updates.tidy_metadata(new)
        old_metadata, metadata = old["metadata"], new["metadata"]
        if old_metadata.get("deletionTimestamp"):
            added = [
                f
                for f in metadata.get("finalizers") or []
                if f not in (old_metadata.get("finalizers") or [])
            ]
            if added:
                self._raise_invalid(
                    resource,
                    new,
                    [
                        errors.FieldError.forbidden(
                            "metadata.finalizers",
                            "no new finalizers can be added if the object is being deleted, "
                            "found new finalizers []string{"
                            + ", ".join(f'"{f}"' for f in added)
                            + "}",
                        )
                    ],
                )
        if updates.spec_of(resource, new) != updates.spec_of(resource, old):
            metadata["generation"] = old_metadata.get("generation", 1) + 1
        if validate:
            self._validate(resource, new, old)
        if updates.comparable(new) == updates.comparable(old):
            return self._present(resource, old)
        if dry_run:
            return self._present(resource, new)
        if (
            old_metadata.get("deletionTimestamp")
            and not metadata.get("finalizers")
            and old_metadata.get("deletionGracePeriodSeconds") == 0
        ):
            return self._present(resource, self._remove(resource, old))
        return self._present(resource, self._put(resource, new))

    def _validate(self, resource: ResourceType, obj: Obj, old: Obj | None) -> None:
        found = validation.validate_metadata(
            obj, dns_label_name=resource.group_resource == kinds.NAMESPACES.group_resource
        )
        if resource.validate is not None:
            found += resource.validate(obj, old)
        if found:
            self._raise_invalid(resource, obj, found)

    def _raise_invalid(
        self, resource: ResourceType, obj: Obj, found: list[errors.FieldError]
    ) -> None:
        raise errors.invalid(resource.kind, resource.group, obj["metadata"].get("name", ""), found)

    def _remove(self, resource: ResourceType, obj: Obj) -> Obj:
        metadata = obj["metadata"]
        self.kubelet.pod_gone((metadata.get("namespace", ""), metadata["name"]))
        return self.store.remove(
            resource.group_resource, metadata.get("namespace", ""), metadata["name"]
        )

    def _kubelet_confirms(self, key: deletion.PodKey, uid: str) -> None:
        pod = self.store.get(kinds.PODS.group_resource, *key)
        if pod is not None and pod["metadata"]["uid"] == uid:
            self.complete_pod_termination(*key)

    def _terminate_namespace(self, old: Obj, options: DeleteOptions) -> Deletion:
        """Mark the namespace Terminating; the namespace controller empties and removes it."""
        if old["metadata"].get("deletionTimestamp") or options.dry_run:
            return Deletion(self._present(kinds.NAMESPACES, old), removed=False)
        new = copy.deepcopy(old)
        new["metadata"]["deletionTimestamp"] = format_time(self.clock.now())
        new["metadata"]["deletionGracePeriodSeconds"] = 0
        new.setdefault("status", {})["phase"] = "Terminating"
        stored = self.store.put(kinds.NAMESPACES.group_resource, new)
        return Deletion(self._present(kinds.NAMESPACES, stored), removed=False)
