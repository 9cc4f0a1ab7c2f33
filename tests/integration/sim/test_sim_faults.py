"""The fault plan in the running server: faulted requests are answered before they run and
logged like any other, health checks are never faulted, and dropped watches end cleanly
where a resumed watch picks up every change."""

from __future__ import annotations

import asyncio
import json
import time

from gpuop_sim import ApiServer
from gpuop_sim.apiserver import kinds
from gpuop_sim.apiserver.faults import FaultPlan
from tests.integration.sim.support import RawApi, pod, watch_opened

PODS = "/api/v1/namespaces/default/pods"


async def test_a_faulted_write_is_logged_with_its_status_and_has_no_effect(
    server: ApiServer, raw: RawApi
) -> None:
    server.faults.error_rate = 1.0
    failed, status, _ = await raw.request("POST", PODS, pod("a"))
    server.faults.error_rate, server.faults.throttle_rate = 0.0, 1.0
    throttled, _, headers = await raw.request("POST", PODS, pod("a"))
    server.faults.off()
    listed, pods, _ = await raw.request("GET", PODS)
    created, _, _ = await raw.request("POST", PODS, pod("a"))

    assert (failed, status["reason"]) == (500, "InternalError")
    assert (throttled, headers["Retry-After"]) == (429, "1")
    assert (listed, pods["items"]) == (200, [])  # neither faulted create ran
    assert created == 201
    assert [(r.method, r.status) for r in server.request_log if r.path == PODS] == [
        ("POST", 500),
        ("POST", 429),
        ("GET", 200),
        ("POST", 201),
    ]
    assert server.faults.injected == {500: 1, 429: 1}


async def test_health_checks_are_never_faulted(server: ApiServer, raw: RawApi) -> None:
    server.faults.error_rate = 1.0

    async with raw.session.get(server.url + "/healthz") as health:
        healthy = health.status
    status, _, _ = await raw.request("GET", "/api/v1/nodes")

    assert (healthy, status) == (200, 500)


async def test_a_faulted_watch_is_refused_before_it_streams(server: ApiServer, raw: RawApi) -> None:
    server.faults.throttle_rate = 1.0

    status, body, _ = await raw.request("GET", PODS, params={"watch": "1"})

    assert (status, body["reason"]) == (429, "TooManyRequests")
    assert server.store.watch_count(kinds.PODS.group_resource) == 0


async def test_a_dropped_watch_ends_cleanly_and_resuming_misses_nothing(
    server: ApiServer, raw: RawApi
) -> None:
    streaming = asyncio.create_task(raw.watch(PODS, {"watch": "1", "timeoutSeconds": "30"}))
    await watch_opened(server, kinds.PODS.group_resource)
    await raw.request("POST", PODS, pod("a"))
    started = time.monotonic()
    server.faults.watch_drop_seconds = 0.2  # reaches the watch already open
    first = await asyncio.wait_for(streaming, 10)  # ends without an error: a clean EOF
    lasted = time.monotonic() - started
    server.faults.off()
    await raw.request("POST", PODS, pod("b"))  # while nobody watches
    last_seen = first[-1]["object"]["metadata"]["resourceVersion"]
    resumed = await raw.watch(PODS, {"watch": "1", "resourceVersion": last_seen}, count=1)

    assert [(e["type"], e["object"]["metadata"]["name"]) for e in first] == [("ADDED", "a")]
    assert lasted < 10
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in resumed] == [("ADDED", "b")]
    assert server.faults.watches_dropped == 1


async def test_the_server_takes_its_fault_plan_at_construction() -> None:
    plan = FaultPlan(error_rate=1.0)

    async with (
        ApiServer(faults=plan) as server,
        RawApi(server.url, server.token, server.ssl_context()) as raw,
    ):
        status, _, _ = await raw.request("GET", "/api/v1/nodes")

    assert server.faults is plan
    assert status == 500
    assert plan.injected == {500: 1}


async def test_a_watch_ended_just_as_its_client_leaves_is_no_server_error(
    server: ApiServer, raw: RawApi
) -> None:
    """Ending a stream writes its last chunk to a connection the client may be closing at
    that moment; with watches dropped every few seconds that moment comes (the autouse
    `no_server_errors` fixture fails the test on the server's error log)."""
    headers = {"Authorization": f"Bearer {server.token}"}
    for yields in range(12):
        response = await raw.session.get(server.url + PODS, params={"watch": "1"}, headers=headers)
        await watch_opened(server, kinds.PODS.group_resource)
        response.close()
        for _ in range(yields % 6):
            await asyncio.sleep(0)
        server.store.close_watchers()  # as a dropped watch ends
        async with asyncio.timeout(5):
            while server.store.watch_count(kinds.PODS.group_resource):
                await asyncio.sleep(0.005)


async def test_a_bookmark_never_claims_a_change_still_to_be_sent() -> None:
    """A client resumes from its last BOOKMARK's version: one sent while a change of the
    watched resource still waited in the stream's queue would make a client that lost the
    connection right after it (a dropped watch) skip that change. A BOOKMARK every turn of
    the stream makes that moment certain."""
    async with (
        ApiServer(bookmark_interval=0.0) as server,
        RawApi(server.url, server.token, server.ssl_context()) as raw,
    ):
        headers = {"Authorization": f"Bearer {server.token}"}
        params = {"watch": "1", "allowWatchBookmarks": "true"}
        events = []
        async with raw.session.get(server.url + PODS, params=params, headers=headers) as response:
            async with asyncio.timeout(5):
                async for line in response.content:
                    events.append(json.loads(line))
                    if len(events) == 1:  # bookmarks flow: now a change comes
                        created = server.seed(pod("a"))
                    if events[-1]["type"] == "ADDED":
                        break

    version = int(created["metadata"]["resourceVersion"])
    assert {e["type"] for e in events[:-1]} == {"BOOKMARK"}
    assert max(int(e["object"]["metadata"]["resourceVersion"]) for e in events[:-1]) < version
