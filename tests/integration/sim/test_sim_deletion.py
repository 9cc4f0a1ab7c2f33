"""Finalizers, graceful pod termination, delete options, namespaces and ownerReferences."""

from __future__ import annotations

import asyncio
import json

import pytest
from kubernetes.aio import client

from gpuop_sim import ApiServer
from gpuop_sim.apiserver import kinds
from tests.integration.sim.support import RawApi, node, pod, running

FINALIZER = "gpuop.io/cleanup"


async def exists(core: client.CoreV1Api, name: str) -> bool:
    try:
        await core.read_namespaced_pod(name, "default")
    except client.ApiException as error:
        assert error.status == 404
        return False
    return True


async def test_finalizer_holds_object_until_removed(
    server: ApiServer, core: client.CoreV1Api, raw: RawApi
) -> None:
    body = node("node-1")
    body["metadata"]["finalizers"] = [FINALIZER]
    created = await core.create_node(body)
    stream = asyncio.create_task(
        raw.watch(
            "/api/v1/nodes",
            {"watch": "1", "resourceVersion": created.metadata.resource_version},
            count=2,
        )
    )

    await core.delete_node("node-1")
    held = await core.read_node("node-1")
    await core.patch_node(
        "node-1", {"metadata": {"$deleteFromPrimitiveList/finalizers": [FINALIZER]}}
    )
    events = await stream

    assert held.metadata.deletion_timestamp is not None
    assert held.metadata.deletion_grace_period_seconds == 0
    assert [e["type"] for e in events] == ["MODIFIED", "DELETED"]
    with pytest.raises(client.ApiException):
        await core.read_node("node-1")


async def test_no_new_finalizers_while_deleting(core: client.CoreV1Api) -> None:
    body = node("node-1")
    body["metadata"]["finalizers"] = [FINALIZER]
    await core.create_node(body)
    await core.delete_node("node-1")

    with pytest.raises(client.ApiException) as raised:
        await core.patch_node("node-1", {"metadata": {"finalizers": ["gpuop.io/other"]}})

    assert raised.value.status == 422
    assert "no new finalizers can be added" in json.loads(raised.value.body)["message"]


async def test_object_without_finalizers_goes_at_once_with_success_status(raw: RawApi) -> None:
    await raw.request("POST", "/api/v1/nodes", node("node-1"))

    status, body, _ = await raw.request("DELETE", "/api/v1/nodes/node-1")

    assert status == 200
    assert (body["kind"], body["status"], body["details"]["name"]) == (
        "Status",
        "Success",
        "node-1",
    )


async def test_bound_pod_terminates_gracefully_until_kubelet_confirms(
    server: ApiServer, core: client.CoreV1Api
) -> None:
    server.seed(running(pod("a")))

    deleted = await core.delete_namespaced_pod("a", "default", grace_period_seconds=30)
    still_there = await exists(core, "a")
    server.complete_pod_termination("default", "a")

    assert deleted.metadata.deletion_timestamp is not None
    assert deleted.metadata.deletion_grace_period_seconds == 30
    assert still_there
    assert not await exists(core, "a")


async def test_kubelet_delay_lets_pods_linger_then_go() -> None:
    async with ApiServer(kubelet_delay=0.2) as server:
        server.seed(running(pod("a")))
        server.registry.delete(kinds.PODS, "default", "a")

        lingering = server.store.get(kinds.PODS.group_resource, "default", "a")
        await asyncio.sleep(0.6)

        assert lingering is not None
        assert lingering["metadata"]["deletionTimestamp"]
        assert server.store.get(kinds.PODS.group_resource, "default", "a") is None


async def test_unbound_pod_and_zero_grace_delete_immediately(
    server: ApiServer, core: client.CoreV1Api
) -> None:
    await core.create_namespaced_pod("default", pod("unbound", node=None))
    server.seed(running(pod("forced")))

    await core.delete_namespaced_pod("unbound", "default")
    await core.delete_namespaced_pod("forced", "default", grace_period_seconds=0)

    assert not await exists(core, "unbound")
    assert not await exists(core, "forced")


async def test_terminating_pod_with_finalizer_stays_until_finalizer_clears(
    server: ApiServer, core: client.CoreV1Api
) -> None:
    body = running(pod("a"))
    body["metadata"]["finalizers"] = [FINALIZER]
    server.seed(body)

    await core.delete_namespaced_pod("a", "default")
    server.complete_pod_termination("default", "a")
    held = await exists(core, "a")
    await core.patch_namespaced_pod("a", "default", {"metadata": {"finalizers": None}})

    assert held
    assert not await exists(core, "a")


async def test_delete_preconditions_that_do_not_match_are_409(
    core: client.CoreV1Api, raw: RawApi
) -> None:
    created = await core.create_node(node("node-1"))
    await core.patch_node("node-1", {"metadata": {"labels": {"a": "1"}}})

    stale_version, body, _ = await raw.request(
        "DELETE",
        "/api/v1/nodes/node-1",
        {"preconditions": {"resourceVersion": created.metadata.resource_version}},
    )
    wrong_uid = await raw.request(
        "DELETE", "/api/v1/nodes/node-1", {"preconditions": {"uid": "someone-else"}}
    )
    matching, _, _ = await raw.request(
        "DELETE", "/api/v1/nodes/node-1", {"preconditions": {"uid": created.metadata.uid}}
    )

    assert stale_version == 409
    assert body["message"].startswith(  # as kube-apiserver words it (the contract suite)
        'Operation cannot be fulfilled on Node "node-1": the ResourceVersion in the precondition'
    )
    assert wrong_uid[0] == 409
    assert matching == 200


async def test_grace_period_query_parameter_is_honoured(
    server: ApiServer, raw: RawApi, core: client.CoreV1Api
) -> None:
    server.seed(running(pod("a")))

    status, body, _ = await raw.request(
        "DELETE", "/api/v1/namespaces/default/pods/a", params={"gracePeriodSeconds": "5"}
    )

    assert status == 200
    assert body["metadata"]["deletionGracePeriodSeconds"] == 5


async def test_namespace_deletion_empties_then_removes_it(
    server: ApiServer, core: client.CoreV1Api
) -> None:
    await core.create_namespace({"metadata": {"name": "team"}})
    await core.create_namespaced_pod("team", pod("a", namespace="team", node=None))

    terminating = await core.delete_namespace("team")

    assert terminating is not None
    with pytest.raises(client.ApiException):
        await core.read_namespace("team")
    with pytest.raises(client.ApiException):
        await core.read_namespaced_pod("a", "team")


async def test_creating_in_a_terminating_namespace_is_403(
    server: ApiServer, core: client.CoreV1Api
) -> None:
    await core.create_namespace({"metadata": {"name": "team"}})
    server.seed(running(pod("a", namespace="team")))
    await core.delete_namespace("team")

    with pytest.raises(client.ApiException) as raised:
        await core.create_namespaced_pod("team", pod("b", namespace="team"))

    assert raised.value.status == 403
    assert json.loads(raised.value.body)["message"] == (
        'pods "b" is forbidden: unable to create new content in namespace team because it is '
        "being terminated"
    )
    server.complete_pod_termination("team", "a")
    with pytest.raises(client.ApiException):
        await core.read_namespace("team")


async def test_dependents_are_collected_with_their_owner(
    server: ApiServer, api: client.ApiClient, core: client.CoreV1Api
) -> None:
    apps = client.AppsV1Api(api)
    daemonset = await apps.create_namespaced_daemon_set(
        "default",
        {
            "metadata": {"name": "driver"},
            "spec": {
                "selector": {"matchLabels": {"app": "driver"}},
                "template": {
                    "metadata": {"labels": {"app": "driver"}},
                    "spec": {"containers": [{"name": "d", "image": "driver:1"}]},
                },
            },
        },
    )
    owned = pod("driver-x", node=None, labels={"app": "driver"})
    owned["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "name": "driver",
            "uid": daemonset.metadata.uid,
        }
    ]
    await core.create_namespaced_pod("default", owned)
    await core.create_namespaced_pod("default", pod("bystander", node=None))

    await apps.delete_namespaced_daemon_set("driver", "default")

    assert not await exists(core, "driver-x")
    assert await exists(core, "bystander")


async def test_orphan_propagation_keeps_dependents(
    api: client.ApiClient, core: client.CoreV1Api
) -> None:
    configmaps = await core.create_namespaced_config_map("default", {"metadata": {"name": "owner"}})
    owned = pod("child", node=None)
    owned["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": configmaps.metadata.uid}
    ]
    await core.create_namespaced_pod("default", owned)

    await core.delete_namespaced_config_map("owner", "default", propagation_policy="Orphan")
    child = await core.read_namespaced_pod("child", "default")

    assert child.metadata.owner_references is None


async def test_eviction_through_the_official_client(
    server: ApiServer, core: client.CoreV1Api
) -> None:
    server.seed(running(pod("a")))

    await core.create_namespaced_pod_eviction(
        "a",
        "default",
        {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": "a", "namespace": "default"},
            "deleteOptions": {"gracePeriodSeconds": 0},
        },
    )

    assert not await exists(core, "a")
