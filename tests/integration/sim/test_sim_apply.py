"""Server-side apply (``application/apply-patch+yaml``) and the managedFields it keeps.

The expected messages and field sets are the real kube-apiserver's answers to the same
requests (see the contract suite's apply tests)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuop_sim import ApiServer
from tests.integration.sim.support import RawApi

Obj = dict[str, Any]

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
CONFIGMAPS = "/api/v1/namespaces/default/configmaps"
CM = CONFIGMAPS + "/cm"


def config(*, labels: dict[str, str] | None = None, **data: str) -> str:
    """A ConfigMap configuration in YAML, as ``kubectl apply --server-side`` sends it."""
    lines = ["apiVersion: v1", "kind: ConfigMap", "metadata:", "  name: cm"]
    if labels:
        lines.append("  labels:")
        lines.extend(f'    {k}: "{v}"' for k, v in labels.items())
    if data:
        lines.append("data:")
        lines.extend(f'  {k}: "{v}"' for k, v in data.items())
    return "\n".join(lines) + "\n"


async def send(
    raw: RawApi,
    method: str,
    path: str,
    body: str | Obj | None = None,
    *,
    content_type: str = APPLY,
    **params: str,
) -> tuple[int, Obj]:
    headers = {"Authorization": f"Bearer {raw.token}", "Content-Type": content_type}
    data = body if isinstance(body, str) or body is None else json.dumps(body)
    async with raw.session.request(
        method, raw.url + path, data=data, params=params, headers=headers
    ) as response:
        return response.status, await response.json(content_type=None)


def fields(obj: Obj) -> dict[str, Obj]:
    """Each manager's fieldsV1, by manager."""
    return {e["manager"]: e["fieldsV1"] for e in obj["metadata"].get("managedFields", [])}


@pytest.fixture
async def raw(server: ApiServer) -> Any:
    async with RawApi(server.url, server.token, server.ssl_context()) as session:
        yield session


async def test_apply_creates_a_missing_object_with_an_apply_entry(raw: RawApi) -> None:
    status, made = await send(raw, "PATCH", CM, config(a="1"), fieldManager="alice")

    assert status == 201, made
    assert made["data"] == {"a": "1"}
    assert made["metadata"]["resourceVersion"]
    [entry] = made["metadata"]["managedFields"]
    assert {k: v for k, v in entry.items() if k != "time"} == {
        "manager": "alice",
        "operation": "Apply",
        "apiVersion": "v1",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:data": {"f:a": {}}},
    }
    assert entry["time"]


async def test_apply_takes_a_json_body_too(raw: RawApi) -> None:
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"a": "1"}}

    status, made = await send(raw, "PATCH", CM, json.dumps(body), fieldManager="alice")

    assert (status, made["data"]) == (201, {"a": "1"})


async def test_apply_into_a_missing_namespace_is_404(raw: RawApi) -> None:
    path = "/api/v1/namespaces/absent/configmaps/cm"

    status, answer = await send(raw, "PATCH", path, config(a="1"), fieldManager="alice")

    assert (status, answer["message"]) == (404, 'namespaces "absent" not found')


async def test_apply_updates_an_existing_object_merging_maps(raw: RawApi) -> None:
    await send(raw, "PATCH", CM, config(a="1"), fieldManager="alice")
    await send(raw, "PATCH", CM, {"data": {"b": "2"}}, content_type=MERGE)

    status, updated = await send(raw, "PATCH", CM, config(a="2"), fieldManager="alice")

    assert status == 200, updated
    assert updated["data"] == {"a": "2", "b": "2"}


async def test_an_update_records_an_update_entry_for_the_user_agent(raw: RawApi) -> None:
    status, made = await send(
        raw, "POST", CONFIGMAPS, {"metadata": {"name": "cm"}, "data": {"a": "1"}},
        content_type="application/json",
    )  # fmt: skip
    _, patched = await send(
        raw, "PATCH", CM, {"data": {"b": "2"}}, content_type=MERGE, fieldManager="dave"
    )

    assert status == 201
    [entry] = made["metadata"]["managedFields"]
    assert (entry["manager"], entry["operation"]) == ("Python", "Update")
    assert entry["fieldsV1"] == {"f:data": {".": {}, "f:a": {}}}
    assert fields(patched) == {
        "Python": {"f:data": {".": {}, "f:a": {}}},
        "dave": {"f:data": {"f:b": {}}},
    }


async def test_applying_the_same_value_shares_ownership(raw: RawApi) -> None:
    await send(raw, "PATCH", CM, config(a="1", b="2"), fieldManager="alice")
    _, before = await send(raw, "GET", CM)

    status, shared = await send(raw, "PATCH", CM, config(a="1"), fieldManager="bob")

    assert status == 200, shared
    assert fields(shared) == {
        "alice": {"f:data": {"f:a": {}, "f:b": {}}},
        "bob": {"f:data": {"f:a": {}}},
    }
    assert int(shared["metadata"]["resourceVersion"]) > int(before["metadata"]["resourceVersion"])


async def test_a_conflict_names_the_owner_and_the_field(raw: RawApi) -> None:
    await send(raw, "PATCH", CM, config(k="1"), fieldManager="alice")

    status, answer = await send(raw, "PATCH", CM, config(k="2"), fieldManager="bob")
    _, unchanged = await send(raw, "GET", CM)

    assert (status, answer["reason"]) == (409, "Conflict")
    assert answer["message"] == 'Apply failed with 1 conflict: conflict with "alice": .data.k'
    assert answer["details"]["causes"] == [
        {"reason": "FieldManagerConflict", "message": 'conflict with "alice"', "field": ".data.k"}
    ]
    assert unchanged["data"] == {"k": "1"}


async def test_conflicts_are_grouped_by_manager_in_the_plural(raw: RawApi) -> None:
    await send(raw, "PATCH", CM, config(labels={"x": "1"}, a="1", b="2"), fieldManager="alice")
    await send(raw, "PATCH", CM, config(a="1"), fieldManager="bob")

    status, answer = await send(
        raw, "PATCH", CM, config(labels={"x": "9"}, a="9", b="9"), fieldManager="carol"
    )

    assert status == 409
    assert answer["message"] == (
        'Apply failed with 4 conflicts: conflicts with "alice":\n- .data.a\n- .data.b\n'
        '- .metadata.labels.x\nconflicts with "bob":\n- .data.a'
    )
    assert len(answer["details"]["causes"]) == 4


async def test_an_update_managers_field_conflicts_with_an_apply(raw: RawApi) -> None:
    await send(raw, "PATCH", CM, config(a="1"), fieldManager="alice")
    await send(raw, "PATCH", CM, {"data": {"c": "3"}}, content_type=MERGE, fieldManager="dave")

    status, answer = await send(raw, "PATCH", CM, config(c="9"), fieldManager="carol")

    assert status == 409
    assert answer["message"] == (
        'Apply failed with 1 conflict: conflict with "dave" using v1: .data.c'
    )


async def test_force_takes_the_field_from_its_owner(raw: RawApi) -> None:
    await send(raw, "PATCH", CM, config(labels={"x": "1"}, a="1"), fieldManager="alice")

    status, taken = await send(raw, "PATCH", CM, config(a="7"), fieldManager="bob", force="true")

    assert status == 200, taken
    assert taken["data"] == {"a": "7"}
    assert fields(taken) == {
        "alice": {"f:metadata": {"f:labels": {"f:x": {}}}},
        "bob": {"f:data": {"f:a": {}}},
    }


async def test_a_fully_forced_out_manager_loses_its_entry(raw: RawApi) -> None:
    await send(raw, "PATCH", CM, config(a="1"), fieldManager="alice")

    _, taken = await send(raw, "PATCH", CM, config(a="2"), fieldManager="bob", force="true")

    assert [e["manager"] for e in taken["metadata"]["managedFields"]] == ["bob"]


async def test_apply_without_field_manager_is_422(raw: RawApi) -> None:
    status, answer = await send(raw, "PATCH", CM, config(a="1"))

    assert (status, answer["reason"]) == (422, "Invalid")
    assert answer["message"] == (
        'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: '
        "is required for apply patch"
    )


async def test_a_dry_run_apply_persists_nothing(raw: RawApi) -> None:
    created, made = await send(raw, "PATCH", CM, config(a="1"), fieldManager="alice", dryRun="All")
    missing, _ = await send(raw, "GET", CM)
    await send(raw, "PATCH", CM, config(a="1"), fieldManager="alice")
    _, before = await send(raw, "GET", CM)
    updated, answer = await send(
        raw, "PATCH", CM, config(a="2"), fieldManager="alice", dryRun="All"
    )
    _, after = await send(raw, "GET", CM)

    assert (created, made["data"]) == (201, {"a": "1"})
    assert missing == 404
    assert (updated, answer["data"]) == (200, {"a": "2"})
    assert after == before


async def test_fields_the_manager_no_longer_applies_are_removed(raw: RawApi) -> None:
    await send(raw, "PATCH", CM, config(a="1", b="2"), fieldManager="alice")

    _, updated = await send(raw, "PATCH", CM, config(a="1"), fieldManager="alice")

    assert updated["data"] == {"a": "1"}
    assert fields(updated) == {"alice": {"f:data": {"f:a": {}}}}


async def test_a_dropped_field_another_manager_owns_stays(raw: RawApi) -> None:
    await send(raw, "PATCH", CM, config(a="1", b="2"), fieldManager="alice")
    await send(raw, "PATCH", CM, config(b="2"), fieldManager="bob")

    _, updated = await send(raw, "PATCH", CM, config(a="1"), fieldManager="alice")

    assert updated["data"] == {"a": "1", "b": "2"}
    assert fields(updated)["bob"] == {"f:data": {"f:b": {}}}


async def test_malformed_yaml_is_400(raw: RawApi) -> None:
    status, answer = await send(
        raw, "PATCH", CM, "apiVersion: v1\nkind: [ConfigMap\n", fieldManager="alice"
    )

    assert (status, answer["reason"]) == (400, "BadRequest")
    assert answer["message"].startswith("error encoding patch: yaml: line ")


async def test_managed_fields_in_an_applied_configuration_are_400(raw: RawApi) -> None:
    body = config(a="1").replace("  name: cm\n", "  name: cm\n  managedFields: [{}]\n")

    status, answer = await send(raw, "PATCH", CM, body, fieldManager="alice")

    assert (status, answer["message"]) == (400, "metadata.managedFields must be nil")


async def test_a_no_op_apply_keeps_the_resource_version(raw: RawApi) -> None:
    _, made = await send(raw, "PATCH", CM, config(a="1"), fieldManager="alice")

    status, again = await send(raw, "PATCH", CM, config(a="1"), fieldManager="alice")

    assert status == 200
    assert again["metadata"]["resourceVersion"] == made["metadata"]["resourceVersion"]


async def test_a_no_op_update_keeps_the_resource_version(raw: RawApi) -> None:
    await send(raw, "PATCH", CM, config(a="1"), fieldManager="alice")
    _, before = await send(raw, "GET", CM)

    _, again = await send(raw, "PATCH", CM, {"data": {"a": "1"}}, content_type=MERGE)

    assert again == before


async def test_client_sent_managed_fields_are_replaced_only_when_valid(raw: RawApi) -> None:
    await send(raw, "PATCH", CM, config(a="1"), fieldManager="alice")
    garbage = {"metadata": {"managedFields": [{"manager": "zzz"}]}}
    _, kept = await send(raw, "PATCH", CM, garbage, content_type=MERGE)
    cleared = {"metadata": {"managedFields": [{}]}}
    _, stripped = await send(raw, "PATCH", CM, cleared, content_type=MERGE)

    assert list(fields(kept)) == ["alice"]
    assert "managedFields" not in stripped["metadata"]


async def test_containers_merge_by_name_and_conflict_by_item(
    raw: RawApi, server: ApiServer
) -> None:
    server.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"}})
    path = "/api/v1/namespaces/default/pods/p"
    pod: Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {
            "nodeName": "node-1",
            "containers": [{"name": "main", "image": "app:1", "ports": [{"containerPort": 80}]}],
        },
    }
    status, made = await send(raw, "PATCH", path, json.dumps(pod), fieldManager="alice")
    same = {**pod, "spec": {"containers": [{"name": "main", "image": "app:1"}]}}
    _, merged = await send(raw, "PATCH", path, json.dumps(same), fieldManager="bob")
    clash = {**pod, "spec": {"containers": [{"name": "main", "image": "app:2"}]}}
    refused, answer = await send(raw, "PATCH", path, json.dumps(clash), fieldManager="bob")

    assert status == 201, made
    main = fields(made)["alice"]["f:spec"]["f:containers"]['k:{"name":"main"}']
    assert main["."] == {} and "f:image" in main
    assert merged["spec"]["containers"][0]["ports"] == [{"containerPort": 80}]
    assert fields(merged)["bob"]["f:spec"]["f:containers"]['k:{"name":"main"}'] == {
        ".": {},
        "f:image": {},
        "f:name": {},
    }
    assert refused == 409
    assert answer["message"] == (
        'Apply failed with 1 conflict: conflict with "alice": .spec.containers[name="main"].image'
    )


async def test_apply_to_a_custom_resource(raw: RawApi, server: ApiServer) -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }
    await send(
        raw, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd,
        content_type="application/json",
    )  # fmt: skip
    path = "/apis/example.com/v1/namespaces/default/widgets/w"
    body = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    first = {**body, "spec": {"size": 1, "tags": ["a"]}}
    second = {**body, "spec": {"size": 2}}

    created, made = await send(raw, "PATCH", path, json.dumps(first), fieldManager="alice")
    refused, _ = await send(raw, "PATCH", path, json.dumps(second), fieldManager="bob")

    assert created == 201, made
    assert fields(made)["alice"] == {"f:spec": {"f:size": {}, "f:tags": {}}}
    assert refused == 409
