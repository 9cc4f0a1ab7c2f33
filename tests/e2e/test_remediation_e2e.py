"""GPU remediation end to end (`stack`, with the operands): a fatal XID on a node under load
ends with that GPU reset and validated, the node's `GPUHealthy` condition True and the
taint gone by the time the remediation is stored done, only the pod holding the GPU
evicted (its other GPU pods, and the other node, untouched); an application XID changes
nothing; the log replays identically.

The fault is published as telemetry publishes it (the simulated NVML of a node's telemetry
process cannot be reached from the test); the pod holding the GPU is the one the simulated
kubelet allocated it to, which the device plugin finds through PodResources.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gpuop.bus import Buckets, NatsServer
from gpuop.events import device as dev
from gpuop.events import hardware, new_event, subjects
from gpuop.events import remediation_commands as remedies
from gpuop.events.remediation import NodeRemediationStateChanged, RemediationState
from gpuop.kube import conditions, nodes, pods
from gpuop.saga import replaying
from gpuop.saga.remediation.records import RemediationSaga
from gpuop.services.upgrade_orchestrator.remediations import REMEDIATION as REMEDIATION_KIND
from gpuop.services.upgrade_orchestrator.store import SagaStore
from gpuop_sim.host import simreset
from tests.support.rollouts import log_of
from tests.support.stack import OLD, Stack, stack

pytestmark = [pytest.mark.nats, pytest.mark.slow]

R = RemediationState
POLICY: dict[str, Any] = {
    "maxUnavailable": 1,
    "podDeletion": {"force": True, "deleteEmptyDir": True, "timeoutSeconds": 60},
    "deadlines": {"validation": 30},
}
REMEDIATION = {"deadlines": {"reset": 60, "validation": 60}}


async def gpu_of(running: Stack, node: str) -> str:
    """The first GPU of the node, as discovery reported it."""
    inventories = await running.bus.kv(Buckets.NODES)
    entry = await inventories.get(subjects.encode_node(node))
    assert entry is not None, f"no inventory of {node}"
    found = hardware.HardwareDiscovered.model_validate_json(entry.value)
    return found.gpus[0].uuid


async def publish_fault(
    running: Stack, node: str, gpu: str, xid: int, action: dev.XidAction
) -> None:
    health = dev.DeviceHealthChanged(
        gpu_uuid=gpu, healthy=False, reason=dev.HealthReason.XID, xid=xid, action=action
    )
    await running.bus.publish(new_event(health, node=node, source="/gpuop/telemetry"))


async def marks(running: Stack, node: str) -> tuple[str | None, bool]:
    found = await nodes.get(running.kube, node)
    condition = conditions.condition_of(found, conditions.GPU_HEALTHY_CONDITION) or {}
    tainted = any(t.get("key") == conditions.GPU_UNHEALTHY_TAINT for t in nodes.taints_of(found))
    return condition.get("status"), tainted


async def uids(running: Stack, node: str) -> dict[tuple[str, str], str]:
    return {
        (p["metadata"]["namespace"], p["metadata"]["name"]): p["metadata"]["uid"]
        for p in await pods.gpu_pods_on(running.kube, node)
    }


async def remediation_of(running: Stack, node: str) -> RemediationSaga | None:
    """The node's remediation record as the orchestrator stored it."""
    store = SagaStore(await running.bus.kv(Buckets.SAGAS), REMEDIATION_KIND)
    stored = await store.get(node)
    return None if stored is None else stored.saga


def moves(log: list[replaying.Recorded], node: str) -> list[R]:
    return [
        entry.payload.to_state
        for entry in log
        if isinstance(entry.payload, NodeRemediationStateChanged) and entry.envelope.node == node
    ]


@pytest.mark.timeout(480)
async def test_a_fatal_xid_under_load_ends_healthy_and_only_the_holder_moves(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    async with stack(
        tmp_path, nats_server.url, nodes_count=2, gpus=8, operands=True, seed=21
    ) as running:
        await running.start_replica()
        await running.start_rollout(POLICY, version=OLD, remediation=REMEDIATION)

        async def loaded() -> bool:
            counts = [len(await uids(running, node)) for node in running.node_names]
            return max(counts) >= 2 and min(counts) >= 1

        await running.wait_until("GPU pods on the nodes", loaded, 120)
        before = {node: await uids(running, node) for node in running.node_names}
        sick, well = sorted(running.node_names, key=lambda node: -len(before[node]))
        gpu = await gpu_of(running, sick)
        assert len(before[sick]) >= 2, "the workloads put several GPU pods on the node"
        holder = sorted(before[sick])[0]
        kubelet = running.kubelets[sick]
        await kubelet.wait_for_devices("nvidia.com/gpu", lambda found: len(found) >= 2, timeout=60)
        device = next(d.ID for d in kubelet.devices("nvidia.com/gpu") if gpu in d.ID)
        await kubelet.allocate("nvidia.com/gpu", [device], pod=holder[1], namespace=holder[0])
        await asyncio.sleep(5)  # the orchestrator leads and consumes before the fault

        await publish_fault(running, well, await gpu_of(running, well), 13,
                            dev.XidAction.RESTART_APPLICATION)  # fmt: skip
        await publish_fault(running, sick, gpu, 48, dev.XidAction.RESET_GPU)

        async def quarantined() -> bool:
            return await marks(running, sick) == ("False", True)

        await running.wait_until("the node quarantined", quarantined, 120)

        async def done() -> bool:
            saga = await remediation_of(running, sick)
            return saga is not None and saga.state is R.DONE

        await running.wait_until("the remediation done", done, 300)
        # stored done (and so published after) only once the release was written: no wait
        assert await marks(running, sick) == ("True", False)
        after = {node: await uids(running, node) for node in (sick, well)}
        log = log_of(await running.export(), tmp_path / "log.jsonl")

    walked = moves(log, sick)
    assert walked[-1] is R.DONE and R.EVICTION_REQUIRED in walked, walked
    resets = [e.payload for e in log if isinstance(e.payload, remedies.GpuReset)]
    assert [r.gpu_uuids for r in resets] == [(gpu,)]
    assert moves(log, well) == []  # the application XID changed nothing
    assert after[sick].get(holder) != before[sick][holder]  # evicted (or recreated anew)
    untouched = {k: v for k, v in before[sick].items() if k != holder}
    assert {k: after[sick].get(k) for k in untouched} == untouched
    # the well node's pods stay (the holder's replacement may land there: the sick one is tainted)
    assert {k: after[well].get(k) for k in before[well]} == before[well]
    replayed = replaying.replay(log)
    comparison = replaying.compare(replaying.recorded_outputs(log), replayed.outputs)
    assert comparison.identical, comparison.report()


@pytest.mark.timeout(480)
async def test_a_gpu_reset_that_fails_reboots_the_node_and_the_new_boot_validates(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    async with stack(
        tmp_path, nats_server.url, nodes_count=1, gpus=2, operands=True, seed=22
    ) as running:
        (node,) = running.node_names
        simreset.set_fault(running.roots[node], simreset.FAIL)
        await running.start_replica()
        await running.start_rollout(POLICY, version=OLD, remediation=REMEDIATION)
        gpu = await gpu_of(running, node)
        await asyncio.sleep(5)  # the orchestrator leads and consumes before the fault
        await publish_fault(running, node, gpu, 48, dev.XidAction.RESET_GPU)

        async def released() -> bool:
            return await marks(running, node) == ("True", False)

        await running.wait_until("the node released after its reboot", released, 300)
        log = log_of(await running.export(), tmp_path / "log.jsonl")

    walked = moves(log, node)
    assert walked[-1] is R.DONE and R.REBOOT_REQUIRED in walked, walked
    failed = [e.payload for e in log if isinstance(e.payload, remedies.GpuResetFailed)]
    assert [f.reason for f in failed] == [remedies.ResetFailureReason.RESET_FAILED]
    replayed = replaying.replay(log)
    comparison = replaying.compare(replaying.recorded_outputs(log), replayed.outputs)
    assert comparison.identical, comparison.report()
