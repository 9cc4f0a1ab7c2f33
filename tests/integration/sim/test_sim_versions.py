"""resourceVersion, optimistic concurrency, server-set fields and no-op writes."""

from __future__ import annotations

import json

import pytest
from kubernetes.aio import client

from gpuop_sim import ApiServer
from gpuop_sim.apiserver import kinds
from tests.integration.sim.support import RawApi, node, pod

STALE = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


async def test_one_global_counter_orders_writes_across_resources(
    core: client.CoreV1Api,
) -> None:
    first = await core.create_node(node("node-1"))
    second = await core.create_namespaced_pod("default", pod("a"))
    listed = await core.list_node()

    assert int(second.metadata.resource_version) == int(first.metadata.resource_version) + 1
    assert listed.metadata.resource_version == second.metadata.resource_version


async def test_stale_update_is_409_conflict_with_exact_message(
    core: client.CoreV1Api,
) -> None:
    created = await core.create_node(node("node-1"))
    created.metadata.labels = {"a": "1"}
    await core.replace_node("node-1", created)
    created.metadata.labels = {"a": "2"}

    with pytest.raises(client.ApiException) as raised:
        await core.replace_node("node-1", created)

    assert raised.value.status == 409
    body = json.loads(raised.value.body)
    assert body["reason"] == "Conflict"
    assert body["message"] == f'Operation cannot be fulfilled on nodes "node-1": {STALE}'


async def test_update_without_resource_version_is_unconditional(core: client.CoreV1Api) -> None:
    await core.create_node(node("node-1"))
    body = node("node-1", labels={"a": "1"})

    updated = await core.replace_node("node-1", body)

    assert updated.metadata.labels == {"a": "1"}


async def test_conflict_on_group_resource_names_the_group(api: client.ApiClient) -> None:
    leases = client.CoordinationV1Api(api)
    lease = {"metadata": {"name": "leader"}, "spec": {"holderIdentity": "a"}}
    created = await leases.create_namespaced_lease("default", lease)
    created.spec.holder_identity = "b"
    await leases.replace_namespaced_lease("leader", "default", created)
    created.spec.holder_identity = "c"

    with pytest.raises(client.ApiException) as raised:
        await leases.replace_namespaced_lease("leader", "default", created)

    assert json.loads(raised.value.body)["message"] == (
        f'Operation cannot be fulfilled on leases.coordination.k8s.io "leader": {STALE}'
    )


async def test_patch_carrying_a_stale_resource_version_is_409(core: client.CoreV1Api) -> None:
    created = await core.create_node(node("node-1"))
    await core.patch_node("node-1", {"metadata": {"labels": {"a": "1"}}})

    with pytest.raises(client.ApiException) as raised:
        await core.patch_node(
            "node-1",
            {
                "metadata": {
                    "labels": {"a": "2"},
                    "resourceVersion": created.metadata.resource_version,
                }
            },
        )

    assert raised.value.status == 409


async def test_create_of_an_existing_name_is_409_already_exists(core: client.CoreV1Api) -> None:
    await core.create_namespaced_pod("default", pod("a"))

    with pytest.raises(client.ApiException) as raised:
        await core.create_namespaced_pod("default", pod("a"))

    body = json.loads(raised.value.body)
    assert (raised.value.status, body["reason"]) == (409, "AlreadyExists")
    assert body["message"] == 'pods "a" already exists'


async def test_missing_object_is_404_not_found(core: client.CoreV1Api) -> None:
    with pytest.raises(client.ApiException) as raised:
        await core.patch_node("ghost", {"spec": {"unschedulable": True}})
    assert raised.value.status == 404
    assert json.loads(raised.value.body)["message"] == 'nodes "ghost" not found'


async def test_create_in_a_missing_namespace_is_404(core: client.CoreV1Api) -> None:
    with pytest.raises(client.ApiException) as raised:
        await core.create_namespaced_pod("nowhere", pod("a", namespace="nowhere"))
    assert json.loads(raised.value.body)["message"] == 'namespaces "nowhere" not found'


async def test_server_sets_uid_creation_timestamp_and_generation(core: client.CoreV1Api) -> None:
    body = node("node-1")
    body["metadata"]["uid"] = "client-chosen"

    created = await core.create_node(body)
    relabelled = await core.patch_node("node-1", {"metadata": {"labels": {"a": "1"}}})
    respecced = await core.patch_node("node-1", {"spec": {"podCIDR": "10.0.0.0/24"}})

    assert created.metadata.uid != "client-chosen"
    assert created.metadata.creation_timestamp is not None
    assert created.metadata.generation == 1
    assert relabelled.metadata.generation == 1
    assert respecced.metadata.generation == 2
    assert respecced.metadata.uid == created.metadata.uid


async def test_no_op_write_keeps_resource_version_and_emits_nothing(
    server: ApiServer, core: client.CoreV1Api
) -> None:
    created = await core.create_node(node("node-1", labels={"a": "1"}))
    before = server.store.resource_version

    patched = await core.patch_node("node-1", {"metadata": {"labels": {"a": "1"}}})
    replaced = await core.replace_node("node-1", created)

    assert patched.metadata.resource_version == created.metadata.resource_version
    assert replaced.metadata.resource_version == created.metadata.resource_version
    assert server.store.resource_version == before
    assert server.store.changes_since(kinds.NODES.group_resource, before) == []


async def test_create_with_resource_version_is_rejected(raw: RawApi) -> None:
    body = node("node-1")
    body["metadata"]["resourceVersion"] = "5"
    status, answer, _ = await raw.request("POST", "/api/v1/nodes", body)
    assert status == 400
    assert answer["message"] == "resourceVersion should not be set on objects to be created"


async def test_update_with_another_name_is_400(raw: RawApi, core: client.CoreV1Api) -> None:
    await core.create_node(node("node-1"))
    status, answer, _ = await raw.request("PUT", "/api/v1/nodes/node-1", node("node-2"))
    assert status == 400
    assert answer["message"] == (
        "the name of the object (node-2) does not match the name on the URL (node-1)"
    )


async def test_generate_name_gets_a_random_suffix(core: client.CoreV1Api) -> None:
    body = pod("")
    body["metadata"] = {"generateName": "worker-"}

    created = await core.create_namespaced_pod("default", body)

    assert created.metadata.name.startswith("worker-")
    assert len(created.metadata.name) == len("worker-") + 5


async def test_invalid_label_value_is_422_naming_the_field(core: client.CoreV1Api) -> None:
    with pytest.raises(client.ApiException) as raised:
        await core.create_node(node("node-1", labels={"nvidia.com/gpu.product": "NVIDIA H200"}))

    body = json.loads(raised.value.body)
    assert raised.value.status == 422
    assert body["reason"] == "Invalid"
    assert body["message"].startswith(
        'Node "node-1" is invalid: metadata.labels: Invalid value: "NVIDIA H200": '
    )
    assert body["details"]["causes"][0]["field"] == "metadata.labels"


async def test_events_are_plain_namespaced_objects(core: client.CoreV1Api) -> None:
    created = await core.create_namespaced_event(
        "default",
        {
            "metadata": {"name": "node-1.upgrade"},
            "involvedObject": {"kind": "Node", "name": "node-1"},
            "reason": "DriverUpgradeStarted",
            "message": "draining",
            "type": "Normal",
            "firstTimestamp": "2026-01-01T00:00:00.123+00:00",
        },
    )
    found = await core.list_namespaced_event(
        "default", field_selector="involvedObject.name=node-1,reason=DriverUpgradeStarted"
    )

    assert created.first_timestamp.microsecond == 0
    assert [e.metadata.name for e in found.items] == ["node-1.upgrade"]


async def test_daemonset_status_is_a_subresource(api: client.ApiClient) -> None:
    apps = client.AppsV1Api(api)
    body = {
        "metadata": {"name": "driver"},
        "spec": {
            "selector": {"matchLabels": {"app": "driver"}},
            "template": {
                "metadata": {"labels": {"app": "driver"}},
                "spec": {"containers": [{"name": "d", "image": "driver:1"}]},
            },
        },
    }
    await apps.create_namespaced_daemon_set("default", body)

    status = {
        "status": {
            "currentNumberScheduled": 2,
            "desiredNumberScheduled": 2,
            "numberMisscheduled": 0,
            "numberReady": 2,
            "observedGeneration": 1,
        }
    }
    written = await apps.patch_namespaced_daemon_set_status("driver", "default", status)
    respecced = await apps.patch_namespaced_daemon_set(
        "driver",
        "default",
        {"spec": {"template": {"spec": {"containers": [{"name": "d", "image": "driver:2"}]}}}},
    )

    assert written.status.number_ready == 2
    assert written.metadata.generation == 1
    assert respecced.metadata.generation == 2
    assert respecced.status.number_ready == 2


async def test_dry_run_create_persists_nothing(core: client.CoreV1Api) -> None:
    answered = await core.create_node(node("node-1"), dry_run="All")
    listed = await core.list_node()

    assert answered.metadata.name == "node-1"
    assert listed.items == []
