"""The Node condition `GPUHealthy` and the taint `gpuop.io/gpu-unhealthy` on the simulated
API server: the condition goes through the status subresource keeping the kubelet's
conditions, its transition time moves only with its status; taints are added and removed
idempotently, never dropping another, retried on 409; a missing node and a malformed taint
list fail clearly. (The same behaviours against the real kube-apiserver:
tests/integration/kube_contract/test_contract_node_health.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from gpuop.clocks import VirtualClock
from gpuop.kube import client, conditions, errors, nodes
from gpuop.kube.recording import EventRecorder
from gpuop_sim import ApiServer
from tests.support import kube_objects as support

Obj = dict[str, Any]
TAINT = conditions.GPU_UNHEALTHY_TAINT
GPU_A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
GPU_B = "GPU-bbbbbbbb-0000-0000-0000-000000000000"


def writes(server: ApiServer, path: str) -> list[int]:
    return [r.status for r in server.request_log if r.method in ("PATCH", "PUT") and r.path == path]


@pytest.fixture
def clock(kube: client.Kube) -> VirtualClock:
    virtual = VirtualClock()
    kube.clock = virtual
    return virtual


async def test_the_condition_is_set_beside_the_kubelets_and_moves_only_on_a_change(
    server: ApiServer, kube: client.Kube, clock: VirtualClock
) -> None:
    server.seed(support.node("node-1"))
    healthy = conditions.gpu_healthy_condition({})
    sick = conditions.gpu_healthy_condition({GPU_A: (48,)})

    await conditions.set_node_condition(kube, "node-1", conditions.GPU_HEALTHY_CONDITION, *sick)
    clock.advance(60)
    await conditions.set_node_condition(kube, "node-1", conditions.GPU_HEALTHY_CONDITION, *sick)
    first = conditions.condition_of(await nodes.get(kube, "node-1"), "GPUHealthy")
    clock.advance(60)
    await conditions.set_node_condition(kube, "node-1", "GPUHealthy", *healthy)

    node = await nodes.get(kube, "node-1")
    last = conditions.condition_of(node, "GPUHealthy")
    assert [c["type"] for c in node["status"]["conditions"]] == ["GPUHealthy", "Ready"]
    assert first is not None and last is not None
    assert (first["status"], first["reason"]) == ("False", "GPUUnhealthy")
    assert first["message"] == f"1 GPU unhealthy: {GPU_A} (XID 48)"
    assert first["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert first["lastHeartbeatTime"] == "2026-01-01T00:01:00Z"
    assert (last["status"], last["reason"], last["message"]) == (
        "True",
        "GPUsHealthy",
        "all GPUs are healthy",
    )
    assert last["lastTransitionTime"] == last["lastHeartbeatTime"] == "2026-01-01T00:02:00Z"
    assert writes(server, "/api/v1/nodes/node-1/status") == [200, 200, 200]
    assert writes(server, "/api/v1/nodes/node-1") == []


async def test_a_condition_write_that_meets_a_kubelet_heartbeat_is_decided_again(
    server: ApiServer, kube: client.Kube, clock: VirtualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.seed(support.node("node-1"))
    read = nodes.get
    beaten = False

    async def read_then_heartbeat(kube: client.Kube, name: str) -> Obj:
        nonlocal beaten
        node = await read(kube, name)
        if not beaten:
            beaten = True
            heartbeat = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
            await kube.call(
                kube.core.patch_node_status, name, heartbeat,
                _content_type=nodes.STRATEGIC_MERGE_PATCH,
            )  # fmt: skip
        return node

    monkeypatch.setattr(nodes, "get", read_then_heartbeat)

    await conditions.set_node_condition(kube, "node-1", "GPUHealthy", False, "GPUUnhealthy", "x")

    assert writes(server, "/api/v1/nodes/node-1/status") == [200, 409, 200]


async def test_a_condition_on_a_missing_node_names_it(kube: client.Kube) -> None:
    with pytest.raises(errors.NotFound, match="cannot set condition GPUHealthy on node gone"):
        await conditions.set_node_condition(kube, "gone", "GPUHealthy", True, "GPUsHealthy", "")


async def test_a_taint_is_added_once_beside_the_others_and_removed_alone(
    server: ApiServer, kube: client.Kube
) -> None:
    node = support.node("node-1")
    node["spec"]["taints"] = [{"key": "example.com/other", "effect": "NoExecute"}]
    server.seed(node)

    await conditions.add_taint(kube, "node-1", TAINT, "xid-48", "NoSchedule")
    await conditions.add_taint(kube, "node-1", TAINT, "xid-48", "NoSchedule")
    added = nodes.taints_of(await nodes.get(kube, "node-1"))
    await conditions.remove_taint(kube, "node-1", TAINT)
    await conditions.remove_taint(kube, "node-1", TAINT)

    assert added == [
        {"key": "example.com/other", "effect": "NoExecute"},
        {"key": TAINT, "value": "xid-48", "effect": "NoSchedule"},
    ]
    assert nodes.taints_of(await nodes.get(kube, "node-1")) == [
        {"key": "example.com/other", "effect": "NoExecute"}
    ]
    assert writes(server, "/api/v1/nodes/node-1") == [200, 200]


async def test_a_taint_of_another_value_is_replaced_not_doubled(
    server: ApiServer, kube: client.Kube
) -> None:
    server.seed(support.node("node-1"))

    await conditions.add_taint(kube, "node-1", TAINT, "xid-48", "NoSchedule")
    await conditions.add_taint(kube, "node-1", TAINT, "xid-79", "NoSchedule")

    assert nodes.taints_of(await nodes.get(kube, "node-1")) == [
        {"key": TAINT, "value": "xid-79", "effect": "NoSchedule"}
    ]


async def test_a_taint_added_by_someone_else_meanwhile_is_kept(
    server: ApiServer, kube: client.Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.seed(support.node("node-1"))
    read = nodes.get
    raced = False

    async def read_then_taint(kube: client.Kube, name: str) -> Obj:
        nonlocal raced
        node = await read(kube, name)
        if not raced:
            raced = True
            await nodes.taint(kube, name, "example.com/admin")
        return node

    monkeypatch.setattr(nodes, "get", read_then_taint)

    await conditions.add_taint(kube, "node-1", TAINT, "", "NoSchedule")

    keys = [t["key"] for t in nodes.taints_of(await read(kube, "node-1"))]
    assert keys == ["example.com/admin", TAINT]
    assert writes(server, "/api/v1/nodes/node-1") == [200, 409, 200]


async def test_a_malformed_taint_list_is_refused_and_left_as_it_is(
    server: ApiServer, kube: client.Kube
) -> None:
    node = support.node("node-1")
    node["spec"]["taints"] = [{"key": "ok", "effect": "NoSchedule"}, "not-a-taint"]
    server.seed(node)

    with pytest.raises(errors.Invalid, match=r"node node-1 .* spec\.taints\[1\] is not a taint"):
        await conditions.add_taint(kube, "node-1", TAINT, "", "NoSchedule")
    with pytest.raises(errors.Invalid, match=r"spec\.taints\[1\]"):
        await conditions.remove_taint(kube, "node-1", TAINT)

    assert writes(server, "/api/v1/nodes/node-1") == []


async def test_taints_on_a_missing_node_name_it(kube: client.Kube) -> None:
    with pytest.raises(errors.NotFound, match=f"cannot add taint {TAINT}:NoSchedule on node gone"):
        await conditions.add_taint(kube, "gone", TAINT, "", "NoSchedule")
    with pytest.raises(errors.NotFound, match="node gone: the node does not exist"):
        await conditions.remove_taint(kube, "gone", TAINT)


async def test_an_unknown_effect_is_refused_before_any_request(
    server: ApiServer, kube: client.Kube
) -> None:
    with pytest.raises(ValueError, match="taint effect 'NoWay'"):
        await conditions.add_taint(kube, "node-1", TAINT, "", "NoWay")

    assert server.request_log == [] or all(r.method == "GET" for r in server.request_log)


def test_the_condition_message_names_the_gpus_and_xids_in_a_fixed_order() -> None:
    status, reason, message = conditions.gpu_healthy_condition(
        {GPU_B: (79,), GPU_A: (48, 63, 48), "GPU-c": ()}
    )

    assert (status, reason) == (False, "GPUUnhealthy")
    assert message == (f"3 GPUs unhealthy: {GPU_A} (XID 48, 63); {GPU_B} (XID 79); GPU-c (no XID)")


def test_a_message_for_many_gpus_is_cut_and_counts_the_rest() -> None:
    many = {f"GPU-{i:04d}-{'x' * 36}": (48,) for i in range(64)}

    _, _, message = conditions.gpu_healthy_condition(many)

    assert len(message) <= conditions.MAX_MESSAGE
    assert message.startswith("64 GPUs unhealthy: GPU-0000-")
    assert message.endswith(" more")


async def test_a_health_change_is_recorded_as_an_event_on_the_node(
    server: ApiServer, kube: client.Kube, clock: VirtualClock
) -> None:
    server.seed(support.node("node-1"))
    recorder = EventRecorder(kube, instance="orchestrator-0", clock=clock)

    sick = await conditions.record_gpu_health(
        recorder, "node-1", *conditions.gpu_healthy_condition({GPU_A: (79,)})
    )
    clock.advance(1)
    well = await conditions.record_gpu_health(
        recorder, "node-1", *conditions.gpu_healthy_condition({})
    )

    assert (sick["type"], sick["reason"], sick["message"]) == (
        "Warning",
        "GPUUnhealthy",
        f"1 GPU unhealthy: {GPU_A} (XID 79)",
    )
    assert sick["involvedObject"]["name"] == "node-1" and sick["involvedObject"]["uid"]
    assert (well["type"], well["reason"]) == ("Normal", "GPUsHealthy")


async def test_an_event_the_server_refuses_fails_as_a_kube_error(
    server: ApiServer, kube: client.Kube, clock: VirtualClock
) -> None:
    recorder = EventRecorder(kube, namespace="no-such-namespace", clock=clock)

    with pytest.raises(errors.KubeError):
        await conditions.record_gpu_health(recorder, "node-1", False, "GPUUnhealthy", "x")


async def test_conflicts_that_never_end_raise_conflict_after_the_attempts(
    server: ApiServer, kube: client.Kube, clock: VirtualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.seed(support.node("node-1"))
    read = nodes.get

    async def read_then_interfere(kube: client.Kube, name: str) -> Obj:
        node = await read(kube, name)
        server.seed({**node, "metadata": {**node["metadata"], "labels": {"touched": "yes"}}})
        return node

    monkeypatch.setattr(nodes, "get", read_then_interfere)

    with pytest.raises(errors.Conflict):
        await conditions.set_node_condition(kube, "node-1", "GPUHealthy", True, "GPUsHealthy", "")
    with pytest.raises(errors.Conflict):
        await conditions.add_taint(kube, "node-1", TAINT, "", "NoSchedule")

    attempts = nodes.CONFLICT_ATTEMPTS
    assert writes(server, "/api/v1/nodes/node-1/status") == [409] * attempts
    assert writes(server, "/api/v1/nodes/node-1") == [409] * attempts
