"""The pure parts of the side-by-side benchmark (`vs_upstream.py`): counting a user's
requests in an audit log, the KWOK stages of a run, the ratios and the "vs upstream" table.
No Go, no control plane."""

from __future__ import annotations

import asyncio
import datetime
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.bench import run_all
from tests.bench.vs_upstream import (
    RELOAD_LABEL,
    RELOAD_STAGE,
    SIZES,
    Row,
    Side,
    SlowProxy,
    comparison,
    ratio,
    requests_by_user,
    stage_set,
    table,
    through,
)

T0 = datetime.datetime(2026, 12, 2, 8, 0, 0, tzinfo=datetime.UTC)
T1 = T0 + datetime.timedelta(seconds=60)
USER = "system:serviceaccount:gpu-operator:upstream-upgrade"


def event(user: str, at: str, verb: str, resource: str, sub: str | None = None) -> dict[str, Any]:
    ref: dict[str, str] = {"resource": resource}
    if sub:
        ref["subresource"] = sub
    return {
        "user": {"username": user},
        "requestReceivedTimestamp": at,
        "verb": verb,
        "objectRef": ref,
    }


def test_requests_by_user_counts_one_users_requests_in_the_window_by_verb_and_resource() -> None:
    events = [
        event(USER, "2026-12-02T08:00:10.000001Z", "patch", "nodes"),
        event(USER, "2026-12-02T08:00:20.5Z", "patch", "nodes"),
        event(USER, "2026-12-02T08:00:30Z", "create", "pods", "eviction"),
        event("system:admin", "2026-12-02T08:00:30Z", "patch", "nodes"),  # someone else
        event(USER, "2026-12-02T07:59:59.999999Z", "list", "pods"),  # before the start
        event(USER, "2026-12-02T08:01:00.000001Z", "list", "pods"),  # after the end
        {**event(USER, "2026-12-02T08:00:40Z", "get", ""), "objectRef": None},  # /version
    ]
    counted = requests_by_user(events, USER, T0, T1)
    assert counted == Counter(
        {("patch", "nodes"): 2, ("create", "pods/eviction"): 1, ("get", ""): 1}
    )


def test_requests_by_user_names_an_event_without_user_or_time() -> None:
    broken = {"verb": "get", "requestReceivedTimestamp": "2026-12-02T08:00:10Z"}
    with pytest.raises(ValueError, match="audit event 2 has no user or time"):
        requests_by_user(
            [event(USER, "2026-12-02T08:00:10Z", "get", "nodes"), broken], USER, T0, T1
        )
    with pytest.raises(ValueError, match="audit event 1"):
        requests_by_user([event(USER, "yesterday", "get", "nodes")], USER, T0, T1)


def test_ratio_is_gpuop_over_upstream_and_none_without_both() -> None:
    assert ratio(10.0, 40.0) == 0.25
    assert ratio(1.0, 3.0) == 0.333
    assert ratio(None, 40.0) is None
    assert ratio(10.0, None) is None
    assert ratio(10.0, 0.0) is None


DEFAULTS = {
    "pod-ready.yaml": yaml.safe_dump(
        {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "Stage",
            "metadata": {"name": "pod-ready"},
            "spec": {
                "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
                "selector": {
                    "matchExpressions": [
                        {"key": ".status.phase", "operator": "In", "values": ["Pending"]}
                    ]
                },
                "next": {"statusTemplate": "phase: Running"},
            },
        }
    ),
    "pod-delete.yaml": "kind: Stage\nmetadata: {name: pod-delete}\nspec: {}\n",
}


def expressions(text: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load(text)["spec"]["selector"]["matchExpressions"])


def test_stage_set_keeps_kwoks_pod_ready_off_reloading_pods_and_delays_them() -> None:
    made = stage_set(DEFAULTS, RELOAD_STAGE.read_text(), 5.0, None)
    assert set(made) == {"pod-ready.yaml", "pod-delete.yaml", "driver-reload.yaml"}
    assert made["pod-delete.yaml"] == DEFAULTS["pod-delete.yaml"]
    key = f'.metadata.labels["{RELOAD_LABEL}"]'
    assert {"key": key, "operator": "DoesNotExist"} in expressions(made["pod-ready.yaml"])
    reload = yaml.safe_load(made["driver-reload.yaml"])
    assert reload["spec"]["delay"] == {"durationMilliseconds": 5000}
    assert {"key": key, "operator": "Exists"} in reload["spec"]["selector"]["matchExpressions"]


def test_stage_set_leaves_the_broken_nodes_new_driver_pod_to_no_stage() -> None:
    made = stage_set(DEFAULTS, RELOAD_STAGE.read_text(), 30.0, "gpu-node-1")
    healthy = expressions(made["driver-reload.yaml"])
    assert {"key": ".spec.nodeName", "operator": "NotIn", "values": ["gpu-node-1"]} in healthy
    there = expressions(made["driver-reload-broken-node.yaml"])
    assert {"key": ".spec.nodeName", "operator": "In", "values": ["gpu-node-1"]} in there
    label = f'.metadata.labels["{RELOAD_LABEL}"]'
    assert {"key": label, "operator": "NotIn", "values": ["new"]} in there
    assert (
        yaml.safe_load(made["driver-reload.yaml"])["spec"]["delay"]["durationMilliseconds"] == 30000
    )


def test_stage_set_refuses_defaults_without_pod_ready_and_a_reload_file_that_is_no_stage() -> None:
    with pytest.raises(ValueError, match="pod-ready stage is not among"):
        stage_set(
            {"pod-delete.yaml": DEFAULTS["pod-delete.yaml"]}, RELOAD_STAGE.read_text(), 5, None
        )
    with pytest.raises(ValueError, match="not a KWOK Stage"):
        stage_set(DEFAULTS, "kind: ConfigMap\nspec: {}\n", 5, None)


def test_table_shows_ratios_only_where_they_mean_something() -> None:
    shown = table(
        [
            Row("makespan (s)", 30.0, 120.0),
            Row("healthy nodes done", "19 of 19", "19 of 19", compare=False),
            Row("slow apiserver", None, None),
        ]
    )
    lines = shown.splitlines()
    assert lines[0] == "| figure | gpuop | upstream | gpuop/upstream |"
    assert lines[2] == "| makespan (s) | 30 | 120 | 0.25 |"
    assert lines[3] == "| healthy nodes done | 19 of 19 | 19 of 19 |  |"
    assert lines[4] == "| slow apiserver | not measured | not measured |  |"


def sides(**figures: Any) -> dict[str, Side]:
    gpuop = Side(20, done=20, requests=Counter({("patch", "nodes"): 200}), **figures)
    upstream = Side(20, done=20, requests=Counter({("patch", "nodes"): 800}))
    upstream.makespan, upstream.peak_rss_mb = 120.0, 60.0
    return {"gpuop": gpuop, "upstream": upstream}


def test_comparison_reports_each_ratio_its_target_and_the_table() -> None:
    plain = sides(makespan=30.0, peak_rss_mb=120.0)
    killed = sides(makespan=40.0, moved_after_kill=3.0, in_flight_at_kill=2, in_flight_kept=2)
    killed["upstream"].moved_after_kill = 1.5
    broken = sides(makespan=35.0)
    broken["gpuop"].done = 19
    result = comparison(SIZES[True], "v0.0.0-x", plain, killed, broken)
    assert result["makespan_ratio"] == 0.25
    assert result["api_requests_ratio"] == 0.25
    assert result["peak_memory_ratio"] == 2.0
    assert result["kill_seconds_to_move_gpuop"] == 3.0
    assert result["kill_seconds_to_move_upstream"] == 1.5
    assert result["kill_makespan_ratio"] == round(40 / 120, 3)
    assert result["broken_healthy_done_gpuop"] == "19 of 19"
    assert result["upstream_version"] == "v0.0.0-x"
    assert "| kill: in-flight drains that finished | 2 of 2 |" in result["about"]
    assert "| API requests per upgraded node | 10 | 40 | 0.25 |" in result["about"]
    met = {key: run_all.judged(target, result[key]) for key, target in result["targets"].items()}
    assert met == {"makespan_ratio": True, "api_requests_ratio": True,
                   "kill_seconds_to_move_gpuop": True}  # fmt: skip


def test_comparison_without_the_kill_and_broken_runs_says_not_measured() -> None:
    result = comparison(SIZES[True], "v", sides(makespan=30.0), None, None)
    assert result["kill_seconds_to_move_gpuop"] is None
    assert result["broken_makespan_ratio"] is None
    assert "| kill: makespan (s) | not measured | not measured |  |" in result["about"]
    assert run_all.judged("<= 5", result["kill_seconds_to_move_gpuop"]) is None


def test_comparison_with_the_slow_run_tables_its_ratio_and_says_when_it_was_left_out() -> None:
    plain = sides(makespan=30.0)
    slow = sides(makespan=28.0)
    slow["upstream"].makespan = 160.0
    result = comparison(SIZES[True], "v", plain, None, None, slow)
    assert result["slow_makespan_ratio"] == 0.175
    assert (
        "| slow apiserver (+50 ms a request): makespan (s) | 28 | 160 | 0.175 |"
        in (result["about"])
    )
    assert "left out" not in result["about"]
    without = comparison(SIZES[True], "v", plain, None, None)
    assert without["slow_makespan_ratio"] is None
    assert (
        "The slow apiserver run was left out (quick mode without `--slow`)." in (without["about"])
    )


def test_a_side_with_no_node_done_has_no_requests_per_node() -> None:
    assert Side(20).requests_per_node is None
    assert Side(20, done=4, requests=Counter({("get", "nodes"): 10})).requests_per_node == 2.5


def test_through_points_a_kubeconfig_at_the_proxy_and_keeps_the_rest(tmp_path: Path) -> None:
    original = tmp_path / "a.kubeconfig"
    config = {
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443", "x": 1}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
    }
    original.write_text(yaml.safe_dump(config))
    proxy = SlowProxy(6443, 0.05)
    proxy.port = 7000
    slowed = yaml.safe_load(through(original, proxy).read_text())
    assert slowed["clusters"][0]["cluster"] == {"server": "https://127.0.0.1:7000", "x": 1}
    assert slowed["users"] == config["users"]
    assert yaml.safe_load(original.read_text()) == config


async def test_the_slow_proxy_passes_bytes_both_ways_and_closes_with_the_server() -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(data.upper())
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    async with server, SlowProxy(server.sockets[0].getsockname()[1], 0.01) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"get /version")
        await writer.drain()
        assert await reader.readexactly(12) == b"GET /VERSION"
        writer.write_eof()
        assert await reader.read() == b""
        writer.close()


async def test_the_slow_proxy_drops_a_client_when_the_apiserver_is_gone() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    async with SlowProxy(port, 0.01) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        assert await reader.read() == b""
        writer.close()


async def test_the_slow_proxy_ends_open_connections_when_it_stops() -> None:
    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # a watch: open until the client goes
        writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    async with server:
        async with SlowProxy(server.sockets[0].getsockname()[1], 0.01) as proxy:
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            writer.write(b"watch")
            await writer.drain()
            while not proxy._connections:
                await asyncio.sleep(0.01)
        assert not proxy._connections
        try:  # the client's connection ended: an end of file, or a reset (data left unread)
            ended = await reader.read() == b""
        except ConnectionResetError:
            ended = True
        assert ended
        writer.close()
