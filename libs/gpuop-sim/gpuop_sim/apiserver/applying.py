"""Server-side apply and the field ownership it rests on (``metadata.managedFields``).

The registry calls :func:`record_update` on every create, update and patch to credit the
writing manager with the fields it added or changed (an ``Update`` entry), and
:func:`apply` for an ``application/apply-patch+yaml`` PATCH, which merges the applied
configuration into the live object, refuses (409) to change a field another manager owns
unless forced, removes the fields this manager applied before and omits now, and makes
the manager own exactly what it applied (an ``Apply`` entry).

Ownership is kept as structured-merge-diff keeps it: a set of paths per manager, encoded
as ``FieldsV1`` (``f:<field>``, ``k:{"name":"main"}`` for an item of a keyed list,
``v:<value>`` for a member of a set list, ``.`` for a node that is itself owned).

Lists follow the merge rules the sim knows: for built-in kinds the keyed lists and set
lists of :mod:`patching` (containers by ``name``, container ports by ``containerPort`` and
``protocol``, finalizers as a set...), for custom resources their schema's
``x-kubernetes-list-type`` (``map`` with ``x-kubernetes-list-map-keys``, or ``set``), and
``metadata.finalizers`` (set) and ``metadata.ownerReferences`` (by ``uid``) for every kind.
Every other list is atomic: applied whole and owned as one field.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

from gpuop_sim.apiserver import errors, patching
from gpuop_sim.apiserver.resources import ResourceType

Obj = dict[str, Any]
Path = tuple[str, ...]
"""A field path as its FieldsV1 keys: ``("f:spec", 'k:{"name":"main"}', "f:image")``."""

IN_PROCESS_MANAGER = "gpuop-sim"
"""The manager credited with writes made in process (the simulated kubelet, controllers)."""

_STRIPPED_METADATA = frozenset(
    {
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "managedFields",
        "selfLink",
    }
)
_SET = "set"
_KEYS_OVERRIDE = {"ports": ("containerPort", "protocol")}
_OPERATIONS = ("Apply", "Update")


@dataclass
class _Entry:
    manager: str
    operation: str
    api_version: str
    subresource: str | None
    time: str | None
    fields: set[Path] = field(default_factory=set)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.manager, self.operation, self.subresource or "")

    def printed(self) -> str:
        """The manager as upstream's conflict messages name it."""
        text = json.dumps(self.manager)
        if self.subresource:
            text += f" with subresource {json.dumps(self.subresource)}"
        if self.operation == "Update":
            text += f" using {self.api_version}"
        return text


# Paths.


def _key_element(keys: dict[str, Any]) -> str:
    return "k:" + json.dumps(keys, separators=(",", ":"))


def _list_rule(resource: ResourceType, path: Path) -> str | tuple[str, ...] | None:
    """``"set"``, the merge keys of a keyed list, or None for an atomic list."""
    name = path[-1][2:] if path and path[-1].startswith("f:") else ""
    if path[:1] == ("f:metadata",) and len(path) == 2:
        metadata_rules: dict[str, str | tuple[str, ...]] = {
            "finalizers": _SET,
            "ownerReferences": ("uid",),
        }
        return metadata_rules.get(name)
    if not resource.strategic_merge:
        return _schema_rule(resource.schema, path)
    if name in patching.SET_LISTS:
        return _SET
    if name in _KEYS_OVERRIDE:
        return _KEYS_OVERRIDE[name]
    key = patching.MERGE_KEYS.get(name)
    return (key,) if key else None


def _schema_rule(schema: Obj | None, path: Path) -> str | tuple[str, ...] | None:
    """A custom resource's list rule, from ``x-kubernetes-list-type`` in its schema."""
    node: Any = schema
    for element in path:
        if not isinstance(node, dict):
            return None
        if element.startswith("f:"):
            properties = node.get("properties") or {}
            extra = node.get("additionalProperties")
            node = properties.get(element[2:], extra if isinstance(extra, dict) else None)
        else:
            node = node.get("items")
    if not isinstance(node, dict):
        return None
    kind = node.get("x-kubernetes-list-type")
    if kind == "set":
        return _SET
    keys = node.get("x-kubernetes-list-map-keys")
    if kind == "map" and isinstance(keys, list) and keys:
        return tuple(str(key) for key in keys)
    return None


def _item_element(rule: tuple[str, ...], item: Any) -> str | None:
    if not isinstance(item, dict) or rule[0] not in item:
        return None
    return _key_element({k: item[k] for k in rule if k in item})


@dataclass
class _Shape:
    """An object's paths: leaves with their values, maps, and items of keyed lists."""

    leaves: dict[Path, Any] = field(default_factory=dict)
    maps: set[Path] = field(default_factory=set)
    items: set[Path] = field(default_factory=set)

    def paths(self) -> set[Path]:
        return set(self.leaves) | self.maps | self.items


def _shape(resource: ResourceType, obj: Any) -> _Shape:
    shape = _Shape()
    _walk(resource, obj, (), shape)
    return shape


def _walk(resource: ResourceType, value: Any, path: Path, shape: _Shape) -> None:
    if isinstance(value, dict) and (value or not path):
        if path:
            shape.maps.add(path)
        for key, child in value.items():
            _walk(resource, child, (*path, f"f:{key}"), shape)
        return
    if isinstance(value, list) and value:
        rule = _list_rule(resource, path)
        if rule == _SET and all(not isinstance(item, (dict, list)) for item in value):
            for item in value:
                shape.leaves[(*path, "v:" + json.dumps(item))] = item
            return
        if isinstance(rule, tuple):
            elements = [_item_element(rule, item) for item in value]
            if all(elements):
                for element, item in zip(elements, value, strict=True):
                    item_path = (*path, str(element))
                    shape.items.add(item_path)
                    for key, child in item.items():
                        _walk(resource, child, (*item_path, f"f:{key}"), shape)
                return
    shape.leaves[path] = value


def _ignored(resource: ResourceType, path: Path, subresource: str | None) -> bool:
    """Paths nobody owns: type and identity fields, and what the written part resets."""
    if path[:1] in (("f:apiVersion",), ("f:kind",)) or path == ("f:metadata",):
        return True
    if path[:1] == ("f:metadata",) and path[1][2:] in _STRIPPED_METADATA:
        return True
    if subresource == "status":
        return path[:1] != ("f:status",)
    return resource.has_status and path[:1] == ("f:status",)


def path_text(path: Path) -> str:
    """A path as upstream's messages print it: ``.spec.containers[name="main"].image``."""
    text = ""
    for element in path:
        kind, rest = element[:2], element[2:]
        if kind == "f:":
            text += "." + rest
        elif kind == "k:":
            keys = json.loads(rest)
            text += "[" + ",".join(f"{k}={json.dumps(v)}" for k, v in keys.items()) + "]"
        else:
            text += "[=" + rest + "]"
    return text


# FieldsV1.


def _decode(tree: Obj, prefix: Path, out: set[Path]) -> None:
    for key, child in tree.items():
        if key == ".":
            out.add(prefix)
        elif isinstance(child, dict) and child:
            _decode(child, (*prefix, key), out)
        else:
            out.add((*prefix, key))


def _encode(paths: set[Path]) -> Obj:
    tree: Obj = {}
    for path in paths:
        node = tree
        for element in path:
            node = node.setdefault(element, {})
    for path in paths:
        node = tree
        for element in path:
            node = node[element]
        if node:
            node["."] = {}
    return _sorted(tree)


def _sorted(tree: Obj) -> Obj:
    return {key: _sorted(tree[key]) for key in sorted(tree)}


def valid_entry(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("manager"), str)
        and entry.get("operation") in _OPERATIONS
        and entry.get("fieldsType") == "FieldsV1"
        and isinstance(entry.get("fieldsV1", {}), dict)
    )


def sent_entries(sent: Any) -> list[Obj] | None:
    """The managedFields a non-apply write replaces the stored ones with, as upstream:
    None (keep the stored ones) when absent, empty or invalid; ``[{}]`` clears them."""
    if not isinstance(sent, list) or not sent:
        return None
    if sent == [{}]:
        return []
    return sent if all(valid_entry(entry) for entry in sent) else None


def _entries(managed: Any) -> dict[tuple[str, str, str], _Entry]:
    found: dict[tuple[str, str, str], _Entry] = {}
    for raw in managed if isinstance(managed, list) else []:
        if not valid_entry(raw):
            continue
        entry = _Entry(
            raw["manager"],
            raw["operation"],
            raw.get("apiVersion", ""),
            raw.get("subresource") or None,
            raw.get("time"),
        )
        _decode(raw.get("fieldsV1") or {}, (), entry.fields)
        found.setdefault(entry.key, entry).fields |= entry.fields
    return found


def _managed_fields(entries: dict[tuple[str, str, str], _Entry]) -> list[Obj]:
    """Encoded entries in upstream's order: Apply first, then by time, then by manager."""
    kept = [entry for entry in entries.values() if entry.fields]
    kept.sort(
        key=lambda e: (e.operation, e.time or "", e.manager, e.api_version, e.subresource or "")
    )
    encoded = []
    for entry in kept:
        raw: Obj = {
            "manager": entry.manager,
            "operation": entry.operation,
            "apiVersion": entry.api_version,
        }
        if entry.time:
            raw["time"] = entry.time
        raw["fieldsType"] = "FieldsV1"
        raw["fieldsV1"] = _encode(entry.fields)
        if entry.subresource:
            raw["subresource"] = entry.subresource
        encoded.append(raw)
    return encoded


# Writes.


def _baseline(resource: ResourceType) -> Obj:
    """What a create is compared with: a built-in kind's empty Go struct always has
    ``spec`` and ``status``, so a creator owns their fields but not the maps themselves."""
    return {"spec": {}, "status": {}} if resource.strategic_merge else {}


def record_update(
    resource: ResourceType,
    old: Obj | None,
    new: Obj,
    *,
    manager: str,
    subresource: str | None,
    now: str,
    managed: Any,
) -> list[Obj]:
    """The managedFields after an Update by ``manager`` turned ``old`` (None on create)
    into ``new``, starting from the entries ``managed``: fields that are gone lose their
    owners, and the manager gains what it added or changed."""
    entries = _entries(managed)
    before = _shape(resource, old if old is not None else _baseline(resource))
    after = _shape(resource, new)
    changed = {
        path
        for path, value in after.leaves.items()
        if path not in before.leaves or before.leaves[path] != value
    }
    changed |= (after.maps | after.items) - (before.maps | before.items)
    changed = {path for path in changed if not _ignored(resource, path, subresource)}
    present = after.paths()
    for entry in entries.values():
        entry.fields &= present
    if changed:
        entry = _Entry(manager, "Update", resource.api_version, subresource, now)
        entry = entries.setdefault(entry.key, entry)
        entry.fields |= changed
        entry.api_version, entry.time = resource.api_version, now
    return _managed_fields(entries)


def check_applied(resource: ResourceType, applied: Any, name: str) -> Obj:
    """The applied configuration, refused (400) as upstream refuses it."""
    if not isinstance(applied, dict):
        raise errors.bad_request("the body of the request must be a Kubernetes object")
    metadata = applied.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise errors.bad_request("the body of the request is not a Kubernetes object")
    api_version, kind = applied.get("apiVersion") or "", applied.get("kind") or ""
    if (api_version, kind) != (resource.api_version, resource.kind):
        group, _, version = api_version.rpartition("/")
        raise errors.bad_request(f"invalid object type: {group}/{version}, Kind={kind}")
    metadata = metadata or {}
    if metadata.get("managedFields") is not None:
        raise errors.bad_request("metadata.managedFields must be nil")
    if metadata.get("name") != name:
        raise errors.bad_request(
            f"the name of the object ({metadata.get('name', '')}) does not match the name "
            f"on the URL ({name})"
        )
    return copy.deepcopy(applied)


def apply(
    resource: ResourceType,
    live: Obj | None,
    applied: Obj,
    *,
    manager: str,
    subresource: str | None,
    force: bool,
    now: str,
) -> Obj:
    """The object after ``manager`` applied ``applied`` to ``live`` (None: to be
    created), with its managedFields; 409 on a conflict unless ``force``."""
    applied = _applicable(resource, applied, subresource)
    entries = _entries((live or {}).get("metadata", {}).get("managedFields"))
    mine = _Entry(manager, "Apply", resource.api_version, subresource, None)
    previous = entries[mine.key].fields if mine.key in entries else set()
    base = copy.deepcopy(live) if live is not None else {}
    base.get("metadata", {}).pop("managedFields", None)
    merged = _merge(resource, base, applied, ())
    wanted = _shape(resource, applied)
    owned = {
        path
        for path in set(wanted.leaves) | wanted.items
        if not _ignored(resource, path, subresource)
    }
    before, after = _shape(resource, base), _shape(resource, merged)
    changed = {
        path
        for path in owned
        if path in after.leaves
        and (path not in before.leaves or before.leaves[path] != after.leaves[path])
    }
    conflicts = sorted(
        (path, entry.printed())
        for key, entry in entries.items()
        if key != mine.key
        for path in entry.fields & changed
    )
    if conflicts and not force:
        raise conflict_error(conflicts)
    others = [entry for key, entry in entries.items() if key != mine.key]
    for entry in others:
        entry.fields -= changed
    for path in sorted(previous - owned, key=len):
        if not any(q[: len(path)] == path for entry in others for q in entry.fields):
            _remove(merged, path)
    entry = entries.setdefault(mine.key, mine)
    entry.fields, entry.api_version = owned, resource.api_version
    if live is None or _content(merged) != _content(base):
        entry.time = now
    present = _shape(resource, merged).paths()
    for other in others:
        other.fields &= present
    result: Obj = merged
    result.setdefault("metadata", {})["managedFields"] = _managed_fields(entries)
    return result


def _applicable(resource: ResourceType, applied: Obj, subresource: str | None) -> Obj:
    """What of the applied configuration the written part takes: only ``status`` for the
    status subresource, everything but ``status`` (reset by the strategy) otherwise."""
    applied = {k: v for k, v in applied.items() if v is not None}
    if subresource == "status":
        return {k: v for k, v in applied.items() if k in ("apiVersion", "kind", "status")}
    if resource.has_status:
        applied.pop("status", None)
    return applied


def _content(obj: Obj) -> Obj:
    metadata = {k: v for k, v in obj.get("metadata", {}).items() if k != "managedFields"}
    return {**obj, "metadata": metadata}


def _merge(resource: ResourceType, live: Any, applied: Any, path: Path) -> Any:
    if isinstance(applied, dict) and isinstance(live, dict):
        result = copy.deepcopy(live)
        for key, value in applied.items():
            if value is not None:
                result[key] = _merge(resource, live.get(key), value, (*path, f"f:{key}"))
        return result
    if isinstance(applied, list) and isinstance(live, list):
        rule = _list_rule(resource, path)
        if rule == _SET:
            return copy.deepcopy(live) + [item for item in applied if item not in live]
        if isinstance(rule, tuple):
            items: list[Any] = copy.deepcopy(live)
            for item in applied:
                element = _item_element(rule, item)
                position = _find(items, element) if element else None
                if position is None:
                    items.append(copy.deepcopy(item))
                else:
                    items[position] = _merge(resource, items[position], item, (*path, str(element)))
            return items
    return copy.deepcopy(applied)


def _find(items: list[Any], element: str) -> int | None:
    keys = json.loads(element[2:])
    for position, item in enumerate(items):
        if isinstance(item, dict) and all(item.get(k) == v for k, v in keys.items()):
            return position
    return None


def _remove(obj: Obj, path: Path) -> None:
    """Delete the field, list item or set member at ``path``, if it is there."""
    node: Any = obj
    for element in path[:-1]:
        if element.startswith("f:") and isinstance(node, dict):
            node = node.get(element[2:])
        elif element.startswith("k:") and isinstance(node, list):
            position = _find(node, element)
            node = None if position is None else node[position]
        else:
            return
    last = path[-1]
    if last.startswith("f:") and isinstance(node, dict):
        node.pop(last[2:], None)
    elif last.startswith("k:") and isinstance(node, list):
        position = _find(node, last)
        if position is not None:
            del node[position]
    elif last.startswith("v:") and isinstance(node, list):
        value = json.loads(last[2:])
        node[:] = [item for item in node if item != value]


def conflict_error(conflicts: list[tuple[Path, str]]) -> errors.ApiError:
    """409 with upstream's message (``internal.NewConflictError``) and causes."""
    causes = [
        {"reason": "FieldManagerConflict", "message": f"conflict with {who}", "field": path_text(p)}
        for p, who in conflicts
    ]
    if len(conflicts) == 1:
        path, who = conflicts[0]
        message = f"Apply failed with 1 conflict: conflict with {who}: {path_text(path)}"
    else:
        by_manager: dict[str, list[str]] = {}
        for path, who in conflicts:
            by_manager.setdefault(who, []).append(path_text(path))
        lines = []
        for who in sorted(by_manager):
            lines.append(f"conflicts with {who}:")
            lines.extend(f"- {text}" for text in by_manager[who])
        message = f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(lines)
    return errors.ApiError(409, "Conflict", message, details={"causes": causes})


def manager_required() -> errors.ApiError:
    """422 for an apply without ``fieldManager``, as upstream validates PatchOptions."""
    detail = "Required value: is required for apply patch"
    return errors.ApiError(
        422,
        "Invalid",
        f'PatchOptions.meta.k8s.io "" is invalid: fieldManager: {detail}',
        details={
            "group": "meta.k8s.io",
            "kind": "PatchOptions",
            "causes": [
                {"reason": "FieldValueRequired", "message": detail, "field": "fieldManager"}
            ],
        },
    )
