"""List+watch: the initial list, live changes, resume after a disconnect, bookmarks, and a
relist after 410 that loses no change."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import parse_qs

import pytest

from gpuop.clocks import VirtualClock
from gpuop.kube import client, errors, nodes, watching
from gpuop.kube.watching import ListWatch, WatchEvent
from gpuop_sim import ApiServer
from gpuop_sim.apiserver import kinds
from tests.support import kube_objects as support


async def take(watch: ListWatch, count: int) -> list[WatchEvent]:
    return [await asyncio.wait_for(anext(watch), 5) for _ in range(count)]


def summary(events: list[WatchEvent]) -> set[tuple[str, str, bool]]:
    return {(e.type, e.object["metadata"]["name"], e.resync) for e in events}


def watch_queries(server: ApiServer, path: str) -> list[dict[str, list[str]]]:
    return [
        parse_qs(record.query)
        for record in server.request_log
        if record.path == path and "watch=" in record.query
    ]


async def create_pod(kube: client.Kube, name: str, labels: dict[str, str] | None = None) -> None:
    body = support.pod(name, node=None, labels=labels)
    del body["status"]
    await kube.call(kube.core.create_namespaced_pod, "default", body)


async def label_pod(kube: client.Kube, name: str, labels: dict[str, str | None]) -> None:
    await kube.call(
        kube.core.patch_namespaced_pod, name, "default", {"metadata": {"labels": labels}}
    )


async def delete_pod(kube: client.Kube, name: str) -> None:
    await kube.call(kube.core.delete_namespaced_pod, name, "default")


async def test_starts_with_the_list_as_added_then_streams_live_changes(
    server: ApiServer, kube: client.Kube
) -> None:
    server.seed(support.node("node-1"))
    server.seed(support.node("node-2"))

    async with ListWatch(kube, kube.core.list_node) as watch:
        initial = await take(watch, 2)
        await nodes.set_labels(kube, "node-1", {"state": "cordon-required"})
        modified = await take(watch, 1)

    assert summary(initial) == {("ADDED", "node-1", False), ("ADDED", "node-2", False)}
    assert all(e.object["kind"] == "Node" for e in initial)
    assert modified[0].type == "MODIFIED"
    assert modified[0].object["metadata"]["labels"] == {"state": "cordon-required"}
    assert watch.objects[("", "node-1")]["metadata"]["labels"] == {"state": "cordon-required"}


async def test_a_410_relists_and_emits_every_change_missed_meanwhile(
    server: ApiServer, kube: client.Kube
) -> None:
    for name in ("gone", "changed", "same"):
        server.seed(support.pod(name, node=None))

    async with ListWatch(kube, kube.core.list_namespaced_pod, "default") as watch:
        await take(watch, 3)
        await create_pod(kube, "live")
        assert summary(await take(watch, 1)) == {("ADDED", "live", False)}
        # The server ends the watch; changes happen while nobody watches, then the
        # history is compacted, so resuming from the last version gets 410 Expired.
        server.store.close_watchers()
        await delete_pod(kube, "gone")
        await label_pod(kube, "changed", {"v": "2"})
        await create_pod(kube, "new")
        server.compact()

        resynced = await take(watch, 3)
        await create_pod(kube, "after")
        after = await take(watch, 1)

    assert summary(resynced) == {
        ("DELETED", "gone", True),
        ("MODIFIED", "changed", True),
        ("ADDED", "new", True),
    }
    assert summary(after) == {("ADDED", "after", False)}
    listed = await kube.call(kube.core.list_namespaced_pod, "default")
    assert {key[1]: obj["metadata"]["resourceVersion"] for key, obj in watch.objects.items()} == {
        item["metadata"]["name"]: item["metadata"]["resourceVersion"] for item in listed["items"]
    }


async def test_a_disconnect_resumes_from_the_last_version_without_relisting(
    server: ApiServer, kube: client.Kube
) -> None:
    server.seed(support.pod("a", node=None))

    async with ListWatch(kube, kube.core.list_namespaced_pod, "default") as watch:
        await take(watch, 1)
        await label_pod(kube, "a", {"v": "1"})
        await take(watch, 1)
        server.store.close_watchers()
        await label_pod(kube, "a", {"v": "2"})

        missed = await take(watch, 1)

    assert missed[0].type == "MODIFIED"
    assert missed[0].resync is False
    assert missed[0].object["metadata"]["labels"] == {"v": "2"}
    lists = [r for r in server.request_log if r.path.endswith("/pods") and "watch=" not in r.query]
    assert len(lists) == 1


async def test_bookmarks_move_the_resume_point_past_unrelated_writes(
    server: ApiServer, kube: client.Kube
) -> None:
    server.seed(support.node("node-1"))

    async with ListWatch(kube, kube.core.list_node) as watch:
        await take(watch, 1)
        await nodes.set_labels(kube, "node-1", {"v": "1"})
        await take(watch, 1)
        for index in range(3):
            await create_pod(kube, f"unrelated-{index}")
        busy_version = server.store.resource_version
        await asyncio.sleep(0.5)  # the server sends BOOKMARKs every 0.2 s
        server.store.close_watchers()
        await nodes.set_labels(kube, "node-1", {"v": "2"})

        modified = await take(watch, 1)

    assert modified[0].object["metadata"]["labels"] == {"v": "2"}
    resumed = watch_queries(server, "/api/v1/nodes")[-1]
    assert int(resumed["resourceVersion"][0]) >= busy_version
    assert resumed["allowWatchBookmarks"] == ["true"]


async def test_selectors_apply_to_the_list_and_the_watch(
    server: ApiServer, kube: client.Kube
) -> None:
    server.seed(support.pod("in", node=None, labels={"app": "gpu"}))
    server.seed(support.pod("out", node=None, labels={"app": "web"}))

    async with ListWatch(
        kube, kube.core.list_namespaced_pod, "default", label_selector="app=gpu"
    ) as watch:
        initial = await take(watch, 1)
        await label_pod(kube, "out", {"app": "gpu"})
        joined = await take(watch, 1)

    assert summary(initial) == {("ADDED", "in", False)}
    assert summary(joined) == {("ADDED", "out", False)}
    assert watch_queries(server, "/api/v1/namespaces/default/pods")[0]["labelSelector"] == [
        "app=gpu"
    ]


async def test_an_unreachable_server_is_retried_with_backoff(
    server: ApiServer, kube: client.Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.seed(support.node("node-1"))
    clock = VirtualClock()
    connect = kube.open
    failures = 2

    async def flaky_open(*args: Any, **kwargs: Any) -> Any:
        nonlocal failures
        if failures:
            failures -= 1
            raise errors.Unreachable("connection refused")
        return await connect(*args, **kwargs)

    monkeypatch.setattr(kube, "open", flaky_open)

    async with ListWatch(kube, kube.core.list_node, retry_delay=1.0, clock=clock) as watch:
        await take(watch, 1)
        await nodes.set_labels(kube, "node-1", {"v": "1"})
        modified = await take(watch, 1)

    assert modified[0].type == "MODIFIED"
    assert clock.monotonic() == 1.0 + 2.0  # backoff doubles


async def test_an_http_410_on_connect_relists_too(
    server: ApiServer, kube: client.Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.seed(support.node("node-1"))
    connect = kube.open
    expired = True

    async def expiring_open(*args: Any, **kwargs: Any) -> Any:
        nonlocal expired
        if expired:
            expired = False
            await nodes.set_labels(kube, "node-1", {"v": "missed"})
            raise errors.from_status(410, {"reason": "Expired", "message": "too old"})
        return await connect(*args, **kwargs)

    monkeypatch.setattr(kube, "open", expiring_open)

    async with ListWatch(kube, kube.core.list_node) as watch:
        await take(watch, 1)
        resynced = await take(watch, 1)

    assert (resynced[0].type, resynced[0].resync) == ("MODIFIED", True)
    assert resynced[0].object["metadata"]["labels"] == {"v": "missed"}
    lists = [r for r in server.request_log if r.path == "/api/v1/nodes" and "watch" not in r.query]
    assert len(lists) == 2


async def test_a_permanent_error_ends_the_iteration(kube: client.Kube) -> None:
    async with ListWatch(
        kube, kube.custom_objects.list_cluster_custom_object, "gpuop.io", "v1alpha1", "absent"
    ) as watch:
        with pytest.raises(errors.NotFound):
            await anext(watch)


async def test_a_closed_watch_stops_iterating(server: ApiServer, kube: client.Kube) -> None:
    server.seed(support.node("node-1"))
    watch = ListWatch(kube, kube.core.list_node)
    await take(watch, 1)

    await watch.close()

    assert [event async for event in watch] == []
    assert watching.object_key({"metadata": {"name": "n"}}) == ("", "n")


async def relabel_node_every(server: ApiServer, values: range, *, compact: bool = False) -> None:
    """Label node-1 `v=<value>` for each value, in process (no request to fault), a few ms
    apart; `compact` drops the watch history after every change."""

    for value in values:
        await asyncio.sleep(0.005)

        def label(node: dict[str, Any], value: int = value) -> None:
            node["metadata"].setdefault("labels", {})["v"] = str(value)

        server.registry.mutate(kinds.NODES, "", "node-1", label)
        if compact:
            server.compact()


async def label_values_until(watch: ListWatch, last: int) -> list[WatchEvent]:
    """The node's events until it carries `v=<last>`."""
    seen: list[WatchEvent] = []
    async with asyncio.timeout(20):
        async for event in watch:
            seen.append(event)
            if event.object["metadata"].get("labels", {}).get("v") == str(last):
                return seen
    raise AssertionError("the watch ended")


def label_values(events: list[WatchEvent]) -> list[int]:
    return [int(e.object["metadata"]["labels"]["v"]) for e in events if e.type == "MODIFIED"]


async def test_dropped_and_refused_watches_resume_without_losing_or_repeating_a_change(
    server: ApiServer, kube: client.Kube
) -> None:
    server.seed(support.node("node-1"))
    faults = server.faults
    faults.watch_drop_seconds, faults.error_rate, faults.throttle_rate = 0.05, 0.2, 0.2
    faults.retry_after = 0.05

    async with ListWatch(kube, kube.core.list_node, retry_delay=0.01) as watch:
        assert [e.type for e in await take(watch, 1)] == ["ADDED"]
        async with asyncio.TaskGroup() as group:
            group.create_task(relabel_node_every(server, range(100)))
            events = await label_values_until(watch, 99)

    assert label_values(events) == list(range(100))
    assert not any(e.resync for e in events)
    assert faults.watches_dropped >= 3
    assert sum(faults.injected.values()) > 0  # some reconnects were refused
    lists = [r for r in server.request_log if r.path == "/api/v1/nodes" and "watch" not in r.query]
    assert [r.status for r in lists if r.status == 200] == [200]  # resumed, never relisted


async def test_a_dropped_watch_whose_history_is_gone_relists_and_converges(
    server: ApiServer, kube: client.Kube
) -> None:
    server.seed(support.node("node-1"))
    server.faults.watch_drop_seconds = 0.03

    async with ListWatch(kube, kube.core.list_node, retry_delay=0.01) as watch:
        await take(watch, 1)
        async with asyncio.TaskGroup() as group:
            group.create_task(relabel_node_every(server, range(100), compact=True))
            events = await label_values_until(watch, 99)

    values = label_values(events)
    assert values == sorted(set(values))  # in order, none twice, though some collapsed
    assert values[-1] == 99
    assert any(e.resync for e in events)
    assert watch.objects[("", "node-1")]["metadata"]["labels"] == {"v": "99"}
