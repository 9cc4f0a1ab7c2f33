"""The resource types the simulated API server serves, and the catalog that holds them.

A :class:`ResourceType` is one served ``group/version/plural`` plus the per-kind rules a
real API server keeps in its registry strategies (what create resets, how incoming objects
are normalised and validated). Built-in types live in ``kinds.py``; ``crds.py`` registers
and removes types as CustomResourceDefinitions come and go. The HTTP layer resolves URLs
through :class:`Catalog`, discovery lists it, and the store keys objects by
:class:`GroupResource` so that every served version of a resource shares one storage.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from gpuop_sim.apiserver.errors import FieldError

Obj = dict[str, Any]

Normalizer = Callable[[Obj], None]
"""Mutates an incoming object in place: defaults, pruning, canonical timestamps."""

Validator = Callable[[Obj, Obj | None], "list[FieldError]"]
"""Checks a new object (and the old one on update); returns the field errors."""


class GroupResource(NamedTuple):
    """A resource independent of version: the key objects are stored under."""

    group: str
    resource: str


@dataclass(frozen=True, eq=False)
class ResourceType:
    """One served resource: its names, scope, subresources and registry rules."""

    group: str
    version: str
    kind: str
    plural: str
    singular: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: frozenset[str] = frozenset()
    strategic_merge: bool = True
    """Built-in types accept strategic merge patches; custom resources answer 415."""
    return_deleted_object: bool = False
    """Pods answer a DELETE with the object; most other types with a ``Status``."""
    prepare_create: Normalizer | None = None
    normalize: Normalizer | None = None
    validate: Validator | None = None
    field_labels: tuple[str, ...] = ()
    """Field selector labels beyond ``metadata.name`` and ``metadata.namespace``."""
    verbs: tuple[str, ...] = field(
        default=("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
    )
    description: str = ""
    """What the kind is, as its OpenAPI schema (and ``kubectl explain``) says."""
    schema: Obj | None = None
    """A custom resource's ``openAPIV3Schema``; None for built-in kinds, which the OpenAPI
    documents describe only by their type and object metadata (``openapi.py``)."""
    virtual: bool = False
    """Answered by a handler of its own and never stored, as the access reviews are."""

    @property
    def group_resource(self) -> GroupResource:
        return GroupResource(self.group, self.plural)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def has_status(self) -> bool:
        """Whether ``status`` is a subresource, so main-resource writes leave it alone."""
        return "status" in self.subresources


_VERSION = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")


def version_priority(version: str) -> tuple[int, int, int, str]:
    """Sort key giving Kubernetes' version order: v2 > v1 > v1beta2 > v1beta1 > v1alpha1."""
    match = _VERSION.match(version)
    if match is None:
        return (3, 0, 0, version)
    major, stage, minor = match.groups()
    stage_rank = {None: 0, "beta": 1, "alpha": 2}[stage]
    return (stage_rank, -int(major), -int(minor or 0), version)


class Catalog:
    """Every served resource type, looked up by URL, by kind, or by storage key."""

    def __init__(self) -> None:
        self._served: dict[tuple[str, str, str], ResourceType] = {}
        self._storage: dict[GroupResource, ResourceType] = {}

    def register(self, resource: ResourceType, *, storage: bool = True) -> None:
        """Serve ``resource``; the storage version is the one objects are returned as
        when the server itself reports them (controllers, seeding)."""
        self._served[(resource.group, resource.version, resource.plural)] = resource
        if storage or resource.group_resource not in self._storage:
            self._storage[resource.group_resource] = resource

    def unregister(self, resource: GroupResource) -> None:
        """Stop serving every version of ``resource``."""
        for key in [k for k in self._served if (k[0], k[2]) == resource]:
            del self._served[key]
        self._storage.pop(resource, None)

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._served.get((group, version, plural))

    def storage_type(self, resource: GroupResource) -> ResourceType | None:
        return self._storage.get(resource)

    def for_kind(self, api_version: str, kind: str) -> ResourceType | None:
        group, _, version = api_version.rpartition("/")
        for served in self._served.values():
            if (served.group, served.version, served.kind) == (group, version, kind):
                return served
        return None

    def storage_types(self) -> list[ResourceType]:
        return list(self._storage.values())

    def groups(self) -> dict[str, list[str]]:
        """Group name to its served versions, preferred version first."""
        versions: dict[str, set[str]] = {}
        for group, version, _ in self._served:
            versions.setdefault(group, set()).add(version)
        return {group: sorted(found, key=version_priority) for group, found in versions.items()}

    def in_group_version(self, group: str, version: str) -> list[ResourceType]:
        return [served for (g, v, _), served in self._served.items() if (g, v) == (group, version)]
