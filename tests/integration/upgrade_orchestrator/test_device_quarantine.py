"""The remediation on a node serving its GPUs through DRA, on the simulated API server: the
orchestrator's runtime (in-memory bus, fake node agents whose holder listing is the device
plugin's, from the node's claim facts) and its real executor. A fault of one GPU puts a
`DeviceTaintRule` on that GPU's device and none on the node; only the pod whose
ResourceClaim holds that GPU is evicted, through the Eviction API, its PDB's refusal retried
until the budget allows it; the pod on the node's other GPU stays; the release deletes the
rule. A crash of the orchestrator in the middle of the quarantine resumes under a new
runtime and leaves no rule behind. Each log replays identically."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpuop.bus import InMemoryBus
from gpuop.events import Event, dra
from gpuop.events import remediation_commands as remedies
from gpuop.events.device_api_commands import DeviceApi, DeviceApiApplied
from gpuop.events.fields import NamespacedName
from gpuop.events.hardware import Gpu
from gpuop.events.remediation import RemediationState as R
from gpuop.inventory import claims
from gpuop.kube import client, conditions, nodes, pods
from gpuop.kube import dra as kube_dra
from gpuop.kube.recording import EventRecorder
from gpuop.saga import replaying
from gpuop.services.device_plugin import holders
from gpuop.services.upgrade_orchestrator.executing import KubeExecutor
from gpuop_sim import ApiServer
from tests.support import kube_objects as support
from tests.support.inventories import H200
from tests.support.remediations import Agents, Remediating, remediating
from tests.support.sagas import policy
from tests.support.waiting import eventually

NODE = "node-1"
SICK = H200.model_copy(update={"minor_number": 3})
WELL = H200.model_copy(
    update={
        "uuid": "GPU-30bce083-dbf9-2d4f-3c35-c858915accc5",
        "index": 1,
        "minor_number": 4,
        "pci_bus_id": "00000000:00:07.0",
    }
)
GPUS: tuple[Gpu, ...] = (SICK, WELL)
SPEC = policy(validation={"rungs": ["nvml"]})  # no pod rung: no kubelet runs pods here


def replays_identically(lines: list[str]) -> None:
    log = replaying.parse_log(lines)
    comparison = replaying.compare(replaying.recorded_outputs(log), replaying.replay(log).outputs)
    assert comparison.identical, comparison.report()


@dataclass
class ClaimAgents(Agents):
    """Node agents whose device plugin names the holders from the node's claim facts."""

    claims: claims.ClaimHolders = field(default_factory=claims.ClaimHolders)

    def answer(self, payload: object, command_id: str) -> list[Event]:
        if isinstance(payload, remedies.ListGpuHolders):
            pods_ = holders.with_claim_holders((), self.claims, payload.gpu_uuids)
            return [remedies.GpuHoldersListed(
                command_id=command_id, gpu_uuids=payload.gpu_uuids, pods=pods_
            )]  # fmt: skip
        return super().answer(payload, command_id)


@pytest.fixture
async def server() -> AsyncIterator[ApiServer]:
    async with ApiServer(bookmark_interval=0.2, kubelet_delay=0.0) as running:
        running.seed(support.node(NODE))
        for name, gpu in (("trainer", SICK), ("bystander", WELL)):
            pod = support.pod(name, node=NODE, labels={"app": name})
            running.seed(support.with_claims(pod, named={"gpu": f"{name}-gpu"}))
            running.seed(claim_object(name, gpu))
        running.seed(support.pdb("trainer-budget", {"app": "trainer"}, min_available=1))
        yield running


@pytest.fixture
async def kube(server: ApiServer, tmp_path: Path) -> AsyncIterator[client.Kube]:
    async with await client.connect(server.write_kubeconfig(tmp_path / "kubeconfig")) as api:
        yield api


def device_of(gpu: Gpu) -> str:
    return f"gpu-{gpu.minor_number}"


def claim_object(pod: str, gpu: Gpu) -> dict[str, object]:
    """The pod's ResourceClaim as the scheduler leaves it: gpuop's device of `gpu`."""
    claim = support.claim(f"{pod}-gpu", dra.DRIVER)
    result = claim["status"]["allocation"]["devices"]["results"][0]
    result.update(pool=NODE, device=device_of(gpu))
    return claim


def allocated(pod: str, gpu: Gpu, uid: str) -> dra.ClaimAllocated:
    """What the device plugin's cluster role publishes for the pod's claim."""
    return dra.ClaimAllocated(
        claim=dra.ClaimRef(namespace="default", name=f"{pod}-gpu", uid=uid),
        devices=(dra.AllocatedDevice(
            request="device", driver=dra.DRIVER, pool=NODE, device=device_of(gpu),
            gpu_uuid=gpu.uuid,
        ),),
        pods=(dra.PodRef(namespace="default", name=pod, uid=f"{uid}-0"),),
        resource_version="10",
    )  # fmt: skip


async def serving_dra(harness: Remediating, agents: ClaimAgents) -> None:
    """The node serves DRA, and its two claims are known on the bus (and to its agents)."""
    await harness.publish(
        DeviceApiApplied(api=DeviceApi.DRA, serving=True), NODE, source="/gpuop/device-plugin"
    )
    for fact in (allocated("trainer", SICK, "0001"), allocated("bystander", WELL, "0002")):
        await harness.publish(fact, NODE, source="/gpuop/device-plugin-cluster")
        agents.claims.apply(fact)


async def rules(kube: client.Kube) -> list[dict[str, str]]:
    return [rule["spec"]["deviceSelector"] for rule in await kube_dra.list_taint_rules(kube)]


def evictions_of(server: ApiServer, pod: str) -> list[int]:
    return [
        record.status
        for record in server.request_log
        if record.path.endswith(f"/pods/{pod}/eviction")
    ]


async def quarantined_and_refused(server: ApiServer, kube: client.Kube) -> None:
    """The rule on the sick GPU's device only, and the holder's eviction refused (429)."""
    selector = {"driver": dra.DRIVER, "pool": NODE, "device": device_of(SICK)}

    async def ruled() -> bool:
        return bool(await rules(kube))

    await eventually(ruled, timeout=10)
    assert await rules(kube) == [selector]
    await eventually(lambda: 429 in evictions_of(server, "trainer"), timeout=10)


async def node_pods(kube: client.Kube) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in await pods.on_node(kube, NODE)}


async def relax_budget(kube: client.Kube) -> None:
    await kube.call(
        kube.policy.delete_namespaced_pod_disruption_budget, "trainer-budget", "default"
    )


async def test_only_the_faulty_gpus_claim_holder_is_evicted_and_the_rule_goes_at_release(
    server: ApiServer, kube: client.Kube
) -> None:
    agents = ClaimAgents()
    executor = KubeExecutor(kube, EventRecorder(kube))
    before = await node_pods(kube)
    async with remediating(SPEC, (NODE,), agents=agents, gpus=GPUS, kube=executor) as harness:
        await serving_dra(harness, agents)
        await harness.fault(NODE, gpu=SICK.uuid)
        settling = asyncio.create_task(harness.settle(until_ended=(NODE,)))
        await quarantined_and_refused(server, kube)
        node = await nodes.get(kube, NODE)
        assert not any(
            t.get("key") == conditions.GPU_UNHEALTHY_TAINT for t in nodes.taints_of(node)
        )  # the node's other GPU keeps serving
        assert "trainer" in await node_pods(kube)  # refused, not deleted

        await relax_budget(kube)
        await settling
        saga = await harness.saga(NODE)
        lines = await harness.export()

    assert saga is not None and saga.state is R.DONE, saga
    assert saga.holders == (NamespacedName(namespace="default", name="trainer"),)
    assert await node_pods(kube) == {"bystander": before["bystander"]}
    assert evictions_of(server, "bystander") == []
    assert await rules(kube) == []
    replays_identically(lines)


async def test_a_crash_in_the_quarantine_resumes_and_leaves_no_rule(
    server: ApiServer, kube: client.Kube
) -> None:
    agents = ClaimAgents()
    bus = InMemoryBus()
    await bus.start()
    try:
        executor = KubeExecutor(kube, EventRecorder(kube))
        async with remediating(
            SPEC, (NODE,), agents=agents, gpus=GPUS, kube=executor, bus=bus
        ) as first:
            await serving_dra(first, agents)
            await first.fault(NODE, gpu=SICK.uuid)
            settling = asyncio.create_task(first.settle())
            await quarantined_and_refused(server, kube)
            saga = await first.saga(NODE)
            assert saga is not None and saga.state is R.EVICTION_REQUIRED
            settling.cancel()  # the leader dies with its eviction in flight
            await asyncio.gather(settling, return_exceptions=True)

        await relax_budget(kube)
        successor = KubeExecutor(kube, EventRecorder(kube))
        async with remediating(
            SPEC, (NODE,), agents=agents, gpus=GPUS, kube=successor, bus=bus
        ) as second:
            runner = second.stack.runner
            assert runner is not None
            assert await runner.resume() == 1  # the new leader takes the saga over
            await second.settle(until_ended=(NODE,))
            saga = await second.saga(NODE)
            lines = await second.export()
    finally:
        await bus.close()

    assert saga is not None and saga.state is R.DONE, saga
    assert set(await node_pods(kube)) == {"bystander"}
    assert await rules(kube) == []
    replays_identically(lines)
