"""The device plugin service over a real nats-server: started the way `gpuop run` starts it,
it keeps serving the kubelet with the last known health while NATS is down, and catches up
when NATS is back."""

from __future__ import annotations

import asyncio
import sys
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

from gpuop.bus import NatsBus, NatsServer
from gpuop.events import decode, device, driver, ids, new_command, new_event
from gpuop.host.roots import HostRoot
from gpuop.runtime.services import ServiceContext
from gpuop.services import device_plugin
from gpuop_sim.cluster.kubelet_grpc import KubeletGrpc
from tests.support.kubelet_plugin import (
    GPU,
    NODE,
    build_host,
    healthy,
    running_node,
    unhealthy,
)
from tests.support.services import connected, in_process

pytestmark = pytest.mark.nats


@pytest.fixture
def host(tmp_path: Path) -> HostRoot:
    return build_host(tmp_path / "host", 4)


def service(nats: NatsServer, host: HostRoot) -> AbstractAsyncContextManager[ServiceContext]:
    """The device plugin in this process as `gpuop run device-plugin` runs it."""
    return in_process(
        device_plugin.SERVICE, nats, retry_for=2.0, node=NODE, host_root=host.path, nvml="sim:4"
    )


def publisher(nats: NatsServer) -> AbstractAsyncContextManager[NatsBus]:
    """Another service's connection: telemetry's, the orchestrator's."""
    return connected(nats, "telemetry", retry_for=10.0)


async def xid(bus: NatsBus, gpu_uuid: str, number: int) -> None:
    event = device.DeviceHealthChanged(
        gpu_uuid=gpu_uuid, healthy=False, reason=device.HealthReason.XID, xid=number
    )
    await bus.publish(new_event(event, node=NODE, source="/gpuop/telemetry/test"))


async def test_nats_down_keeps_the_last_known_health_and_nats_back_catches_up(
    nats_server: NatsServer, host: HostRoot
) -> None:
    async with KubeletGrpc.under(host.path) as kubelet, service(nats_server, host) as context:
        devices = await kubelet.wait_for_devices(GPU, healthy(4))
        async with publisher(nats_server) as telemetry:
            await xid(telemetry, devices[0].ID, 79)
            await kubelet.wait_for_devices(GPU, unhealthy(devices[0].ID))
            assert context.ready

            await nats_server.stop()
            await kubelet.restart()  # the kubelet restarts while NATS is down
            await kubelet.wait_for_registrations(2)
            await kubelet.wait_for_devices(GPU, unhealthy(devices[0].ID))
            response = await kubelet.allocate(GPU, [devices[1].ID], pod="while-nats-is-down")
            assert response.envs["NVIDIA_VISIBLE_DEVICES"] == devices[1].ID

            await nats_server.start()
            await xid(telemetry, devices[2].ID, 48)
            await kubelet.wait_for_devices(GPU, unhealthy(devices[0].ID, devices[2].ID))


async def test_nats_down_while_it_starts_then_it_subscribes_when_nats_is_back(
    nats_server: NatsServer, host: HostRoot
) -> None:
    bus = NatsBus(nats_server.url, name="device-plugin", retry_for=1.0)
    await bus.start()
    await nats_server.stop()
    try:
        async with running_node(host, gpus=4, bus=bus) as node:
            devices = await node.kubelet.wait_for_devices(GPU, healthy(4))
            await nats_server.start()
            async with publisher(nats_server) as telemetry:
                # the consumer may come up after this event: it is read from the log then
                await xid(telemetry, devices[1].ID, 79)
                await node.kubelet.wait_for_devices(GPU, unhealthy(devices[1].ID), timeout=30)
    finally:
        await bus.close()


async def test_gpuop_run_device_plugin_registers_and_confirms_a_pause(
    nats_server: NatsServer, host: HostRoot, tmp_path: Path
) -> None:
    config = tmp_path / "device-plugin.yaml"
    config.write_text("flags: {plugin: {deviceListStrategy: cdi}}\n")
    async with KubeletGrpc.under(host.path) as kubelet, publisher(nats_server) as orchestrator:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gpuop.cli.main", "run", "device-plugin",
            "--role", "node", "--node", NODE, "--nats", nats_server.url,
            "--host-root", str(host.path), "--nvml", "sim:4", "--config", str(config),
            "--metrics-listen", "127.0.0.1:0", "--log-format", "text",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        try:
            devices = await kubelet.wait_for_devices(GPU, healthy(4), timeout=30)
            answer = await kubelet.allocate(GPU, [devices[0].ID], pod="p")
            assert [d.name for d in answer.cdi_devices] == [
                f"k8s.device-plugin.nvidia.com/gpu={devices[0].ID}"
            ]
            pause = new_command(
                device.PauseOperands(components=(driver.Component.GPU,)),
                node=NODE,
                source="/gpuop/upgrade-orchestrator",
                id=ids.step("saga-1", "pause", 1),
            )
            await orchestrator.publish(pause)
            await kubelet.wait_for_devices(GPU, unhealthy(*(d.ID for d in devices)))
            async with asyncio.timeout(15):
                while True:
                    confirmed = [
                        payload
                        async for stored in orchestrator.read(f"{orchestrator.prefix}.evt.>")
                        if isinstance(payload := decode(stored.data)[1], device.OperandPaused)
                    ]
                    if confirmed:
                        break
                    await asyncio.sleep(0.05)
            assert confirmed[0].command_id == pause.id
        finally:
            process.terminate()
            assert await asyncio.wait_for(process.wait(), 15) == 0
        assert not (kubelet.device_plugin_dir / "nvidia-gpu.sock").exists()
