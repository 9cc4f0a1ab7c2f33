"""JSON patch, JSON merge patch and strategic merge patch, applied to stored objects.

The registry's PATCH path calls :func:`apply_patch` with the request's Content-Type; the
result then goes through the same rules as a PUT (a ``metadata.resourceVersion`` in the
patch is a precondition because it ends up in the patched object).

Strategic merge follows the patch strategies of the built-in types gpuop touches: lists of
containers, env, volumes (by ``name``), conditions and addresses (by ``type``),
ownerReferences (by ``uid``) merge by key; ``finalizers`` merge as a set; every other list
(``NodeSpec.taints``, tolerations, ...) is atomic and replaced whole. The directives
``$patch: replace|delete``, ``$deleteFromPrimitiveList/<field>``,
``$setElementOrder/<field>`` and ``$retainKeys`` are honoured. A merged list comes back in
the order a real server gives it (`_server_order`): an item new to the list comes first,
not last (the contract suite checks it against kube-apiserver).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from gpuop_sim.apiserver import errors

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

# Patch merge keys from the Kubernetes API types (``patchMergeKey`` struct tags).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "imagePullSecrets": "name",
    "resourceClaims": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "conditions": "type",
    "addresses": "type",
    "ownerReferences": "uid",
    "hostAliases": "ip",
    "podIPs": "ip",
    "hostIPs": "ip",
    "topologySpreadConstraints": "topologyKey",
}
# Lists of scalars with ``patchStrategy:"merge"``: union, keeping the original order.
SET_LISTS = frozenset({"finalizers"})


class PatchError(Exception):
    """The patch could not be applied; carries the ApiError to answer with."""

    def __init__(self, error: errors.ApiError) -> None:
        super().__init__(error.message)
        self.error = error


def apply_patch(content_type: str, target: dict[str, Any], patch: Any) -> dict[str, Any]:
    """Apply ``patch`` of the given media type to a copy of ``target``."""
    if content_type == JSON_PATCH:
        if not isinstance(patch, list):
            raise PatchError(
                errors.bad_request(
                    "json: cannot unmarshal object into Go value of type jsonpatch.Patch"
                )
            )
        return apply_json_patch(target, patch)
    if not isinstance(patch, dict):
        raise PatchError(errors.bad_request("patch body must be a JSON object"))
    if content_type == MERGE_PATCH:
        merged = apply_merge_patch(target, patch)
    else:
        merged = strategic_merge(target, patch)
    if not isinstance(merged, dict):
        raise PatchError(errors.bad_request("patch removed the whole object"))
    return merged


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: maps merge recursively, null deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result


# JSON patch (RFC 6902), with the error texts of evanphx/json-patch that kube returns.


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _split_pointer(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise PatchError(errors.unprocessable(f"JSON pointer {pointer!r} must start with '/'"))
    return [_unescape(token) for token in pointer[1:].split("/")]


def _parent(doc: Any, tokens: list[str], op: str, path: str) -> Any:
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            raise PatchError(
                errors.unprocessable(
                    f'{op} operation does not apply: doc is missing path: "{path}": missing value'
                )
            )
    return node


def _get(doc: Any, path: str, op: str) -> Any:
    tokens = _split_pointer(path)
    if not tokens:
        return doc
    parent = _parent(doc, tokens, op, path)
    last = tokens[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise PatchError(
        errors.unprocessable(
            f'{op} operation does not apply: doc is missing path: "{path}": missing value'
        )
    )


def _remove(doc: Any, path: str, op: str) -> Any:
    tokens = _split_pointer(path)
    parent = _parent(doc, tokens, op, path)
    last = tokens[-1]
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent.pop(int(last))
    raise PatchError(
        errors.unprocessable(
            f'{op} operation does not apply: doc is missing path: "{path}": missing value'
        )
    )


def _add(doc: Any, path: str, value: Any, op: str) -> Any:
    tokens = _split_pointer(path)
    if not tokens:
        return value
    parent = _parent(doc, tokens, op, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list) and (
        last == "-" or (last.isdigit() and int(last) <= len(parent))
    ):
        parent.insert(len(parent) if last == "-" else int(last), value)
    else:
        raise PatchError(
            errors.unprocessable(
                f'{op} operation does not apply: doc is missing path: "{path}": missing value'
            )
        )
    return doc


def apply_json_patch(target: dict[str, Any], operations: list[Any]) -> dict[str, Any]:
    doc: Any = copy.deepcopy(target)
    for operation in operations:
        if not isinstance(operation, dict) or "op" not in operation or "path" not in operation:
            raise PatchError(errors.bad_request(f"invalid JSON patch operation: {operation!r}"))
        op, path = operation["op"], operation["path"]
        if op == "add":
            doc = _add(doc, path, copy.deepcopy(operation.get("value")), op)
        elif op == "remove":
            _remove(doc, path, op)
        elif op == "replace":
            _get(doc, path, op)
            tokens = _split_pointer(path)
            if tokens:
                _remove(doc, path, op)
            doc = _add(doc, path, copy.deepcopy(operation.get("value")), op)
        elif op in ("move", "copy"):
            source = operation.get("from", "")
            value = (
                _remove(doc, source, op) if op == "move" else copy.deepcopy(_get(doc, source, op))
            )
            doc = _add(doc, path, value, op)
        elif op == "test":
            if _get(doc, path, op) != operation.get("value"):
                raise PatchError(errors.unprocessable(f"testing value {path} failed: test failed"))
        else:
            raise PatchError(errors.bad_request(f"Unexpected kind: {op}"))
    if not isinstance(doc, dict):
        raise PatchError(errors.bad_request("patch result is not an object"))
    return doc


# Strategic merge patch.

_DELETE = object()


def strategic_merge(original: Any, patch: dict[str, Any]) -> Any:
    """Merge a strategic merge patch map into ``original``; _DELETE removes the map."""
    directive = patch.get("$patch")
    if directive == "delete":
        return _DELETE
    if directive == "replace":
        return strategic_merge({}, {k: v for k, v in patch.items() if k != "$patch"})
    result = copy.deepcopy(original) if isinstance(original, dict) else {}
    retain = patch.get("$retainKeys")
    if isinstance(retain, list):
        result = {key: value for key, value in result.items() if key in retain}
    orders = {
        key.partition("/")[2]: value
        for key, value in patch.items()
        if key.startswith("$setElementOrder/") and isinstance(value, list)
    }
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.partition("/")[2]
            if isinstance(result.get(field), list):
                result[field] = [item for item in result[field] if item not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = strategic_merge(result.get(key), value)
            if merged is _DELETE:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value, orders.get(key))
        else:
            result[key] = value
    for field, order in orders.items():
        if field not in patch and isinstance(result.get(field), list):
            result[field] = _merge_list(field, result[field], [], order)
    return result


def _merge_list(
    field: str, original: Any, patch: list[Any], order: list[Any] | None = None
) -> list[Any]:
    current = original if isinstance(original, list) else []
    if field in SET_LISTS:
        merged = list(current)
        merged.extend(item for item in patch if item not in merged)
        return _server_order(field, merged, current, order or patch)
    merge_key = MERGE_KEYS.get(field)
    if merge_key is None or any(_is_replace(item) for item in patch):
        return [_fresh(item) for item in patch if not _is_replace(item)]
    merged = _merge_by_key(merge_key, current, patch)
    kept = [item for item in patch if not (isinstance(item, dict) and "$patch" in item)]
    return _server_order(field, merged, current, order or kept)


def _merge_by_key(merge_key: str, current: list[Any], patch: list[Any]) -> list[Any]:
    merged = copy.deepcopy(current)
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            merged.append(_fresh(item))
            continue
        position = next(
            (
                i
                for i, existing in enumerate(merged)
                if isinstance(existing, dict) and existing.get(merge_key) == item[merge_key]
            ),
            None,
        )
        if item.get("$patch") == "delete":
            merged = [
                existing
                for existing in merged
                if not (isinstance(existing, dict) and existing.get(merge_key) == item[merge_key])
            ]
        elif position is None:
            merged.append(_fresh(item))
        else:
            merged[position] = strategic_merge(merged[position], item)
    return merged


def _is_replace(item: Any) -> bool:
    return isinstance(item, dict) and item.get("$patch") == "replace" and len(item) == 1


def _fresh(item: Any) -> Any:
    """A new list item, with any directives inside it resolved."""
    if isinstance(item, dict):
        merged = strategic_merge({}, item)
        return {} if merged is _DELETE else merged
    return copy.deepcopy(item)


def _server_order(
    field: str, merged: list[Any], original: list[Any], patch_order: list[Any]
) -> list[Any]:
    """The order the API server gives a merged list (apimachinery's strategicpatch
    `normalizeElementOrder`): the items the patch names (or its `$setElementOrder`) in the
    patch's order, the others in their stored order, interleaved so that two items both
    stored keep their stored order and an item new to the list comes as early as it can.
    So a new condition comes first: `[Ready]` patched with `[GPUHealthy]` is
    `[GPUHealthy, Ready]`, as on a real server."""
    merge_key = MERGE_KEYS.get(field)

    def identity(item: Any) -> str:
        value = item.get(merge_key) if merge_key and isinstance(item, dict) else item
        return json.dumps(value, sort_keys=True)

    named = {identity(item): position for position, item in enumerate(patch_order)}
    stored = {identity(item): position for position, item in enumerate(original)}
    patched = sorted(
        (item for item in merged if identity(item) in named), key=lambda i: named[identity(i)]
    )
    server_only = [item for item in merged if identity(item) not in named]
    result: list[Any] = []
    while patched and server_only:
        left, right = stored.get(identity(server_only[0])), stored.get(identity(patched[0]))
        if left is not None and right is not None and left < right:
            result.append(server_only.pop(0))
        else:
            result.append(patched.pop(0))
    return result + patched + server_only
