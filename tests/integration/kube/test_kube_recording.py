"""Kubernetes Events recorded on nodes for the operator's actions."""

from __future__ import annotations

from gpuop.clocks import VirtualClock
from gpuop.kube import client, recording
from gpuop.kube.recording import EventRecorder, EventType
from gpuop_sim import ApiServer
from tests.support import kube_objects as support


async def events_about(kube: client.Kube, node: str) -> list[dict[str, object]]:
    listed = await kube.call(
        kube.core.list_namespaced_event,
        "default",
        field_selector=f"involvedObject.kind=Node,involvedObject.name={node}",
    )
    items: list[dict[str, object]] = listed["items"]
    return items


async def test_an_event_is_recorded_on_the_node_as_kubectl_describe_finds_it(
    server: ApiServer, kube: client.Kube
) -> None:
    node = server.seed(support.node("node-1"))
    recorder = EventRecorder(kube, instance="orchestrator-0", clock=VirtualClock())

    await recorder.node_event(
        "node-1",
        recording.upgrade_reason("gpu"),
        "Successfully updated node state label to drain-required",
    )

    [event] = await events_about(kube, "node-1")
    assert event["reason"] == "GPUDriverUpgrade"
    assert event["type"] == "Normal"
    assert event["message"] == "Successfully updated node state label to drain-required"
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": "node-1",
        "uid": node["metadata"]["uid"],
    }
    assert event["reportingComponent"] == "gpuop"
    assert event["reportingInstance"] == "orchestrator-0"
    assert event["source"] == {"component": "gpuop", "host": "orchestrator-0"}
    assert event["count"] == 1
    assert event["firstTimestamp"] == "2026-01-01T00:00:00Z"


async def test_warnings_and_repeated_events_at_the_same_instant_are_all_kept(
    server: ApiServer, kube: client.Kube
) -> None:
    server.seed(support.node("node-1"))
    recorder = EventRecorder(kube, clock=VirtualClock())

    for attempt in range(2):
        await recorder.node_event(
            "node-1",
            "GPUDriverUpgrade",
            f"drain timed out (attempt {attempt})",
            event_type=EventType.WARNING,
            action="Drain",
        )

    events = await events_about(kube, "node-1")
    assert sorted(str(e["message"]) for e in events) == [
        "drain timed out (attempt 0)",
        "drain timed out (attempt 1)",
    ]
    assert {e["type"] for e in events} == {"Warning"}
    assert {e["action"] for e in events} == {"Drain"}


async def test_an_event_about_a_vanished_node_is_still_recorded(kube: client.Kube) -> None:
    recorder = EventRecorder(kube)

    written = await recorder.node_event("gone", "GPUDriverUpgrade", "node left the cluster")

    assert "uid" not in written["involvedObject"]
    assert len(await events_about(kube, "gone")) == 1
