"""Label and field selectors, paging with limit/continue, and versioned lists."""

from __future__ import annotations

import json

import pytest
from kubernetes.aio import client

from gpuop_sim import ApiServer
from tests.integration.sim.support import RawApi, node, pod, running

PODS = "/api/v1/namespaces/default/pods"


@pytest.fixture
async def labelled_pods(core: client.CoreV1Api) -> None:
    await core.create_namespaced_pod("default", pod("gpu-a", labels={"app": "gpu", "tier": "1"}))
    await core.create_namespaced_pod("default", pod("gpu-b", labels={"app": "gpu", "tier": "2"}))
    await core.create_namespaced_pod("default", pod("net", labels={"app": "net"}))
    await core.create_namespaced_pod("default", pod("bare", node="node-2"))


@pytest.mark.parametrize(
    ("selector", "names"),
    [
        ("app=gpu", ["gpu-a", "gpu-b"]),
        ("app==gpu", ["gpu-a", "gpu-b"]),
        ("app!=gpu", ["bare", "net"]),
        ("app in (gpu, net)", ["gpu-a", "gpu-b", "net"]),
        ("app notin (gpu)", ["bare", "net"]),
        ("tier", ["gpu-a", "gpu-b"]),
        ("!tier", ["bare", "net"]),
        ("app=gpu,tier in (2)", ["gpu-b"]),
        ("tier>1", ["gpu-b"]),
        ("", ["bare", "gpu-a", "gpu-b", "net"]),
    ],
)
async def test_label_selector_operators(
    core: client.CoreV1Api, labelled_pods: None, selector: str, names: list[str]
) -> None:
    listed = await core.list_namespaced_pod("default", label_selector=selector)
    assert [item.metadata.name for item in listed.items] == names


async def test_malformed_label_selector_is_400(raw: RawApi) -> None:
    status, body, _ = await raw.request("GET", PODS, params={"labelSelector": "app in gpu"})
    assert (status, body["reason"]) == (400, "BadRequest")


async def test_field_selectors_on_pods(
    server: ApiServer, core: client.CoreV1Api, labelled_pods: None
) -> None:
    server.seed(running(pod("runner", node="node-2")))

    on_node_2 = await core.list_namespaced_pod("default", field_selector="spec.nodeName=node-2")
    not_running = await core.list_namespaced_pod(
        "default", field_selector="status.phase!=Running,metadata.name!=net"
    )
    everywhere = await core.list_pod_for_all_namespaces(field_selector="metadata.namespace=default")

    assert [p.metadata.name for p in on_node_2.items] == ["bare", "runner"]
    assert [p.metadata.name for p in not_running.items] == ["bare", "gpu-a", "gpu-b"]
    assert len(everywhere.items) == 5


async def test_field_selector_on_node_unschedulable(core: client.CoreV1Api) -> None:
    await core.create_node(node("node-1"))
    await core.create_node(node("node-2"))
    await core.patch_node("node-2", {"spec": {"unschedulable": True}})

    cordoned = await core.list_node(field_selector="spec.unschedulable=true")
    schedulable = await core.list_node(field_selector="spec.unschedulable=false")

    assert [n.metadata.name for n in cordoned.items] == ["node-2"]
    assert [n.metadata.name for n in schedulable.items] == ["node-1"]


async def test_unsupported_field_label_is_400(core: client.CoreV1Api) -> None:
    with pytest.raises(client.ApiException) as raised:
        await core.list_node(field_selector="spec.nodeName=x")
    assert raised.value.status == 400
    assert json.loads(raised.value.body)["message"] == "field label not supported: spec.nodeName"


async def test_limit_and_continue_page_a_consistent_snapshot(
    server: ApiServer, core: client.CoreV1Api
) -> None:
    for index in range(5):
        await core.create_node(node(f"node-{index}"))

    first = await core.list_node(limit=2)
    await core.delete_node("node-3")
    await core.create_node(node("node-9"))
    second = await core.list_node(limit=2, _continue=first.metadata._continue)
    third = await core.list_node(limit=2, _continue=second.metadata._continue)

    assert [n.metadata.name for n in first.items] == ["node-0", "node-1"]
    assert first.metadata.remaining_item_count == 3
    # Later pages show the cluster as it was when the first page was read.
    assert [n.metadata.name for n in second.items] == ["node-2", "node-3"]
    assert [n.metadata.name for n in third.items] == ["node-4"]
    assert third.metadata._continue is None
    assert third.metadata.resource_version == first.metadata.resource_version


async def test_expired_continue_token_is_http_410(
    server: ApiServer, core: client.CoreV1Api, raw: RawApi
) -> None:
    for index in range(3):
        await core.create_node(node(f"node-{index}"))
    first = await core.list_node(limit=1)
    await core.create_node(node("node-9"))
    server.compact()

    status, body, _ = await raw.request(
        "GET", "/api/v1/nodes", params={"limit": "1", "continue": first.metadata._continue}
    )

    assert (status, body["reason"], body["code"]) == (410, "Expired", 410)
    assert body["message"].startswith("The provided continue parameter is too old")


async def test_exact_resource_version_lists_the_past(core: client.CoreV1Api) -> None:
    first = await core.create_node(node("node-1"))
    await core.create_node(node("node-2"))

    then = await core.list_node(
        resource_version=first.metadata.resource_version, resource_version_match="Exact"
    )

    assert [n.metadata.name for n in then.items] == ["node-1"]
    assert then.metadata.resource_version == first.metadata.resource_version


async def test_cluster_wide_pod_list_spans_namespaces(core: client.CoreV1Api) -> None:
    await core.create_namespace({"metadata": {"name": "gpu-operator"}})
    await core.create_namespaced_pod("gpu-operator", pod("a", namespace="gpu-operator"))
    await core.create_namespaced_pod("default", pod("b"))

    listed = await core.list_pod_for_all_namespaces()

    assert [(p.metadata.namespace, p.metadata.name) for p in listed.items] == [
        ("default", "b"),
        ("gpu-operator", "a"),
    ]
