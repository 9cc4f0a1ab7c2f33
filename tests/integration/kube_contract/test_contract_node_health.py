"""What the GPU health signals rely on, on both servers: a Node's status subresource merges
`conditions` by `type` under a strategic merge patch and replaces them whole under a merge
patch; a stale resourceVersion in a status patch is 409; `spec.taints` is atomic (a patch
replaces it whole) and refuses a duplicate key and effect; and gpuop's own
`gpuop.kube.conditions` keeps every other condition and taint, on a real control plane
whose node lifecycle controller writes the same node meanwhile."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from gpuop.kube import conditions, errors, nodes
from gpuop.kube.client import Kube
from tests.integration.kube_contract.conftest import Api, config_map, configmaps

Obj = dict[str, Any]
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
TAINT = conditions.GPU_UNHEALTHY_TAINT
OTHER = {"key": "example.com/other", "value": "kept", "effect": "PreferNoSchedule"}


async def _node(api: Api, taints: list[Obj] | None = None) -> str:
    """A Node named after the test, Ready with a fresh heartbeat (so the node lifecycle
    controller of the real control plane leaves it Ready for the test's few seconds)."""
    name = f"{api.namespace}-node"
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    ready = {
        "type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ready",
        "lastHeartbeatTime": now, "lastTransitionTime": now,
    }  # fmt: skip
    node: Obj = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "spec": {"taints": taints} if taints else {},
        "status": {"conditions": [ready]},
    }
    await api.seed(node)
    return name


def _types(node: Obj) -> list[str]:
    return [c["type"] for c in node["status"].get("conditions") or []]


def _ours(node: Obj) -> list[Obj]:
    """The taints of the test's making: not the node lifecycle controller's."""
    taints = (node.get("spec") or {}).get("taints") or []
    return [t for t in taints if not t["key"].startswith("node.kubernetes.io/")]


async def test_a_strategic_status_patch_merges_conditions_by_type(api: Api) -> None:
    name = await _node(api)
    condition = {"type": "GPUHealthy", "status": "False", "reason": "GPUUnhealthy"}
    path = f"/api/v1/nodes/{name}/status"

    code, merged = await api.request("PATCH", path, {"status": {"conditions": [condition]}},
                                     content_type=STRATEGIC)  # fmt: skip
    changed = {**condition, "status": "True", "reason": "GPUsHealthy"}
    code2, again = await api.request("PATCH", path, {"status": {"conditions": [changed]}},
                                     content_type=STRATEGIC)  # fmt: skip

    assert (code, code2) == (200, 200), (merged, again)
    assert _types(merged) == ["GPUHealthy", "Ready"]  # a new item comes first
    assert _types(again) == ["GPUHealthy", "Ready"]
    assert conditions.condition_of(again, "GPUHealthy")["status"] == "True"  # type: ignore[index]
    await api.request("DELETE", f"/api/v1/nodes/{name}")


async def test_a_strategic_merge_orders_the_list_as_the_server_does(api: Api) -> None:
    """Items the patch names in its order, new ones as early as they can, stored ones in
    their stored order (apimachinery's normalizeElementOrder)."""
    name = await _node(api)
    path = f"/api/v1/nodes/{name}/status"
    stored = [{"type": t, "status": "True"} for t in ("A", "B", "D")]
    await api.request("PATCH", path, {"status": {"conditions": stored}}, content_type=STRATEGIC)
    first = [{"type": "A", "$patch": "delete"}, {"type": "C", "status": "True"},
             {"type": "D", "status": "False"}]  # fmt: skip
    second = [{"type": "B", "status": "False"}, {"type": "E", "status": "True"}]

    _, once = await api.request("PATCH", path, {"status": {"conditions": first}},
                                content_type=STRATEGIC)  # fmt: skip
    _, twice = await api.request("PATCH", path, {"status": {"conditions": second}},
                                 content_type=STRATEGIC)  # fmt: skip

    assert _types(once) == ["C", "B", "D", "Ready"]
    assert _types(twice) == ["C", "B", "E", "D", "Ready"]
    await api.request("DELETE", f"/api/v1/nodes/{name}")


async def test_a_strategic_merge_puts_a_new_finalizer_first(api: Api) -> None:
    made = config_map()
    made["metadata"]["finalizers"] = ["example.com/a"]
    await api.request("POST", configmaps(api), made)

    _, patched = await api.request(
        "PATCH", configmaps(api) + "/cm", {"metadata": {"finalizers": ["example.com/b"]}},
        content_type=STRATEGIC,
    )  # fmt: skip
    await api.request("PATCH", configmaps(api) + "/cm", {"metadata": {"finalizers": None}},
                      content_type=MERGE)  # fmt: skip

    assert patched["metadata"]["finalizers"] == ["example.com/b", "example.com/a"]


async def test_a_merge_status_patch_replaces_the_conditions_whole(api: Api) -> None:
    name = await _node(api)
    condition = {"type": "GPUHealthy", "status": "False", "reason": "GPUUnhealthy"}

    code, replaced = await api.request(
        "PATCH", f"/api/v1/nodes/{name}/status", {"status": {"conditions": [condition]}},
        content_type=MERGE,
    )  # fmt: skip

    assert code == 200, replaced
    assert _types(replaced) == ["GPUHealthy"]
    await api.request("DELETE", f"/api/v1/nodes/{name}")


async def test_a_status_patch_with_a_stale_resource_version_is_409(api: Api) -> None:
    name = await _node(api)
    _, read = await api.request("GET", f"/api/v1/nodes/{name}")
    stale = read["metadata"]["resourceVersion"]
    await api.request("PATCH", f"/api/v1/nodes/{name}", {"metadata": {"labels": {"a": "b"}}},
                      content_type=STRATEGIC)  # fmt: skip
    body = {
        "metadata": {"resourceVersion": stale},
        "status": {"conditions": [{"type": "GPUHealthy", "status": "True"}]},
    }

    refused, answer = await api.request(
        "PATCH", f"/api/v1/nodes/{name}/status", body, content_type=STRATEGIC
    )

    assert (refused, answer["reason"]) == (409, "Conflict")
    await api.request("DELETE", f"/api/v1/nodes/{name}")


async def test_taints_are_an_atomic_list_and_a_duplicate_is_422(api: Api) -> None:
    name = await _node(api, taints=[OTHER])
    path = f"/api/v1/nodes/{name}"
    ours = {"key": TAINT, "effect": "NoSchedule"}

    code, patched = await api.request("PATCH", path, {"spec": {"taints": [ours]}},
                                      content_type=STRATEGIC)  # fmt: skip
    refused, answer = await api.request("PATCH", path, {"spec": {"taints": [ours, ours]}},
                                        content_type=STRATEGIC)  # fmt: skip

    assert code == 200, patched
    assert _ours(patched) == [ours]  # OTHER went: the list is replaced whole
    assert (refused, answer["reason"]) == (422, "Invalid")
    assert "taints must be unique by key and effect pair" in answer["message"]
    assert answer["details"]["causes"][0]["field"] == "metadata.taints[1]"  # sic
    await api.request("DELETE", path)


async def test_a_taint_value_that_is_no_label_value_is_422_under_metadata(api: Api) -> None:
    name = await _node(api)
    bad = {"key": TAINT, "value": "has space", "effect": "NoSchedule"}

    refused, answer = await api.request(
        "PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": [bad]}}, content_type=STRATEGIC
    )

    assert (refused, answer["reason"]) == (422, "Invalid")
    assert answer["details"]["causes"][0]["field"] == "metadata.taints[0].value"
    await api.request("DELETE", f"/api/v1/nodes/{name}")


async def test_a_condition_without_times_reads_back_with_null_times(api: Api) -> None:
    name = await _node(api)
    bare = {"type": "GPUHealthy", "status": "True"}

    _, patched = await api.request(
        "PATCH", f"/api/v1/nodes/{name}/status", {"status": {"conditions": [bare]}},
        content_type=STRATEGIC,
    )  # fmt: skip

    condition = conditions.condition_of(patched, "GPUHealthy")
    assert condition is not None
    assert (condition["lastHeartbeatTime"], condition["lastTransitionTime"]) == (None, None)
    await api.request("DELETE", f"/api/v1/nodes/{name}")


async def test_gpuops_condition_and_taint_keep_everyone_elses(api: Api) -> None:
    name = await _node(api, taints=[OTHER])
    kube = Kube(api.client)

    status, reason, message = conditions.gpu_healthy_condition({"GPU-1": (48,)})
    await conditions.set_node_condition(kube, name, "GPUHealthy", status, reason, message)
    await conditions.add_taint(kube, name, TAINT, "", "NoSchedule")
    await conditions.add_taint(kube, name, TAINT, "", "NoSchedule")
    sick = await nodes.get(kube, name)
    await conditions.set_node_condition(kube, name, "GPUHealthy", True, "GPUsHealthy", "ok")
    await conditions.remove_taint(kube, name, TAINT)
    well = await nodes.get(kube, name)

    assert _types(sick) == ["GPUHealthy", "Ready"]
    assert conditions.condition_of(sick, "GPUHealthy")["message"] == (  # type: ignore[index]
        "1 GPU unhealthy: GPU-1 (XID 48)"
    )
    assert _ours(sick) == [OTHER, {"key": TAINT, "effect": "NoSchedule"}]
    assert conditions.condition_of(well, "GPUHealthy")["status"] == "True"  # type: ignore[index]
    assert _ours(well) == [OTHER]
    await api.request("DELETE", f"/api/v1/nodes/{name}")


async def test_gpuops_writes_to_a_missing_node_are_not_found(api: Api) -> None:
    kube = Kube(api.client)
    name = f"{api.namespace}-absent"

    with pytest.raises(errors.NotFound, match=f"node {name}: the node does not exist"):
        await conditions.set_node_condition(kube, name, "GPUHealthy", True, "GPUsHealthy", "")
    with pytest.raises(errors.NotFound, match=f"node {name}: the node does not exist"):
        await conditions.add_taint(kube, name, TAINT, "", "NoSchedule")
