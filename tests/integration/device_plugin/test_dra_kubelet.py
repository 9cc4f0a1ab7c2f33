"""The device plugin serving a node's GPUs through DRA, driven as the device-API saga and
the kubelet drive it: `SetDeviceApi` over the bus, claims' allocations from the cluster
role's facts, and a gRPC client written from the kubelet's protos acting as the kubelet
(registration, prepare, unprepare, health) on real unix sockets."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuop.bus import Bus, InMemoryBus
from gpuop.events import device, dra, driver
from gpuop.events.device_api_commands import DeviceApi, DeviceApiApplied, SetDeviceApi
from gpuop.host import system
from gpuop.host.roots import HostRoot
from gpuop.inventory.claims import ClaimHolders
from gpuop.kubelet.dra.v1 import api_pb2 as v1
from gpuop.kubelet.dra_health.v1 import api_pb2 as health
from gpuop.services.device_plugin import agent
from gpuop.services.device_plugin.config import DevicePluginConfig
from gpuop.services.device_plugin.dra import cdispecs, deviceapis, serving
from gpuop.services.device_plugin.dra.checkpoint import Checkpoint, PreparedClaim, State
from gpuop.services.device_plugin.dra.plugin import PAUSED, DraPlugin
from gpuop.services.device_plugin.dra.preparing import NOT_YET_KNOWN, SWEEP_INTERVAL
from gpuop.services.device_plugin.health import HealthBook
from gpuop.services.device_plugin.inventory import GpuInventory
from tests.support.clocks import ManualClock
from tests.support.device_plugin import sim_inventory
from tests.support.dra_kubelet import FakeKubelet, allocated, claim, claim_uid, released
from tests.support.kubelet_plugin import GPU, NODE, Node, build_host, healthy, running_node

GPUS = 2


@pytest.fixture
def host(tmp_path: Path) -> HostRoot:
    return build_host(tmp_path / "host", GPUS)


@pytest.fixture
async def bus() -> Bus:
    started = InMemoryBus()
    await started.start()
    return started


async def registered(kubelet: FakeKubelet, host: HostRoot, *, accept: bool = True) -> None:
    """Register the plugin once its registration socket is there, as the kubelet's watcher
    does."""
    socket = host.join(serving.registration_socket())
    async with asyncio.timeout(10):
        while not socket.exists():
            await asyncio.sleep(0.02)
    await kubelet.register(accept=accept)


async def switch(
    node: Node, api: DeviceApi, kubelet: FakeKubelet | None = None, *, accept: bool = True
) -> DeviceApiApplied:
    """Send `SetDeviceApi`, registering (or refusing) the plugin meanwhile when a kubelet is
    given; the answer to it."""
    envelope = await node.command(SetDeviceApi(api=api, reason="test"), f"switch-{api}")
    if kubelet is not None:
        await registered(kubelet, node.root, accept=accept)
    answers = await node.confirmations(DeviceApiApplied)
    async with asyncio.timeout(15):
        while not (found := [a for a in answers if a.command_id == envelope.id]):
            await asyncio.sleep(0.05)
            answers = await node.confirmations(DeviceApiApplied)
    return found[0]


async def prepared(kubelet: FakeKubelet, n: int) -> v1.NodePrepareResourcesResponse:
    """Prepare claim `n`, again while its allocation has not reached the node (the
    kubelet retries on its next pod sync)."""
    async with asyncio.timeout(10):
        while True:
            answer = await kubelet.prepare(claim(n))
            if not answer.claims[claim_uid(n)].error.startswith(NOT_YET_KNOWN):
                return answer
            await asyncio.sleep(0.05)


def gpu_uuids(node: Node) -> list[str]:
    return [gpu.whole.uuid for gpu in node.plugins.gpu_inventory.gpus]


async def test_switching_to_dra_serves_the_plugin_instead_of_nvidia_com_gpu(
    host: HostRoot, bus: Bus
) -> None:
    kubelet = FakeKubelet(host.path)
    async with running_node(host, gpus=GPUS, bus=bus) as node:
        await node.kubelet.wait_for_devices(GPU, healthy(GPUS))
        at_start = await node.confirmations(DeviceApiApplied)
        assert at_start[0] == DeviceApiApplied(api=DeviceApi.DEVICE_PLUGIN, serving=True)
        answer = await switch(node, DeviceApi.DRA, kubelet)
        assert (answer.api, answer.serving, answer.message) == (DeviceApi.DRA, True, "")
        await node.kubelet.wait_for_devices(GPU, lambda devices: devices == ())
        assert kubelet.info is not None
        assert kubelet.info.type == "DRAPlugin"
        assert kubelet.info.name == dra.DRIVER
        assert list(kubelet.info.supported_versions) == [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
        ]
        assert kubelet.info.endpoint == "/var/lib/kubelet/plugins/gpu.nvidia.com/dra.sock"
        assert deviceapis.load(host) is DeviceApi.DRA

        back = await switch(node, DeviceApi.DEVICE_PLUGIN)
        assert (back.api, back.serving) == (DeviceApi.DEVICE_PLUGIN, True)
        await node.kubelet.wait_for_devices(GPU, healthy(GPUS))
        assert not host.join(serving.registration_socket()).exists()
        assert not host.join(serving.plugin_socket()).exists()
    await kubelet.close()


async def test_the_plugin_serves_in_the_kubelet_root_dir_its_config_names(
    host: HostRoot, bus: Bus
) -> None:
    config = DevicePluginConfig.model_validate({"flags": {"kubeletRootDir": "/data/kubelet"}})
    kubelet = FakeKubelet(host.path, "data/kubelet")
    async with running_node(host, gpus=GPUS, bus=bus, config=config) as node:
        envelope = await node.command(SetDeviceApi(api=DeviceApi.DRA, reason="test"), "dra")
        socket = kubelet.registry / f"{dra.DRIVER}-reg.sock"
        async with asyncio.timeout(10):
            while not socket.exists():
                await asyncio.sleep(0.02)
        await kubelet.register()
        assert kubelet.info is not None
        assert kubelet.info.endpoint == "/data/kubelet/plugins/gpu.nvidia.com/dra.sock"
        await node.publish(allocated(1, gpu_uuids(node)[:1], node=NODE))
        answer = await prepared(kubelet, 1)
        assert answer.claims[claim_uid(1)].error == ""
        checkpoint = host.join("data/kubelet/plugins/gpu.nvidia.com/checkpoint.json")
        assert claim_uid(1) in checkpoint.read_text()
        async with asyncio.timeout(10):
            while not (
                applied := [
                    a
                    for a in await node.confirmations(DeviceApiApplied)
                    if a.command_id == envelope.id
                ]
            ):
                await asyncio.sleep(0.05)
        assert [(a.api, a.serving) for a in applied] == [(DeviceApi.DRA, True)]
        assert not host.join(serving.registration_socket()).exists()
        assert not host.join(serving.plugin_socket()).exists()
    await kubelet.close()


async def test_a_refused_registration_answers_not_serving_with_the_kubelets_error(
    host: HostRoot, bus: Bus
) -> None:
    kubelet = FakeKubelet(host.path)
    async with running_node(host, gpus=GPUS, bus=bus) as node:
        answer = await switch(node, DeviceApi.DRA, kubelet, accept=False)
        assert answer.serving is False
        assert "refused by the test" in answer.message
    await kubelet.close()


async def test_prepare_twice_gives_the_same_answer_and_a_restart_loses_no_claim(
    host: HostRoot, bus: Bus
) -> None:
    kubelet = FakeKubelet(host.path)
    async with running_node(host, gpus=GPUS, bus=bus) as node:
        await switch(node, DeviceApi.DRA, kubelet)
        await node.publish(allocated(1, gpu_uuids(node)[1:], node=NODE, devices=["gpu-1"]))
        first = await prepared(kubelet, 1)
        uid = claim_uid(1)
        assert first.claims[uid].error == ""
        [device] = first.claims[uid].devices
        assert list(device.cdi_device_ids) == [f"k8s.gpu.nvidia.com/claim={uid}-gpu-1"]
        assert (device.pool_name, device.device_name) == (NODE, "gpu-1")
        assert await kubelet.prepare(claim(1)) == first
        beta = await kubelet.prepare_v1beta1(claim(1))
        assert list(beta.claims[uid].devices[0].cdi_device_ids) == list(device.cdi_device_ids)
        spec = json.loads(cdispecs.spec_path(host, uid).read_text())
        assert spec["devices"][0]["name"] == f"{uid}-gpu-1"
    await kubelet.close()

    # the plugin restarts (a new pod): it serves DRA again, from the host's choice, and says
    # so on its own once the kubelet registered it
    kubelet = FakeKubelet(host.path)
    async with running_node(host, gpus=GPUS, bus=bus) as node:
        await registered(kubelet, host)
        own = DeviceApiApplied(api=DeviceApi.DRA, serving=True)
        async with asyncio.timeout(10):
            while own not in await node.confirmations(DeviceApiApplied):
                await asyncio.sleep(0.05)
        assert await kubelet.prepare(claim(1)) == first, "answered from the checkpoint"
        await node.publish(released(1))
        gone = await kubelet.unprepare(claim(1))
        assert gone.claims[uid].error == ""
        assert not cdispecs.spec_path(host, uid).exists()
        again = await kubelet.unprepare(claim(1))
        assert again.claims[uid].error == "", "unprepare is idempotent"
    await kubelet.close()


async def test_an_unknown_claim_and_a_bad_config_fail_alone(host: HostRoot, bus: Bus) -> None:
    kubelet = FakeKubelet(host.path)
    async with running_node(host, gpus=GPUS, bus=bus) as node:
        await switch(node, DeviceApi.DRA, kubelet)
        mps = {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "MPS"},
        }
        uuids = gpu_uuids(node)
        await node.publish(allocated(2, uuids[:1], node=NODE, configs=[mps]))
        await node.publish(allocated(3, uuids[1:], node=NODE, devices=["gpu-1"]))
        await prepared(kubelet, 2)
        await prepared(kubelet, 3)
        answer = await kubelet.prepare(claim(1), claim(2), claim(3))
        assert answer.claims[claim_uid(1)].error.startswith(NOT_YET_KNOWN)
        assert "sharing.strategy MPS is not supported" in answer.claims[claim_uid(2)].error
        assert answer.claims[claim_uid(3)].error == ""
        assert len(answer.claims[claim_uid(3)].devices) == 1
        assert not cdispecs.spec_path(host, claim_uid(2)).exists()
        unknown = await kubelet.unprepare(claim(9))
        assert unknown.claims[claim_uid(9)].error == ""
    await kubelet.close()


async def test_the_health_stream_reports_every_gpu_and_an_xid(host: HostRoot, bus: Bus) -> None:
    kubelet = FakeKubelet(host.path)
    async with running_node(host, gpus=GPUS, bus=bus) as node:
        await switch(node, DeviceApi.DRA, kubelet)
        async with kubelet.health() as stream:
            first = await anext(stream)
            states = {d.device.device_name: d.health for d in first.devices}
            assert states == {"gpu-0": health.HEALTHY, "gpu-1": health.HEALTHY}
            assert {d.device.pool_name for d in first.devices} == {NODE}
            await node.xid(gpu_uuids(node)[1], 79)
            async with asyncio.timeout(10):
                while True:
                    report = await anext(stream)
                    found = {d.device.device_name: d for d in report.devices}
                    if found["gpu-1"].health == health.UNHEALTHY:
                        break
            assert found["gpu-0"].health == health.HEALTHY
            assert "XID 79" in found["gpu-1"].message
    await kubelet.close()


async def plugin_on(
    host: HostRoot, *, resend_interval: float
) -> tuple[DraPlugin, HealthBook, GpuInventory]:
    inventory = sim_inventory(host, gpus=GPUS)
    book = HealthBook(())
    plugin = DraPlugin(
        host,
        NODE,
        lambda: inventory,
        book,
        resend_interval=resend_interval,
    )
    await plugin.start()
    return plugin, book, inventory


async def test_a_health_change_is_sent_at_once(host: HostRoot) -> None:
    plugin, book, inventory = await plugin_on(host, resend_interval=3600)
    kubelet = FakeKubelet(host.path)
    try:
        await kubelet.register()
        async with kubelet.health() as stream:
            first = await anext(stream)
            assert {d.health for d in first.devices} == {health.HEALTHY}
            book.apply(
                device.DeviceHealthChanged(
                    gpu_uuid=inventory.gpus[0].whole.uuid,
                    healthy=False,
                    reason=device.HealthReason.ECC,
                )
            )
            await plugin.health_changed()
            async with asyncio.timeout(10):
                report = await anext(stream)
            states = {d.device.device_name: d.health for d in report.devices}
            assert states == {"gpu-0": health.UNHEALTHY, "gpu-1": health.HEALTHY}
    finally:
        await kubelet.close()
        await plugin.stop()


async def test_every_device_is_sent_again_without_a_change(host: HostRoot) -> None:
    plugin, _, _ = await plugin_on(host, resend_interval=0.05)
    kubelet = FakeKubelet(host.path)
    try:
        await kubelet.register()
        async with kubelet.health() as stream:
            reports = [await anext(stream) for _ in range(3)]
        assert all(len(r.devices) == GPUS for r in reports)
    finally:
        await kubelet.close()
        await plugin.stop()


async def test_a_claim_allocated_before_a_restart_is_prepared_after_it(
    host: HostRoot, bus: Bus
) -> None:
    kubelet = FakeKubelet(host.path)
    async with running_node(host, gpus=GPUS, bus=bus) as node:
        await switch(node, DeviceApi.DRA, kubelet)
        uuids = gpu_uuids(node)
        await node.publish(allocated(5, uuids[:1], node=NODE))
        await node.publish(allocated(6, uuids[1:], node=NODE, devices=["gpu-1"]))
        await prepared(kubelet, 6)  # taken in after claim 5, by the same consumer
    await kubelet.close()

    kubelet = FakeKubelet(host.path)
    async with running_node(host, gpus=GPUS, bus=bus):
        await registered(kubelet, host)
        answer = await prepared(kubelet, 5)
        assert answer.claims[claim_uid(5)].error == ""
    await kubelet.close()


async def test_a_paused_gpu_driver_makes_every_device_unhealthy_until_resumed(
    host: HostRoot, bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    # no periodic report: each one that comes was sent because the pause or resume changed
    monkeypatch.setattr(agent, "DraPlugin", functools.partial(DraPlugin, resend_interval=3600))
    kubelet = FakeKubelet(host.path)
    async with running_node(host, gpus=GPUS, bus=bus) as node:
        await switch(node, DeviceApi.DRA, kubelet)
        async with kubelet.health() as stream:
            assert {d.health for d in (await anext(stream)).devices} == {health.HEALTHY}
            await node.command(device.PauseOperands(components=(driver.Component.GPU,)), "pause")
            paused = await next_report(stream, health.UNHEALTHY)
            assert {d.message for d in paused.devices} == {PAUSED}
            await node.command(device.ResumeOperands(), "resume")
            await next_report(stream, health.HEALTHY)
    await kubelet.close()


async def next_report(
    stream: AsyncIterator[health.NodeWatchResourcesResponse], state: int
) -> health.NodeWatchResourcesResponse:
    """The first report in which every device is in `state` (a report made while the
    agent was halfway may come first)."""
    async with asyncio.timeout(30):
        while True:
            report = await anext(stream)
            if {d.health for d in report.devices} == {state}:
                return report


async def test_a_claim_from_the_bus_reaches_the_health_stream_and_the_holders_at_once(
    host: HostRoot, bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    # one reader of the node's claim facts feeds one fold: the DRA plugin's devices and the
    # holders the remediation asks for answer from the same claims
    made: list[DraPlugin] = []

    def plugin(*args: object, **kwargs: object) -> DraPlugin:
        made.append(DraPlugin(*args, resend_interval=3600, **kwargs))  # type: ignore[arg-type]
        return made[-1]

    followed: list[ClaimHolders] = []
    follow = agent.claims.follow

    async def reader(bus: Bus, node: str, holders: ClaimHolders, **kwargs: float) -> None:
        followed.append(holders)
        await follow(bus, node, holders, **kwargs)

    monkeypatch.setattr(agent, "DraPlugin", plugin)
    monkeypatch.setattr(agent.claims, "follow", reader)
    kubelet = FakeKubelet(host.path)
    async with running_node(host, gpus=GPUS, bus=bus) as node:
        await switch(node, DeviceApi.DRA, kubelet)
        async with kubelet.health() as stream:
            first = await anext(stream)
            assert {d.device.device_name for d in first.devices} == {"gpu-0", "gpu-1"}
            mig = "gpu-0-mig-1g18gb-19-0"
            await node.publish(allocated(7, gpu_uuids(node)[:1], node=NODE, devices=[mig]))
            async with asyncio.timeout(10):
                report = await anext(stream)  # no periodic report: sent for the claim
            assert {d.device.device_name for d in report.devices} == {"gpu-0", "gpu-1", mig}
        [dra_plugin] = made
        assert followed == [dra_plugin.index], "one reader, into the DRA plugin's claims"
        assert followed[0] is dra_plugin.index
    await kubelet.close()


async def test_the_serving_plugin_sweeps_a_half_prepared_claim_every_ten_minutes(
    host: HostRoot,
) -> None:
    # a plugin that died mid-prepare left claim 4 half made; its pod went, the claim was
    # released, and the kubelet never asks about it again
    clock = ManualClock()
    inventory = sim_inventory(host, gpus=GPUS)
    plugin = DraPlugin(host, NODE, lambda: inventory, HealthBook(()), clock=clock)
    boot = system.boot_id(host)
    path = host.join("var/lib/kubelet/plugins/gpu.nvidia.com/checkpoint.json")
    Checkpoint(path, boot).put(
        claim_uid(4), PreparedClaim(State.STARTED, "ml", "claim-4", started_at=clock.now())
    )
    spec = cdispecs.spec_path(host, claim_uid(4))
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text("half\n")
    plugin.index.ready.set()  # every claim fact read: claim 4 is not among them
    await plugin.start()
    try:
        await asyncio.sleep(0.05)
        assert spec.exists(), "no sweep before ten minutes"
        clock.advance(SWEEP_INTERVAL)
        async with asyncio.timeout(10):
            while spec.exists():
                await asyncio.sleep(0.02)
        assert Checkpoint.load(path, boot).get(claim_uid(4)) is None
    finally:
        await plugin.stop()
