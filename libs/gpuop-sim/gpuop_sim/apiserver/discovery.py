"""Discovery documents and the server version, built from the catalog on every request.

Serves ``/api`` (APIVersions), ``/apis`` (APIGroupList), ``/apis/{group}`` (APIGroup),
``/api/v1`` and ``/apis/{group}/{version}`` (APIResourceList, with ``pods/status``-style
subresource entries) and ``/version``. Because the documents are computed from the
catalog, a CRD's resources appear as soon as the CRD controller registers them. Called by
the HTTP handlers; clients such as the dynamic client and kubectl read these first.
"""

from __future__ import annotations

from typing import Any

from gpuop_sim.apiserver.resources import Catalog, ResourceType

Obj = dict[str, Any]

KUBERNETES_VERSION = "v1.37.2"
"""The Kubernetes release the simulated server answers as: ``/version``, the OpenAPI
documents and the simulated kubelets' ``nodeInfo.kubeletVersion`` all read it from here."""

_MAJOR, _MINOR, _ = KUBERNETES_VERSION.removeprefix("v").split(".")
_VERSION_INFO = {
    # The shape of apimachinery's version.Info as kube-apiserver 1.37 fills it in. kubectl
    # parses only gitVersion (for its skew warning) and major/minor; gitCommit, a 40-digit
    # hash on a real server, says which server this is.
    "major": _MAJOR,
    "minor": _MINOR,
    "emulationMajor": _MAJOR,
    "emulationMinor": _MINOR,
    "minCompatibilityMajor": _MAJOR,
    "minCompatibilityMinor": str(int(_MINOR) - 1),
    "gitVersion": KUBERNETES_VERSION,
    "gitCommit": "gpuop-sim",
    "gitTreeState": "clean",
    "buildDate": "2026-10-27T12:01:04Z",
    "goVersion": "go1.26.10",
    "compiler": "gc",
    "platform": "linux/amd64",
}

_SUBRESOURCES: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    # subresource: (group, version, kind, verbs); empty group/version means the parent's.
    "status": ("", "", "", ("get", "patch", "update")),
    "eviction": ("policy", "v1", "Eviction", ("create",)),
}


def version() -> Obj:
    return dict(_VERSION_INFO)


def core_versions(server_address: str) -> Obj:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ],
    }


def _group(name: str, versions: list[str]) -> Obj:
    listed = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": listed, "preferredVersion": listed[0]}


def group_list(catalog: Catalog) -> Obj:
    groups = [_group(name, versions) for name, versions in catalog.groups().items() if name]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def group(catalog: Catalog, name: str) -> Obj | None:
    versions = catalog.groups().get(name)
    if not name or not versions:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(name, versions)}


def _entries(resource: ResourceType) -> list[Obj]:
    entry: Obj = {
        "name": resource.plural,
        "singularName": resource.singular,
        "namespaced": resource.namespaced,
        "kind": resource.kind,
        "verbs": list(resource.verbs),
    }
    if resource.short_names:
        entry["shortNames"] = list(resource.short_names)
    if resource.categories:
        entry["categories"] = list(resource.categories)
    entries = [entry]
    for subresource in sorted(resource.subresources):
        sub_group, sub_version, sub_kind, verbs = _SUBRESOURCES[subresource]
        sub_entry: Obj = {
            "name": f"{resource.plural}/{subresource}",
            "singularName": "",
            "namespaced": resource.namespaced,
            "kind": sub_kind or resource.kind,
            "verbs": list(verbs),
        }
        if sub_group:
            sub_entry["group"], sub_entry["version"] = sub_group, sub_version
        entries.append(sub_entry)
    return entries


def resource_list(catalog: Catalog, group_name: str, version_name: str) -> Obj | None:
    served = catalog.in_group_version(group_name, version_name)
    if not served:
        return None
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group_name}/{version_name}" if group_name else version_name,
        "resources": [entry for resource in served for entry in _entries(resource)],
    }
