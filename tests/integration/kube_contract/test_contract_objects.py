"""Patches, server-side apply, finalizers, selectors, watches and Leases."""

from __future__ import annotations

import asyncio

from tests.integration.kube_contract.conftest import Api, config_map, configmaps, pod

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"


async def test_a_merge_patch_replaces_lists_and_null_deletes(api: Api) -> None:
    made = config_map(a="1", b="2")
    made["metadata"]["finalizers"] = ["example.com/one", "example.com/two"]
    await api.request("POST", configmaps(api), made)
    patch = {"data": {"a": None}, "metadata": {"finalizers": ["example.com/three"]}}
    status, patched = await api.request("PATCH", configmaps(api) + "/cm", patch, content_type=MERGE)

    assert status == 200
    assert patched["data"] == {"b": "2"}
    assert patched["metadata"]["finalizers"] == ["example.com/three"]
    await api.request(
        "PATCH", configmaps(api) + "/cm", {"metadata": {"finalizers": None}}, content_type=MERGE
    )


async def test_a_json_patch_whose_test_fails_is_422(api: Api) -> None:
    await api.request("POST", configmaps(api), config_map(a="1"))
    patch = [{"op": "test", "path": "/data/a", "value": "2"}, {"op": "remove", "path": "/data/a"}]
    status, answer = await api.request(
        "PATCH", configmaps(api) + "/cm", patch, content_type=JSON_PATCH
    )
    _, unchanged = await api.request("GET", configmaps(api) + "/cm")

    assert (status, answer["reason"]) == (422, "Invalid")
    assert unchanged["data"] == {"a": "1"}


async def test_a_strategic_merge_merges_containers_by_name(api: Api) -> None:
    await api.seed(pod("p"))
    patch = {"spec": {"containers": [{"name": "main", "image": "registry.example/app:2.0"}]}}
    path = f"/api/v1/namespaces/{api.namespace}/pods/p"
    status, patched = await api.request("PATCH", path, patch, content_type=STRATEGIC)

    assert status == 200
    assert [c["image"] for c in patched["spec"]["containers"]] == ["registry.example/app:2.0"]


async def test_server_side_apply_owns_fields_and_conflicts_across_managers(api: Api) -> None:
    path = configmaps(api) + "/applied"
    body = 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: applied\ndata:\n  k: "1"\n'
    first, made = await api.request(
        "PATCH", path, body, content_type=APPLY, params={"fieldManager": "alice"}
    )
    other = body.replace('"1"', '"2"')
    refused, conflict = await api.request(
        "PATCH", path, other, content_type=APPLY, params={"fieldManager": "bob"}
    )
    forced, taken = await api.request(
        "PATCH", path, other, content_type=APPLY, params={"fieldManager": "bob", "force": "true"}
    )

    assert first == 201, made
    assert made["data"] == {"k": "1"}
    assert [entry["manager"] for entry in made["metadata"]["managedFields"]] == ["alice"]
    assert (refused, conflict["reason"]) == (409, "Conflict"), conflict
    assert 'conflict with "alice"' in conflict["message"]
    assert forced == 200, taken
    assert taken["data"] == {"k": "2"}
    assert "bob" in [entry["manager"] for entry in taken["metadata"]["managedFields"]]


def _applied(name: str, **data: str) -> str:
    lines = [f'  {k}: "{v}"' for k, v in data.items()]
    return f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n" + "\n".join(lines)


async def test_apply_conflicts_group_by_manager_and_name_update_managers(api: Api) -> None:
    path = configmaps(api) + "/owned"
    await api.request(
        "PATCH", path, _applied("owned", a="1", b="2"), content_type=APPLY,
        params={"fieldManager": "alice"},
    )  # fmt: skip
    await api.request(
        "PATCH", path, {"data": {"c": "3"}}, content_type=MERGE, params={"fieldManager": "dave"}
    )
    plural, many = await api.request(
        "PATCH", path, _applied("owned", a="9", b="9"), content_type=APPLY,
        params={"fieldManager": "carol"},
    )  # fmt: skip
    single, one = await api.request(
        "PATCH", path, _applied("owned", c="9"), content_type=APPLY,
        params={"fieldManager": "carol"},
    )  # fmt: skip
    dropped, kept = await api.request(
        "PATCH", path, _applied("owned", a="1"), content_type=APPLY,
        params={"fieldManager": "alice"},
    )  # fmt: skip
    unnamed, invalid = await api.request(
        "PATCH", path, _applied("owned", a="1"), content_type=APPLY
    )

    assert plural == 409
    assert many["message"] == (
        'Apply failed with 2 conflicts: conflicts with "alice":\n- .data.a\n- .data.b'
    )
    assert sorted(c["field"] for c in many["details"]["causes"]) == [".data.a", ".data.b"]
    assert single == 409
    assert one["message"] == 'Apply failed with 1 conflict: conflict with "dave" using v1: .data.c'
    assert dropped == 200
    assert kept["data"] == {"a": "1", "c": "3"}
    assert (unnamed, invalid["reason"]) == (422, "Invalid")
    assert invalid["message"] == (
        'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: '
        "is required for apply patch"
    )


async def test_a_finalizer_holds_a_deleted_object_until_it_is_removed(api: Api) -> None:
    held = config_map()
    held["metadata"]["finalizers"] = ["example.com/hold"]
    await api.request("POST", configmaps(api), held)
    status, deleting = await api.request("DELETE", configmaps(api) + "/cm")
    _, still = await api.request("GET", configmaps(api) + "/cm")
    patch = {"metadata": {"finalizers": None}}
    await api.request("PATCH", configmaps(api) + "/cm", patch, content_type=MERGE)
    gone, _ = await api.request("GET", configmaps(api) + "/cm")

    assert status == 200
    assert deleting["metadata"]["deletionTimestamp"]
    assert still["metadata"]["deletionTimestamp"] == deleting["metadata"]["deletionTimestamp"]
    assert gone == 404


async def test_an_object_without_finalizers_goes_at_once(api: Api) -> None:
    await api.request("POST", configmaps(api), config_map())
    status, answer = await api.request("DELETE", configmaps(api) + "/cm")
    gone, _ = await api.request("GET", configmaps(api) + "/cm")

    assert status == 200
    assert answer["kind"] in ("ConfigMap", "Status")
    assert gone == 404


async def test_label_and_field_selectors_filter_lists(api: Api) -> None:
    await api.seed(pod("a", {"tier": "gpu"}, node="node-1"))
    await api.seed(pod("b", {"tier": "gpu"}, node="node-2"))
    await api.seed(pod("c", {"tier": "cpu"}, node="node-1"))
    path = f"/api/v1/namespaces/{api.namespace}/pods"

    _, by_label = await api.request("GET", path, params={"labelSelector": "tier=gpu"})
    _, by_field = await api.request("GET", path, params={"fieldSelector": "spec.nodeName=node-1"})
    _, both = await api.request(
        "GET", path, params={"labelSelector": "tier!=cpu", "fieldSelector": "spec.nodeName=node-1"}
    )
    bad, answer = await api.request("GET", path, params={"fieldSelector": "spec.image=x"})

    assert sorted(p["metadata"]["name"] for p in by_label["items"]) == ["a", "b"]
    assert sorted(p["metadata"]["name"] for p in by_field["items"]) == ["a", "c"]
    assert [p["metadata"]["name"] for p in both["items"]] == ["a"]
    assert (bad, answer["reason"]) == (400, "BadRequest")
    assert answer["message"] == "field label not supported: spec.image"


async def test_a_watch_from_a_list_sees_each_change_once_in_order(api: Api) -> None:
    _, listed = await api.request("GET", configmaps(api))
    since = listed["metadata"]["resourceVersion"]
    watching = asyncio.create_task(api.watch(configmaps(api), {"resourceVersion": since}, 3))
    await asyncio.sleep(0.5)
    await api.request("POST", configmaps(api), config_map(k="1"))
    await api.request("PATCH", configmaps(api) + "/cm", {"data": {"k": "2"}}, content_type=MERGE)
    await api.request("DELETE", configmaps(api) + "/cm")
    events = await asyncio.wait_for(watching, 20)

    assert [event["type"] for event in events] == ["ADDED", "MODIFIED", "DELETED"]
    versions = [int(event["object"]["metadata"]["resourceVersion"]) for event in events]
    assert versions == sorted(versions) and len(set(versions)) == 3
    assert events[1]["object"]["data"] == {"k": "2"}


async def test_a_lease_taken_with_a_stale_version_is_409_and_times_are_micro(api: Api) -> None:
    path = f"/apis/coordination.k8s.io/v1/namespaces/{api.namespace}/leases"
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "leader"},
        "spec": {
            "holderIdentity": "a",
            "leaseDurationSeconds": 15,
            "renewTime": "2026-01-01T00:00:01.500000+00:00",
        },
    }
    sloppy = {**lease, "spec": {**lease["spec"], "renewTime": "2026-01-01T00:00:01.5+00:00"}}
    malformed, refusal = await api.request("POST", path, sloppy)
    status, made = await api.request("POST", path, lease)
    assert status == 201, made["message"]
    taken = {**made, "spec": {**made["spec"], "holderIdentity": "b"}}
    assert (await api.request("PUT", f"{path}/leader", taken))[0] == 200
    late = {**made, "spec": {**made["spec"], "holderIdentity": "c"}}
    refused, answer = await api.request("PUT", f"{path}/leader", late)

    assert (malformed, refusal["reason"]) == (400, "BadRequest")  # a MicroTime has 6 digits
    assert 'cannot parse ".5+00:00" as ".000000"' in refusal["message"]
    assert made["spec"]["renewTime"] == "2026-01-01T00:00:01.500000Z"
    assert (refused, answer["reason"]) == (409, "Conflict")


async def test_a_node_write_keeps_its_status_and_the_status_write_keeps_its_spec(
    api: Api,
) -> None:
    name = f"{api.namespace}-node"
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "status": {"capacity": {"nvidia.com/gpu": "8"}},
    }
    await api.seed(node)
    path = f"/api/v1/nodes/{name}"
    both = {"spec": {"unschedulable": True}, "status": {"capacity": {"nvidia.com/gpu": "1"}}}
    code, written = await api.request("PATCH", path, both, content_type=MERGE)
    assert code == 200, written["message"]
    other = {"spec": {"unschedulable": False}, "status": {"capacity": {"nvidia.com/gpu": "4"}}}
    code, after = await api.request("PATCH", f"{path}/status", other, content_type=MERGE)
    assert code == 200, after["message"]
    await api.request("DELETE", path)

    assert written["spec"]["unschedulable"] is True
    assert written["status"]["capacity"]["nvidia.com/gpu"] == "8"
    assert after["spec"]["unschedulable"] is True
    assert after["status"]["capacity"]["nvidia.com/gpu"] == "4"
