"""PATCH types and the main-resource/status split, through the client and raw HTTP."""

from __future__ import annotations

import json

import pytest
from kubernetes.aio import client

from gpuop_sim import ApiServer
from gpuop_sim.apiserver.patching import apply_json_patch, apply_merge_patch, strategic_merge
from tests.integration.sim.support import RawApi, node, pod

NODE = "/api/v1/nodes/node-1"
TAINT_A = {"key": "a", "effect": "NoSchedule"}
TAINT_B = {"key": "b", "value": "1", "effect": "NoExecute"}


async def test_strategic_merge_replaces_node_taints_whole(core: client.CoreV1Api) -> None:
    body = node("node-1")
    body["spec"]["taints"] = [TAINT_A]
    await core.create_node(body)

    patched = await core.patch_node("node-1", {"spec": {"taints": [TAINT_B]}})

    assert [t.key for t in patched.spec.taints] == ["b"]


async def test_strategic_merge_merges_containers_by_name(core: client.CoreV1Api) -> None:
    body = pod("a")
    body["spec"]["containers"].append({"name": "sidecar", "image": "sidecar:1"})
    await core.create_namespaced_pod("default", body)

    patched = await core.patch_namespaced_pod(
        "a", "default", {"spec": {"containers": [{"name": "sidecar", "image": "sidecar:2"}]}}
    )

    assert [(c.name, c.image) for c in patched.spec.containers] == [
        ("main", "registry.example/app:1.0"),
        ("sidecar", "sidecar:2"),
    ]


async def test_strategic_merge_unions_finalizers(core: client.CoreV1Api) -> None:
    body = node("node-1")
    body["metadata"]["finalizers"] = ["example.com/a"]
    await core.create_node(body)

    patched = await core.patch_node("node-1", {"metadata": {"finalizers": ["example.com/b"]}})

    assert patched.metadata.finalizers == ["example.com/b", "example.com/a"]  # the server's order


async def test_strategic_merge_conditions_merge_by_type_on_status(
    core: client.CoreV1Api,
) -> None:
    await core.create_node(node("node-1"))

    patched = await core.patch_node_status(
        "node-1",
        {"status": {"conditions": [{"type": "DiskPressure", "status": "False"}]}},
    )

    assert [(c.type, c.status) for c in patched.status.conditions] == [
        ("DiskPressure", "False"),  # a new item comes first, as on a real server
        ("Ready", "True"),
    ]


async def test_merge_patch_replaces_lists_and_null_deletes(raw: RawApi) -> None:
    body = node("node-1", labels={"keep": "1", "drop": "1"})
    body["spec"]["taints"] = [TAINT_A]
    await raw.request("POST", "/api/v1/nodes", body)

    status, patched, _ = await raw.request(
        "PATCH",
        NODE,
        {"metadata": {"labels": {"drop": None}}, "spec": {"taints": [TAINT_B]}},
        content_type="application/merge-patch+json",
    )

    assert status == 200
    assert patched["metadata"]["labels"] == {"keep": "1"}
    assert patched["spec"]["taints"] == [TAINT_B]


async def test_json_patch_applies_and_failed_test_is_422(
    core: client.CoreV1Api, raw: RawApi
) -> None:
    await core.create_node(node("node-1", labels={"rack": "1"}))

    applied = await core.patch_node(
        "node-1", [{"op": "add", "path": "/metadata/labels/zone", "value": "a"}]
    )
    status, body, _ = await raw.request(
        "PATCH",
        NODE,
        [{"op": "test", "path": "/metadata/labels/zone", "value": "b"}],
        content_type="application/json-patch+json",
    )

    assert applied.metadata.labels == {"rack": "1", "zone": "a"}
    assert (status, body["reason"]) == (422, "Invalid")


async def test_apply_patch_without_field_manager_is_422(
    core: client.CoreV1Api, raw: RawApi
) -> None:
    await core.create_node(node("node-1"))

    status, body, headers = await raw.request(
        "PATCH", NODE, {"spec": {}}, content_type="application/apply-patch+yaml"
    )

    assert (status, body["reason"]) == (422, "Invalid")
    assert headers["Content-Type"] == "application/json"


async def test_main_resource_write_ignores_status(core: client.CoreV1Api) -> None:
    await core.create_node(node("node-1"))

    patched = await core.patch_node(
        "node-1", {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}
    )

    assert patched.status.conditions[0].status == "True"


async def test_status_write_changes_only_status(core: client.CoreV1Api) -> None:
    await core.create_node(node("node-1"))
    current = await core.read_node("node-1")
    current.metadata.labels = {"sneaky": "1"}
    current.spec.unschedulable = True
    current.status.conditions[0].status = "False"

    updated = await core.replace_node_status("node-1", current)

    assert updated.metadata.labels is None
    assert updated.spec.unschedulable is None
    assert updated.status.conditions[0].status == "False"


async def test_new_pod_is_pending_whatever_status_it_was_sent_with(
    core: client.CoreV1Api,
) -> None:
    body = pod("a")
    body["status"] = {"phase": "Running"}

    created = await core.create_namespaced_pod("default", body)

    assert created.status.phase == "Pending"


async def test_cordon_adds_the_unschedulable_taint_and_uncordon_removes_it(
    server: ApiServer, core: client.CoreV1Api
) -> None:
    await core.create_node(node("node-1"))

    cordoned = await core.patch_node("node-1", {"spec": {"unschedulable": True}})
    after_cordon = await core.read_node("node-1")
    await core.patch_node("node-1", {"spec": {"unschedulable": False}})
    after_uncordon = await core.read_node("node-1")

    assert cordoned.spec.taints is None
    assert [(t.key, t.effect) for t in after_cordon.spec.taints] == [
        ("node.kubernetes.io/unschedulable", "NoSchedule")
    ]
    assert int(after_cordon.metadata.resource_version) > int(cordoned.metadata.resource_version)
    assert after_uncordon.spec.taints is None


async def test_duplicate_taint_is_422(core: client.CoreV1Api) -> None:
    await core.create_node(node("node-1"))

    with pytest.raises(client.ApiException) as raised:
        await core.patch_node("node-1", {"spec": {"taints": [TAINT_A, dict(TAINT_A)]}})

    body = json.loads(raised.value.body)
    assert raised.value.status == 422
    assert body["details"]["causes"][0]["field"] == "metadata.taints[1]"  # as kube-apiserver
    assert "taints must be unique by key and effect pair" in body["message"]


async def test_pod_spec_is_immutable_except_images(core: client.CoreV1Api) -> None:
    await core.create_namespaced_pod("default", pod("a"))

    reimaged = await core.patch_namespaced_pod(
        "a", "default", {"spec": {"containers": [{"name": "main", "image": "app:2"}]}}
    )
    with pytest.raises(client.ApiException) as raised:
        await core.patch_namespaced_pod("a", "default", {"spec": {"nodeName": "elsewhere"}})

    assert reimaged.spec.containers[0].image == "app:2"
    assert raised.value.status == 422
    assert "pod updates may not change fields" in json.loads(raised.value.body)["message"]


def test_strategic_merge_directives() -> None:
    original = {
        "containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "1"}],
        "finalizers": ["x", "y"],
        "tolerations": [{"key": "t"}],
        "map": {"keep": 1, "drop": 2},
    }

    merged = strategic_merge(
        original,
        {
            "containers": [{"name": "a", "$patch": "delete"}, {"name": "c", "image": "2"}],
            "$deleteFromPrimitiveList/finalizers": ["x"],
            "tolerations": [{"key": "u"}],
            "map": {"$patch": "replace", "new": 3},
        },
    )

    assert merged == {
        "containers": [{"name": "c", "image": "2"}, {"name": "b", "image": "1"}],
        "finalizers": ["y"],
        "tolerations": [{"key": "u"}],
        "map": {"new": 3},
    }


def test_strategic_merge_set_element_order_and_list_replace() -> None:
    original = {"env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}

    reordered = strategic_merge(
        original, {"$setElementOrder/env": [{"name": "B"}, {"name": "A"}], "env": []}
    )
    replaced = strategic_merge(original, {"env": [{"$patch": "replace"}, {"name": "C"}]})

    assert [e["name"] for e in reordered["env"]] == ["B", "A"]
    assert replaced == {"env": [{"name": "C"}]}


def test_merge_and_json_patch_primitives() -> None:
    assert apply_merge_patch({"a": {"b": 1, "c": 2}}, {"a": {"b": None, "d": [1]}}) == {
        "a": {"c": 2, "d": [1]}
    }
    patched = apply_json_patch(
        {"items": [1, 3], "x": {"y": 1}},
        [
            {"op": "add", "path": "/items/1", "value": 2},
            {"op": "add", "path": "/items/-", "value": 4},
            {"op": "move", "from": "/x/y", "path": "/z"},
            {"op": "replace", "path": "/x", "value": "done"},
            {"op": "copy", "from": "/z", "path": "/w"},
            {"op": "remove", "path": "/w"},
            {"op": "test", "path": "/z", "value": 1},
        ],
    )
    assert patched == {"items": [1, 2, 3, 4], "x": "done", "z": 1}


async def test_a_patch_that_renames_the_object_is_400_and_changes_nothing(raw: RawApi) -> None:
    await raw.request("POST", "/api/v1/nodes", node("node-1"))

    status, body, _ = await raw.request(
        "PATCH",
        NODE,
        {"metadata": {"name": "node-2"}},
        content_type="application/merge-patch+json",
    )

    assert status == 400
    assert "does not match the name on the URL (node-1)" in body["message"]
    status, _, _ = await raw.request("GET", "/api/v1/nodes/node-2")
    assert status == 404
