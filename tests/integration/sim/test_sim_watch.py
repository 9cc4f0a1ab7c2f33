"""Watch: where streams start, 410 in-stream, bookmarks, streaming lists, filters, timeouts."""

from __future__ import annotations

import asyncio
import time

import pytest
from kubernetes.aio import client, watch

from gpuop_sim import ApiServer
from gpuop_sim.apiserver import kinds
from tests.integration.sim.support import RawApi, node, pod, watch_opened

PODS = "/api/v1/namespaces/default/pods"


async def test_watch_sends_current_state_then_live_changes(
    server: ApiServer, core: client.CoreV1Api
) -> None:
    await core.create_namespaced_pod("default", pod("a"))
    seen: list[tuple[str, str]] = []

    async with watch.Watch() as stream:
        async for event in stream.stream(core.list_namespaced_pod, "default", timeout_seconds=5):
            seen.append((event["type"], event["object"].metadata.name))
            if len(seen) == 1:
                await core.patch_namespaced_pod(
                    "a", "default", {"metadata": {"labels": {"x": "1"}}}
                )
                await core.create_namespaced_pod("default", pod("b"))
                await core.delete_namespaced_pod("b", "default", grace_period_seconds=0)
            if len(seen) == 4:
                break

    assert seen == [("ADDED", "a"), ("MODIFIED", "a"), ("ADDED", "b"), ("DELETED", "b")]
    assert any("watch=" in record.query for record in server.request_log)


@pytest.mark.parametrize(
    ("value", "watches"),
    [("True", True), ("1", True), ("yes", True), ("0", False), ("false", False), ("False", False)],
)
async def test_boolean_query_values_other_than_0_and_false_are_true(
    core: client.CoreV1Api, raw: RawApi, value: str, watches: bool
) -> None:
    await core.create_namespaced_pod("default", pod("a"))
    if watches:
        events = await raw.watch(PODS, {"watch": value}, count=1)
        assert events[0]["type"] == "ADDED"
    else:
        status, body, _ = await raw.request("GET", PODS, params={"watch": value})
        assert (status, body["kind"]) == (200, "PodList")


async def test_watch_from_a_resource_version_replays_later_changes(
    core: client.CoreV1Api, raw: RawApi
) -> None:
    first = await core.create_namespaced_pod("default", pod("a"))
    await core.create_namespaced_pod("default", pod("b"))

    events = await raw.watch(
        PODS, {"watch": "1", "resourceVersion": first.metadata.resource_version}, count=1
    )

    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "b")]


async def test_watch_from_a_compacted_version_gets_one_in_stream_410(
    server: ApiServer, core: client.CoreV1Api, raw: RawApi
) -> None:
    first = await core.create_namespaced_pod("default", pod("a"))
    await core.create_namespaced_pod("default", pod("b"))
    server.compact()
    oldest = server.store.resource_version
    stale = first.metadata.resource_version

    events = await raw.watch(PODS, {"watch": "true", "resourceVersion": stale})

    assert events == [
        {
            "type": "ERROR",
            "object": {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": f"too old resource version: {stale} ({oldest})",
                "reason": "Expired",
                "code": 410,
            },
        }
    ]


async def test_official_client_raises_410_after_compaction(
    server: ApiServer, core: client.CoreV1Api
) -> None:
    first = await core.create_namespaced_pod("default", pod("a"))
    await core.create_namespaced_pod("default", pod("b"))
    server.compact()

    with pytest.raises(client.ApiException) as raised:
        async with watch.Watch() as stream:
            async for _ in stream.stream(
                core.list_namespaced_pod,
                "default",
                resource_version=first.metadata.resource_version,
                timeout_seconds=2,
            ):
                pass

    assert raised.value.status == 410


async def test_bookmarks_carry_only_kind_api_version_and_resource_version(
    server: ApiServer, raw: RawApi
) -> None:
    events = await raw.watch(
        PODS, {"watch": "1", "allowWatchBookmarks": "true", "timeoutSeconds": "1"}
    )

    bookmarks = [e for e in events if e["type"] == "BOOKMARK"]
    assert bookmarks
    assert bookmarks[-1]["object"] == {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": str(server.store.resource_version)},
    }


async def test_streaming_list_sends_state_then_annotated_bookmark(
    core: client.CoreV1Api, raw: RawApi
) -> None:
    await core.create_namespaced_pod("default", pod("a"))
    await core.create_namespaced_pod("default", pod("b"))

    events = await raw.watch(
        PODS,
        {
            "watch": "1",
            "sendInitialEvents": "true",
            "resourceVersionMatch": "NotOlderThan",
            "allowWatchBookmarks": "true",
        },
        count=3,
    )

    assert [e["type"] for e in events] == ["ADDED", "ADDED", "BOOKMARK"]
    assert events[2]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


async def test_send_initial_events_needs_not_older_than_and_is_refused_on_lists(
    raw: RawApi,
) -> None:
    watch_status, watch_body, _ = await raw.request(
        "GET", PODS, params={"watch": "1", "sendInitialEvents": "true", "allowWatchBookmarks": "1"}
    )
    list_status, list_body, _ = await raw.request("GET", PODS, params={"sendInitialEvents": "true"})

    assert (watch_status, watch_body["reason"]) == (422, "Invalid")
    assert watch_body["details"]["causes"][0]["field"] == "resourceVersionMatch"
    assert (list_status, list_body["reason"]) == (422, "Invalid")
    assert list_body["message"] == (
        'ListOptions.meta.k8s.io "" is invalid: sendInitialEvents: Forbidden: '
        "sendInitialEvents is forbidden for list"
    )


async def test_timeout_seconds_ends_the_stream_cleanly(raw: RawApi) -> None:
    started = time.monotonic()

    events = await raw.watch(PODS, {"watch": "1", "timeoutSeconds": "1"})

    assert events == []
    assert 0.9 <= time.monotonic() - started < 3


async def test_filtered_watch_turns_matching_transitions_into_added_and_deleted(
    server: ApiServer, core: client.CoreV1Api, raw: RawApi
) -> None:
    await core.create_namespaced_pod("default", pod("a"))
    stream = asyncio.create_task(
        raw.watch(PODS, {"watch": "1", "labelSelector": "app=gpu", "timeoutSeconds": "2"}, count=3)
    )
    await watch_opened(server, kinds.PODS.group_resource)

    labelled = await core.patch_namespaced_pod(
        "a", "default", {"metadata": {"labels": {"app": "gpu"}}}
    )
    await core.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"tier": "1"}}})
    unlabelled = await core.patch_namespaced_pod(
        "a", "default", {"metadata": {"labels": {"app": None}}}
    )
    events = await stream

    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    assert events[0]["object"]["metadata"]["resourceVersion"] == labelled.metadata.resource_version
    # DELETED carries the last matching content at the version that made it stop matching.
    assert events[2]["object"]["metadata"]["labels"] == {"app": "gpu", "tier": "1"}
    assert events[2]["object"]["metadata"]["resourceVersion"] == (
        unlabelled.metadata.resource_version
    )


async def test_watch_started_at_list_version_sees_every_later_write_once(
    server: ApiServer, core: client.CoreV1Api, raw: RawApi
) -> None:
    listed = await core.list_node()
    stream = asyncio.create_task(
        raw.watch(
            "/api/v1/nodes",
            {"watch": "1", "resourceVersion": listed.metadata.resource_version},
            count=20,
        )
    )
    for index in range(20):
        server.seed(node(f"node-{index}"))
    events = await stream

    assert [e["object"]["metadata"]["name"] for e in events] == [f"node-{i}" for i in range(20)]


async def test_node_watch_with_field_selector_sees_cordon(
    server: ApiServer, core: client.CoreV1Api, raw: RawApi
) -> None:
    await core.create_node(node("node-1"))
    stream = asyncio.create_task(
        raw.watch(
            "/api/v1/nodes",
            {"watch": "1", "fieldSelector": "spec.unschedulable=true", "timeoutSeconds": "2"},
            count=1,
        )
    )
    await watch_opened(server, kinds.NODES.group_resource)

    await core.patch_node("node-1", {"spec": {"unschedulable": True}})
    events = await stream

    assert events[0]["type"] == "ADDED"
    assert events[0]["object"]["spec"]["unschedulable"] is True


async def test_resource_version_zero_starts_from_current_state(
    core: client.CoreV1Api, raw: RawApi
) -> None:
    await core.create_namespaced_pod("default", pod("a"))

    events = await raw.watch(PODS, {"watch": "1", "resourceVersion": "0"}, count=1)

    assert (events[0]["type"], events[0]["object"]["metadata"]["name"]) == ("ADDED", "a")


async def test_watch_abandoned_by_its_client_is_unregistered(
    server: ApiServer, core: client.CoreV1Api
) -> None:
    await core.create_namespaced_pod("default", pod("a"))
    async with watch.Watch() as stream:
        async for _ in stream.stream(core.list_namespaced_pod, "default"):
            assert server.store.watch_count(kinds.PODS.group_resource) == 1
            break

    for _ in range(100):
        if server.store.watch_count(kinds.PODS.group_resource) == 0:
            break
        await asyncio.sleep(0.01)
    assert server.store.watch_count(kinds.PODS.group_resource) == 0


async def test_server_shutdown_ends_open_watches() -> None:
    async with ApiServer() as server, RawApi(server.url, server.token, server.ssl_context()) as raw:
        stream = asyncio.create_task(raw.watch(PODS, {"watch": "1"}))
        while server.store.watch_count(kinds.PODS.group_resource) == 0:
            await asyncio.sleep(0.01)
        await server.stop()
        assert await asyncio.wait_for(stream, 5) == []
