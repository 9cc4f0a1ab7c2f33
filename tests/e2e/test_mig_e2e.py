"""MIG reconfiguration end to end (`stack`, with the operands): the node label
`nvidia.com/mig.config` re-carves the GPUs its config names through the whole stack
(discovery's cluster role tells the request, the orchestrator pauses the operands, the device
plugin names the pod holding a re-carved GPU, only that pod is evicted, the driver-manager
applies the layout on the simulated NVML and regenerates the CDI spec, the operands resume)
and the node shows `nvidia.com/mig.config.state=success`, its inventory the new MIG devices;
a config the GPUs cannot take fails with the driver-manager's reason, the layout untouched,
and `failed`; the log replays identically. An apply that fails midway (the second re-carved
GPU's instance creation, through the simulated NVML's fault file `sim_mig_fault`) ends
`failed` with the layout at the start back on the node, in the simulated state and in what
the device plugin advertises, only the holders of the re-carved GPUs evicted, the operands
resumed. A driver upgrade of a MIG node (the policy's version raised after the re-carve)
ends with the MIG devices the device plugin advertised before: the simulated driver reload
takes the instances, as a real one does, and the driver-manager's load puts its recorded
layout back.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from gpuop.bus import Buckets, NatsServer
from gpuop.events import driver as dm
from gpuop.events import hardware, subjects
from gpuop.events.mig import MigState, NodeMigStateChanged
from gpuop.host.roots import HostRoot
from gpuop.kube import nodes, pods
from gpuop.policy import specs
from gpuop.saga import replaying
from gpuop.saga.actions import STATE_LABEL
from gpuop.saga.mig.states import CONFIG_LABEL, CONFIG_STATE_LABEL
from gpuop_sim.nvml.backend import MIG_STATE
from gpuop_sim.nvml.sim_mig_fault import MIG_FAULT, set_fault
from gpuop_sim.nvml.simulated import SimNvml
from tests.support.rollouts import log_of
from tests.support.stack import NEW, OLD, Stack, stack

pytestmark = [pytest.mark.nats, pytest.mark.slow]

POLICY: dict[str, Any] = {"maxUnavailable": 2}
CONFIG = """\
version: v1
mig-configs:
  first-two:
    - devices: [0, 1]
      mig-enabled: true
      mig-devices: {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}
  too-big:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"7g.141gb": 2}
"""


async def inventory_of(running: Stack, node: str) -> hardware.HardwareDiscovered:
    entries = await running.bus.kv(Buckets.NODES)
    entry = await entries.get(subjects.encode_node(node))
    assert entry is not None, f"no inventory of {node}"
    return hardware.HardwareDiscovered.model_validate_json(entry.value)


async def uids(running: Stack, node: str) -> dict[tuple[str, str], str]:
    return {
        (p["metadata"]["namespace"], p["metadata"]["name"]): p["metadata"]["uid"]
        for p in await pods.gpu_pods_on(running.kube, node)
    }


async def state_label(running: Stack, node: str) -> str | None:
    return nodes.labels_of(await nodes.get(running.kube, node)).get(CONFIG_STATE_LABEL)


def moves(log: list[replaying.Recorded], node: str) -> list[MigState]:
    return [
        entry.payload.to_state
        for entry in log
        if isinstance(entry.payload, NodeMigStateChanged) and entry.envelope.node == node
    ]


@pytest.mark.timeout(480)
async def test_a_relabel_recarves_only_its_gpus_and_a_config_that_does_not_fit_fails(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    async with stack(
        tmp_path, nats_server.url, nodes_count=2, gpus=4, operands=True, seed=21
    ) as running:
        await running.start_replica()
        await running.start_rollout(POLICY, version=OLD, mig={"config": CONFIG})

        async def loaded() -> bool:
            return all([len(await uids(running, node)) >= 1 for node in running.node_names])

        await running.wait_until("GPU pods on the nodes", loaded, 120)
        carved, refused = running.node_names
        before = await uids(running, carved)
        holder = sorted(before)[0]
        first_gpu = (await inventory_of(running, carved)).gpus[0].uuid
        kubelet = running.kubelets[carved]
        await kubelet.wait_for_devices("nvidia.com/gpu", lambda found: len(found) >= 4, timeout=60)
        device = next(d.ID for d in kubelet.devices("nvidia.com/gpu") if first_gpu in d.ID)
        await kubelet.allocate("nvidia.com/gpu", [device], pod=holder[1], namespace=holder[0])
        await asyncio.sleep(5)  # the orchestrator leads and consumes before the relabels

        await nodes.set_labels(running.kube, carved, {CONFIG_LABEL: "first-two"})
        await nodes.set_labels(running.kube, refused, {CONFIG_LABEL: "too-big"})

        async def ended() -> bool:
            states = [await state_label(running, n) for n in (carved, refused)]
            return states == ["success", "failed"]

        await running.wait_until("both reconfigurations ended", ended, 300)

        async def rescanned() -> bool:
            found = await inventory_of(running, carved)
            return [len(g.mig_devices) for g in found.gpus] == [4, 4, 0, 0]

        await running.wait_until("the new MIG devices in the inventory", rescanned, 60)
        after = await uids(running, carved)
        untouched = (await inventory_of(running, refused)).gpus
        log = log_of(await running.export(), tmp_path / "log.jsonl")

    assert moves(log, carved)[-1] is MigState.MIG_CONFIG_DONE, moves(log, carved)
    assert moves(log, refused)[-1] is MigState.MIG_CONFIG_FAILED, moves(log, refused)
    assert after.get(holder) != before[holder]  # evicted (or recreated anew)
    others = {k: v for k, v in before.items() if k != holder}
    assert {k: after.get(k) for k in others} == others, "only the holder of GPU 0 moved"
    assert [g.mig_mode for g in untouched] == [hardware.MigMode.DISABLED] * 4
    replayed = replaying.replay(log)
    comparison = replaying.compare(replaying.recorded_outputs(log), replayed.outputs)
    assert comparison.identical, comparison.report()


def carve_first_gpu(index: int, root: HostRoot) -> None:
    """The node starts with GPU 0 in MIG mode, 3g + 4g, in its simulated NVML state."""
    SimNvml(4, mig_state=root.path / MIG_STATE).enable_mig(0, ["3g.71gb", "4g.71gb"])


def advertised(running: Stack, node: str) -> list[tuple[str, str]]:
    kubelet = running.kubelets[node]
    return sorted((d.ID, d.health) for d in kubelet.devices("nvidia.com/gpu"))


@pytest.mark.timeout(480)
async def test_an_apply_failing_midway_restores_the_layout_and_evicts_only_its_gpus_holders(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    async with stack(
        tmp_path, nats_server.url, nodes_count=1, gpus=4, operands=True, seed=21,
        prepare=carve_first_gpu,
    ) as running:  # fmt: skip
        await running.start_replica()
        await running.start_rollout(POLICY, version=OLD, mig={"config": CONFIG})
        (node,) = running.node_names

        async def loaded() -> bool:
            return len(await uids(running, node)) >= 2

        await running.wait_until("two GPU pods on the node", loaded, 120)
        kubelet = running.kubelets[node]
        await kubelet.wait_for_devices("nvidia.com/gpu", lambda found: len(found) >= 4, timeout=60)
        before = await uids(running, node)
        gpus = [g.uuid for g in (await inventory_of(running, node)).gpus]
        recarved, untouched = sorted(before)[:2]  # on GPU 0 (re-carved), on GPU 2 (not)
        for (namespace, name), gpu in zip((recarved, untouched), (gpus[0], gpus[2]), strict=True):
            device = next(d.ID for d in kubelet.devices("nvidia.com/gpu") if gpu in d.ID)
            await kubelet.allocate("nvidia.com/gpu", [device], pod=name, namespace=namespace)
        devices_before = advertised(running, node)
        state_path = running.roots[node].path / MIG_STATE
        layout_before = json.loads(state_path.read_text())
        # GPU 0's new instances are created, then one of GPU 1's fails
        set_fault(running.roots[node].path, "create_gpu_instance", after=4)
        await asyncio.sleep(5)  # the orchestrator leads and consumes before the relabel

        await nodes.set_labels(running.kube, node, {CONFIG_LABEL: "first-two"})

        async def ended() -> bool:
            return await state_label(running, node) in ("success", "failed")

        await running.wait_until("the reconfiguration ended", ended, 300)

        async def resumed() -> bool:
            found = advertised(running, node)
            return len(found) >= 4 and all(health == "Healthy" for _, health in found)

        await running.wait_until("the device plugin advertising again", resumed, 60)
        final_state = await state_label(running, node)
        devices_after = advertised(running, node)
        layout_after = json.loads(state_path.read_text())
        fault_left = (running.roots[node].path / MIG_FAULT).exists()
        after = await uids(running, node)
        log = log_of(await running.export(), tmp_path / "log.jsonl")

    assert final_state == "failed"
    assert not fault_left, "the fault fired"
    ends = [
        e.payload
        for e in log
        if isinstance(e.payload, NodeMigStateChanged) and e.envelope.node == node
    ]
    assert ends[-1].to_state is MigState.MIG_CONFIG_FAILED, moves(log, node)
    assert ends[-1].from_state is MigState.OPERANDS_RESUME_REQUIRED, moves(log, node)
    assert "injected fault" in ends[-1].reason, ends[-1].reason
    assert ends[-1].reason.endswith("the layout at the start is back"), ends[-1].reason
    assert len(layout_before[0]["instances"]) == 2, "GPU 0 started carved 3g + 4g"
    assert layout_after == layout_before
    assert devices_after == devices_before
    assert after.get(recarved) != before[recarved], "the re-carved GPU's holder was evicted"
    kept = {k: v for k, v in before.items() if k != recarved}
    assert untouched in kept
    assert {k: after.get(k) for k in kept} == kept, "only the holder of GPU 0 moved"
    replayed = replaying.replay(log)
    comparison = replaying.compare(replaying.recorded_outputs(log), replayed.outputs)
    assert comparison.identical, comparison.report()


def advertised_all(running: Stack, node: str) -> dict[str, list[tuple[str, str]]]:
    """Every resource's devices (id, health) as the node's kubelet last heard them."""
    kubelet = running.kubelets[node]
    return {r: sorted((d.ID, d.health) for d in kubelet.devices(r)) for r in kubelet.resources}


async def mig_uuids(running: Stack, node: str) -> list[list[str]]:
    """The MIG devices of each GPU in the node's inventory, by UUID."""
    return [[d.uuid for d in g.mig_devices] for g in (await inventory_of(running, node)).gpus]


@pytest.mark.timeout(480)
async def test_a_driver_upgrade_of_a_mig_node_keeps_its_mig_devices(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    async with stack(
        tmp_path, nats_server.url, nodes_count=1, gpus=4, operands=True, seed=21
    ) as running:
        await running.start_replica()
        await running.start_rollout(POLICY, version=OLD, mig={"config": CONFIG})
        (node,) = running.node_names
        await running.kubelets[node].wait_for_devices(
            "nvidia.com/gpu", lambda found: len(found) >= 4, timeout=120
        )
        await asyncio.sleep(5)  # the orchestrator leads and consumes before the relabel
        await nodes.set_labels(running.kube, node, {CONFIG_LABEL: "first-two"})

        async def advertising() -> bool:
            found = advertised_all(running, node).get("nvidia.com/gpu", [])
            return len(found) >= 4 and all(h == "Healthy" for _, h in found)

        async def carved() -> bool:
            counts = [len(g) for g in await mig_uuids(running, node)]
            return await state_label(running, node) == "success" and counts == [4, 4, 0, 0]

        await running.wait_until("the node re-carved", carved, 120)
        await running.wait_until("the device plugin advertising", advertising, 60)
        before, devices_before = await mig_uuids(running, node), advertised_all(running, node)
        await running.kube.call(
            running.kube.custom_objects.patch_cluster_custom_object,
            specs.GROUP, specs.VERSION, specs.PLURAL, "default",
            {"spec": {"driver": {"gpu": {"version": NEW}}}},
        )  # fmt: skip

        async def upgraded() -> bool:
            return (await running.labels())[node].get(STATE_LABEL) == "upgrade-done"

        await running.wait_until("the node upgraded", upgraded, 240)

        async def same_again() -> bool:
            return await mig_uuids(running, node) == before and await advertising()

        try:
            await running.wait_until("the same MIG devices again", same_again, 45)
        finally:
            after, devices_after = await mig_uuids(running, node), advertised_all(running, node)
            log = log_of(await running.export(), tmp_path / "log.jsonl")

    assert after == before, "the upgrade's driver reload lost the MIG devices"
    assert devices_after == devices_before
    loads = [e.payload.version for e in log if isinstance(e.payload, dm.DriverLoaded)]
    assert loads == [NEW]
