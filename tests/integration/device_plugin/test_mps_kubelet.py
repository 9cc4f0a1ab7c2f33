"""MPS sharing on a simulated node, end to end in one process: the plugin advertises MPS
replicas to the simulated kubelet over real unix sockets and allocates them with the MPS
daemon's pipe and limits; the stand-in daemon is a real process, started with the config's
limits, started again after a SIGKILL, quit for a GPU driver reload and started again on
resume, every change reported on the bus. Everything a test waits for is an event or a
device list, so a run replays the same."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpuop.events import decode, device, driver
from gpuop.events.device import MpsDaemonChanged, MpsDaemonState
from gpuop.host.roots import HostRoot
from gpuop.services.device_plugin.config import load_configs
from gpuop.services.device_plugin.mps import MIB
from gpuop_sim.host import mpscontrol as standin
from tests.support.device_plugin import config, sim_inventory
from tests.support.kubelet_plugin import GPU, Node, build_host, healthy, running_node
from tests.support.mps import ask, daemon_pid, end_daemons, mps_document
from tests.support.waiting import eventually

GPUS = 2
REPLICAS = 4


@pytest.fixture
def host(tmp_path: Path) -> Iterator[HostRoot]:
    root = build_host(tmp_path / "host", GPUS)
    yield root
    end_daemons(root)


def all_unhealthy(devices: tuple[Any, ...]) -> bool:
    return bool(devices) and all(d.health == "Unhealthy" for d in devices)


async def mps_changes(node: Node, count: int) -> list[MpsDaemonChanged]:
    return await node.confirmations(MpsDaemonChanged, count)


async def test_mps_replicas_are_allocated_with_the_daemons_pipe_and_limits(
    host: HostRoot,
) -> None:
    async with running_node(host, gpus=GPUS, config=config(mps_document(REPLICAS))) as node:
        devices = await node.kubelet.wait_for_devices(GPU, healthy(GPUS * REPLICAS))
        (running,) = await mps_changes(node, 1)
        assert (running.resource, running.state, running.replicas, running.gpus) == (
            GPU,
            MpsDaemonState.RUNNING,
            REPLICAS,
            GPUS,
        )
        assert daemon_pid(host) is not None
        assert ask(host, "get_default_active_thread_percentage") == "25.0"
        (report,) = await node.confirmations(device.DevicePluginConfigApplied)
        assert (report.replicas, report.sharing_strategy) == (REPLICAS, "mps")

        answer = await node.kubelet.allocate(GPU, [devices[REPLICAS].ID], pod="inference-1")
        gpu = devices[REPLICAS].ID.split("::")[0]
        memory = sim_inventory(host, gpus=GPUS).gpus[1].whole.memory_bytes  # the second's
        assert dict(answer.envs) == {
            "NVIDIA_VISIBLE_DEVICES": gpu,
            "CUDA_MPS_PIPE_DIRECTORY": "/mps/nvidia.com/gpu/pipe",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={memory // REPLICAS // MIB}M",
        }
        assert {(m.container_path, m.host_path) for m in answer.mounts} == {
            ("/mps/nvidia.com/gpu/pipe", "/run/nvidia/mps/nvidia.com/gpu/pipe"),
            ("/dev/shm", "/run/nvidia/mps/shm"),
        }
        # the host path the kubelet mounts is where the daemon's control pipe is
        assert (host.join("/run/nvidia/mps/nvidia.com/gpu/pipe") / standin.SOCKET).exists()
        second = await node.kubelet.allocate(GPU, [devices[1].ID], pod="inference-2")
        assert second.envs["NVIDIA_VISIBLE_DEVICES"] == devices[0].ID.split("::")[0]

        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await node.kubelet.allocate(GPU, [devices[2].ID, devices[3].ID], pod="greedy")
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "maximum request size for shared resources is 1" in (refused.value.details() or "")
        assert [a.pod for a in node.kubelet.allocations] == ["inference-1", "inference-2"]


async def test_a_sigkilled_daemon_is_started_again_and_its_replicas_come_back(
    host: HostRoot,
) -> None:
    async with running_node(host, gpus=GPUS, config=config(mps_document(REPLICAS))) as node:
        await node.kubelet.wait_for_devices(GPU, healthy(GPUS * REPLICAS))
        await mps_changes(node, 1)
        first = daemon_pid(host)
        assert first is not None

        os.kill(first, signal.SIGKILL)
        changes = await mps_changes(node, 3)
        assert [(c.state, c.restarts) for c in changes] == [
            (MpsDaemonState.RUNNING, 0),
            (MpsDaemonState.FAILED, 0),
            (MpsDaemonState.RUNNING, 1),
        ]
        assert "stopped answering" in changes[1].message
        await node.kubelet.wait_for_devices(GPU, healthy(GPUS * REPLICAS))
        second = await eventually(lambda: daemon_pid(host))
        assert second != first
        assert ask(host, "get_default_active_thread_percentage") == "25.0", "limits set again"


async def reload_around_the_daemon(host: HostRoot) -> list[dict[str, Any]]:
    """Pause the GPU driver, reload it, resume, as the orchestrator and the driver-manager
    do; the node's events in order, without their ids and times."""
    async with running_node(host, gpus=GPUS, config=config(mps_document(REPLICAS))) as node:
        devices = await node.kubelet.wait_for_devices(GPU, healthy(GPUS * REPLICAS))
        await mps_changes(node, 1)
        assert daemon_pid(host) is not None

        await node.command(device.PauseOperands(components=(driver.Component.GPU,)), "pause")
        await node.confirmations(device.OperandPaused)
        assert daemon_pid(host) is None, "quit before the pause was confirmed"
        assert not node.plugins.gpu_session_open
        await node.kubelet.wait_for_devices(GPU, all_unhealthy)
        node.kernel.rmmod("nvidia_uvm")
        node.kernel.rmmod("nvidia")  # neither NVML nor an MPS server holds it
        node.kernel.modprobe("nvidia")
        node.kernel.modprobe("nvidia_uvm")
        await node.validated()
        assert daemon_pid(host) is None, "still paused: the validation starts nothing"

        await node.command(device.ResumeOperands(), "resume")
        await node.confirmations(device.OperandResumed)
        changes = await mps_changes(node, 3)
        assert [c.state for c in changes] == [
            MpsDaemonState.RUNNING,
            MpsDaemonState.STOPPED,
            MpsDaemonState.RUNNING,
        ]
        assert changes[1].message == "the GPU driver is paused for a reload"
        assert [
            d.ID for d in await node.kubelet.wait_for_devices(GPU, healthy(GPUS * REPLICAS))
        ] == [d.ID for d in devices]
        assert ask(host, "get_default_active_thread_percentage") == "25.0"
        return [
            {"type": envelope.type, "data": payload.model_dump(mode="json")}
            async for stored in node.bus.read(f"{node.bus.prefix}.evt.>")
            for envelope, payload in [decode(stored.data)]
        ]


async def test_the_daemon_is_quit_for_a_gpu_reload_and_started_again_on_resume(
    tmp_path: Path,
) -> None:
    runs = []
    for run in ("first", "second"):
        root = build_host(tmp_path / run, GPUS)
        try:
            runs.append(await reload_around_the_daemon(root))
        finally:
            end_daemons(root)
    first, second = runs
    assert first == second, "the same commands give the same events"
    mps = [e["data"]["state"] for e in first if "mps-daemon-changed" in e["type"]]
    assert mps == ["running", "stopped", "running"]


async def test_a_node_without_the_program_says_what_to_install(host: HostRoot) -> None:
    host.join(standin.INSTALLED_AT).unlink()
    async with running_node(host, gpus=GPUS, config=config(mps_document(REPLICAS))) as node:
        (failed,) = await mps_changes(node, 1)
        assert failed.state is MpsDaemonState.FAILED
        assert "nvidia-cuda-mps-control is not on the host" in failed.message
        assert "install the NVIDIA driver's user-space tools" in failed.message
        await node.wait_readiness(False, "install the NVIDIA driver's user-space tools")
        await node.kubelet.wait_for_devices(GPU, all_unhealthy)

        standin.install(host.path)  # the tools installed: the daemon starts at its next try
        await node.kubelet.wait_for_devices(GPU, healthy(GPUS * REPLICAS))
        (_, running) = await mps_changes(node, 2)
        assert (running.state, running.restarts) == (MpsDaemonState.RUNNING, 1)
        await node.wait_readiness(True)


async def test_a_switch_to_and_from_an_mps_config_starts_and_quits_the_daemon(
    host: HostRoot, tmp_path: Path
) -> None:
    path = tmp_path / "device-plugin.yaml"
    path.write_text(
        "default: exclusive\n"
        "configs:\n"
        "  exclusive: {}\n"
        "  mps-4: {sharing: {mps: {resources: [{name: nvidia.com/gpu, replicas: 4}]}}}\n"
    )
    async with running_node(
        host, gpus=GPUS, config=load_configs(path), reload=lambda: load_configs(path)
    ) as node:
        await node.kubelet.wait_for_devices(GPU, healthy(GPUS))
        assert daemon_pid(host) is None
        await node.publish(device.DevicePluginConfigSelected(config="mps-4"))
        await node.kubelet.wait_for_devices(GPU, healthy(GPUS * REPLICAS))
        (running,) = await mps_changes(node, 1)
        assert running.state is MpsDaemonState.RUNNING
        assert daemon_pid(host) is not None

        await node.publish(device.DevicePluginConfigSelected(config="exclusive"))
        await node.kubelet.wait_for_devices(GPU, healthy(GPUS))
        (_, stopped) = await mps_changes(node, 2)
        assert stopped.state is MpsDaemonState.STOPPED
        assert daemon_pid(host) is None
        assert len(node.kubelet.registrations) == 1
