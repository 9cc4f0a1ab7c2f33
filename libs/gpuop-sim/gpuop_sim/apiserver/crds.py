"""Serving custom resources: the CRD controller of the simulated API server.

Observes CustomResourceDefinition writes. A new or changed CRD registers one
:class:`~gpuop_sim.apiserver.resources.ResourceType` per served version (namespaced or
cluster-scoped, with a ``status`` subresource when declared), whose normaliser prunes and
defaults and whose validator checks the version's ``openAPIV3Schema``; discovery picks the
types up from the catalog. The controller then marks the CRD ``NamesAccepted`` and
``Established``, as clients wait for. Deleting a CRD deletes its custom objects first,
then drops the ``customresourcecleanup`` finalizer; once the CRD is gone its resource is
no longer served and its watches end.

:func:`network_attachment_definitions` is the CRD Multus installs in a real cluster
(``k8s.cni.cncf.io/v1`` NetworkAttachmentDefinition), for the tests and simulated clusters
that serve network-manager's attachments.
"""

from __future__ import annotations

from typing import Any

from gpuop_sim.apiserver import kinds, schemas
from gpuop_sim.apiserver.errors import FieldError
from gpuop_sim.apiserver.registry import Registry
from gpuop_sim.apiserver.resources import GroupResource, ResourceType
from gpuop_sim.apiserver.store import Change
from gpuop_sim.apiserver.timestamps import format_time

Obj = dict[str, Any]


def _drop_status(obj: Obj) -> None:
    obj.pop("status", None)


def resource_types(crd: Obj) -> list[tuple[ResourceType, bool]]:
    """The served versions of a CRD, each with whether it is the storage version."""
    spec = crd["spec"]
    names = spec["names"]
    served: list[tuple[ResourceType, bool]] = []
    for version in spec.get("versions") or []:
        if not version.get("served", True):
            continue
        schema: schemas.Schema = (version.get("schema") or {}).get("openAPIV3Schema") or {}
        has_status = "status" in (version.get("subresources") or {})

        def normalize(obj: Obj, schema: schemas.Schema = schema) -> None:
            schemas.prune_and_default(obj, schema)

        def validate(
            new: Obj, old: Obj | None, schema: schemas.Schema = schema
        ) -> list[FieldError]:
            return schemas.validate_object(new, schema)

        resource = ResourceType(
            group=spec["group"],
            version=version["name"],
            kind=names["kind"],
            plural=names["plural"],
            singular=names.get("singular") or names["kind"].lower(),
            namespaced=spec.get("scope") == "Namespaced",
            short_names=tuple(names.get("shortNames") or ()),
            categories=tuple(names.get("categories") or ()),
            subresources=frozenset({"status"} if has_status else set()),
            strategic_merge=False,
            # With a status subresource, a create cannot set status.
            prepare_create=_drop_status if has_status else None,
            normalize=normalize,
            validate=validate,
            description=str(schema.get("description") or ""),
            schema=schema,
        )
        served.append((resource, bool(version.get("storage"))))
    return served


def _group_resource(crd: Obj) -> GroupResource:
    return GroupResource(crd["spec"]["group"], crd["spec"]["names"]["plural"])


class CrdController:
    """Registers, establishes and cleans up custom resources as their CRDs change."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        registry.store.observe(self._on_change)

    def _on_change(self, change: Change) -> None:
        crd_resource = kinds.CUSTOMRESOURCEDEFINITIONS.group_resource
        if change.resource == crd_resource:
            crd = change.object
            if change.type == "DELETED":
                self.registry.catalog.unregister(_group_resource(crd))
                self.registry.store.close_watchers(_group_resource(crd))
            elif crd["metadata"].get("deletionTimestamp"):
                self._clean_up(crd)
            else:
                self._serve(crd)
                self._establish(crd)
            return
        if change.type == "DELETED":
            for crd in self.registry.store.view(crd_resource):
                if _group_resource(crd) == change.resource and crd["metadata"].get(
                    "deletionTimestamp"
                ):
                    self._clean_up(crd)

    def _serve(self, crd: Obj) -> None:
        self.registry.catalog.unregister(_group_resource(crd))
        for resource, storage in resource_types(crd):
            self.registry.catalog.register(resource, storage=storage)

    def _establish(self, crd: Obj) -> None:
        spec = crd["spec"]
        names = dict(spec["names"])
        names.setdefault("singular", names["kind"].lower())
        names.setdefault("listKind", f"{names['kind']}List")
        old = crd.get("status") or {}
        stored = list(old.get("storedVersions") or [])
        for version in spec.get("versions") or []:
            if version.get("storage") and version["name"] not in stored:
                stored.append(version["name"])
        previous = {c.get("type"): c for c in old.get("conditions") or []}
        now = format_time(self.registry.clock.now())

        def condition(kind: str, reason: str, message: str) -> Obj:
            since = previous.get(kind, {})
            return {
                "type": kind,
                "status": "True",
                "lastTransitionTime": since.get("lastTransitionTime", now)
                if since.get("status") == "True"
                else now,
                "reason": reason,
                "message": message,
            }

        status = {
            "conditions": [
                condition("NamesAccepted", "NoConflicts", "no conflicts found"),
                condition(
                    "Established", "InitialNamesAccepted", "the initial names have been accepted"
                ),
            ],
            "acceptedNames": names,
            "storedVersions": stored,
        }
        if status == old:
            return

        def write(obj: Obj) -> None:
            obj["status"] = status

        self.registry.mutate(
            kinds.CUSTOMRESOURCEDEFINITIONS,
            "",
            crd["metadata"]["name"],
            write,
            subresource="status",
            validate=False,
        )

    def _clean_up(self, crd: Obj) -> None:
        """Delete every custom object, then release the CRD once none is left."""
        resource = self.registry.catalog.storage_type(_group_resource(crd))
        if resource is not None:
            for obj in list(self.registry.store.view(resource.group_resource)):
                if not obj["metadata"].get("deletionTimestamp"):
                    self.registry.delete(
                        resource, obj["metadata"].get("namespace", ""), obj["metadata"]["name"]
                    )
        if self.registry.store.view(_group_resource(crd)):
            return
        finalizers = crd["metadata"].get("finalizers") or []
        if schemas.CLEANUP_FINALIZER not in finalizers:
            return

        def release(obj: Obj) -> None:
            obj["metadata"]["finalizers"] = [
                f for f in obj["metadata"].get("finalizers") or [] if f != schemas.CLEANUP_FINALIZER
            ]

        self.registry.mutate(
            kinds.CUSTOMRESOURCEDEFINITIONS, "", crd["metadata"]["name"], release, validate=False
        )


def network_attachment_definitions() -> Obj:
    """Multus' NetworkAttachmentDefinition CRD, as its deployment manifests install it."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "network-attachment-definitions.k8s.cni.cncf.io"},
        "spec": {
            "group": "k8s.cni.cncf.io",
            "scope": "Namespaced",
            "names": {
                "plural": "network-attachment-definitions",
                "singular": "network-attachment-definition",
                "kind": "NetworkAttachmentDefinition",
                "shortNames": ["net-attach-def"],
            },
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "description": (
                                "NetworkAttachmentDefinition is a CRD schema specified by the "
                                "Network Plumbing Working Group to express the intent for "
                                "attaching pods to one or more logical or physical networks."
                            ),
                            "type": "object",
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": {
                                    "description": "The desired state of a network attachment.",
                                    "type": "object",
                                    "properties": {
                                        "config": {
                                            "description": "A JSON-formatted CNI configuration.",
                                            "type": "string",
                                        }
                                    },
                                },
                            },
                        }
                    },
                }
            ],
        },
    }
