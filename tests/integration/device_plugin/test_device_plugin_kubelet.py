"""The device plugin against the simulated kubelet over real unix sockets, fed by the
in-memory bus: registration, ListAndWatch, Allocate, GetPreferredAllocation, health from
events, kubelet restarts, and pause and resume around a simulated driver reload."""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import pytest

from gpuop.bus import InMemoryBus
from gpuop.events import device, driver
from gpuop.host.errors import ModuleInUse
from gpuop.host.roots import HostRoot
from gpuop.kubelet import constants
from gpuop.nvml import DriverNotLoaded
from gpuop.services.device_plugin import cdi, plugins
from gpuop.services.device_plugin.config import DevicePluginConfig
from gpuop.services.device_plugin.serving import socket_name
from gpuop_sim.host.simkernel import SimKernel
from gpuop_sim.nvml import sim_gpus
from tests.support.device_plugin import add_hca, config
from tests.support.kubelet_plugin import (
    GPU,
    NODE,
    build_host,
    healthy,
    running_node,
    sim_nvml,
    unhealthy,
)
from tests.support.telemetry import CountingNvml
from tests.support.waiting import eventually


@pytest.fixture
def host(tmp_path: Path) -> HostRoot:
    return build_host(tmp_path / "host", 8)


async def test_the_plugin_serves_then_registers_nvidia_gpu(host: HostRoot) -> None:
    async with running_node(host) as node:
        devices = await node.kubelet.wait_for_devices(GPU, healthy(8))
        (registration,) = node.kubelet.registrations
        assert registration.version == "v1beta1"
        assert registration.resource_name == GPU
        assert registration.endpoint == "nvidia-gpu.sock"
        assert registration.options.get_preferred_allocation_available
        assert not registration.options.pre_start_required
        assert (node.kubelet.device_plugin_dir / "nvidia-gpu.sock").is_socket()
        assert [d.topology.nodes[0].ID for d in devices] == [0, 0, 0, 0, 1, 1, 1, 1]
        assert all(d.ID.startswith("GPU-") for d in devices)
        assert node.readiness[-1] == (True, "")
    assert not (node.kubelet.device_plugin_dir / "nvidia-gpu.sock").exists(), "socket removed"


async def test_a_node_whose_driver_is_not_loaded_yet_gets_its_gpus_once_nvml_opens(
    host: HostRoot, caplog: pytest.LogCaptureFixture
) -> None:
    nvml = CountingNvml(sim_nvml(host, 8))
    nvml.fail("init", DriverNotLoaded("nvmlInit: Driver Not Loaded", code=9))
    with caplog.at_level(logging.WARNING, logger=plugins.__name__):
        async with running_node(host, nvml=nvml) as node:  # type: ignore[arg-type]
            await node.wait_readiness(False, "NVML cannot be used: nvmlInit: Driver Not Loaded")
            await eventually(lambda: nvml.calls["init"] >= 4)
            assert node.kubelet.registrations == []
            assert node.kubelet.devices(GPU) == ()
            nvml.heal()
            await node.kubelet.wait_for_devices(GPU, healthy(8))
            await node.wait_readiness(True)
    failures = [r.getMessage() for r in caplog.records if "NVML cannot be used" in r.getMessage()]
    assert failures == ["NVML cannot be used: nvmlInit: Driver Not Loaded; retrying every 0.2 s"], (
        "logged once, not at every retry"
    )


async def test_every_update_carries_the_full_device_list(host: HostRoot) -> None:
    async with running_node(host) as node:
        devices = await node.kubelet.wait_for_devices(GPU, healthy(8))
        await node.xid(devices[2].ID, 79)
        after = await node.kubelet.wait_for_devices(GPU, unhealthy(devices[2].ID))
        assert [d.ID for d in after] == [d.ID for d in devices]
        await node.xid(devices[5].ID, 48)
        after = await node.kubelet.wait_for_devices(GPU, unhealthy(devices[2].ID, devices[5].ID))
        assert len(after) == 8


async def test_a_critical_xid_reaches_the_kubelet_as_unhealthy_and_an_ignored_one_does_not(
    host: HostRoot,
) -> None:
    async with running_node(host) as node:
        devices = await node.kubelet.wait_for_devices(GPU, healthy(8))
        await node.xid(devices[0].ID, 13)  # an application error: ignored
        await node.xid(devices[1].ID, 79)  # fallen off the bus
        await node.kubelet.wait_for_devices(GPU, unhealthy(devices[1].ID))
        assert node.plugins.health.is_healthy(devices[0].ID)


@pytest.mark.parametrize("sharing", ["time-sliced", "mig"])
async def test_a_gpus_replicas_and_mig_devices_share_its_health(
    host: HostRoot, sharing: str
) -> None:
    nvml = sim_nvml(host, 8)
    if sharing == "mig":
        nvml.enable_mig(3, ["3g.71gb", "3g.71gb"])
        document: dict[str, object] = {"flags": {"migStrategy": "mixed"}}
        resource, count = "nvidia.com/mig-3g.71gb", 2
    else:
        document = {"sharing": {"timeSlicing": {"resources": [{"name": GPU, "replicas": 3}]}}}
        resource, count = GPU, 24
    async with running_node(host, config=config(document), nvml=nvml) as node:
        await node.kubelet.wait_for_devices(resource, healthy(count))
        parent = sim_gpus.gpu_uuid(NODE, 3)
        await node.xid(parent, 48)
        if sharing == "mig":
            migs = [d.ID for d in node.kubelet.devices(resource)]
            await node.kubelet.wait_for_devices(resource, unhealthy(*migs))
        else:
            replicas = [f"{parent}::{n}" for n in range(3)]
            await node.kubelet.wait_for_devices(resource, unhealthy(*replicas))


async def test_health_from_before_the_start_is_restored(host: HostRoot, bus: InMemoryBus) -> None:
    async with running_node(host, bus=bus) as first:
        devices = await first.kubelet.wait_for_devices(GPU, healthy(8))
        await first.xid(devices[3].ID, 79)
        await first.kubelet.wait_for_devices(GPU, unhealthy(devices[3].ID))
    async with running_node(host, bus=bus) as restarted:
        await restarted.kubelet.wait_for_devices(GPU, unhealthy(devices[3].ID))


async def test_a_kubelet_restart_leads_to_registration_again(host: HostRoot) -> None:
    async with running_node(host) as node:
        devices = await node.kubelet.wait_for_devices(GPU, healthy(8))
        await node.kubelet.restart()
        assert not (node.kubelet.device_plugin_dir / "nvidia-gpu.sock").exists()
        await node.kubelet.wait_for_registrations(2)
        again = await node.kubelet.wait_for_devices(GPU, healthy(8))
        assert [d.ID for d in again] == [d.ID for d in devices]
        response = await node.kubelet.allocate(GPU, [devices[0].ID], pod="after-restart")
        assert response.envs["NVIDIA_VISIBLE_DEVICES"] == devices[0].ID


async def test_the_plugin_waits_for_a_kubelet_that_is_gone(host: HostRoot) -> None:
    async with running_node(host, start_kubelet=False) as node:
        await node.wait_readiness(False, "no kubelet at")
        plugin_socket = node.kubelet.device_plugin_dir / socket_name(GPU)
        assert plugin_socket.is_socket(), "it serves before any kubelet is there"
        await node.kubelet.start()
        await node.kubelet.wait_for_devices(GPU, healthy(8))
        await node.wait_readiness(True)

        await node.kubelet.stop()
        await node.wait_readiness(False, "no kubelet at")
        assert plugin_socket.is_socket(), "still serving"
        await node.kubelet.start()
        await node.kubelet.wait_for_registrations(2)
        await node.kubelet.wait_for_devices(GPU, healthy(8))


async def test_a_kubelet_that_refuses_registration_is_asked_again(host: HostRoot) -> None:
    async with running_node(host) as node:
        await node.kubelet.wait_for_devices(GPU, healthy(8))
        node.kubelet.device_plugin_dir.joinpath(socket_name(GPU)).unlink()
        # the plugin notices its socket is gone, serves again and re-registers
        await node.kubelet.wait_for_registrations(2)
        await node.kubelet.wait_for_devices(GPU, healthy(8))


async def test_a_dead_kubelet_socket_is_retried_until_a_kubelet_answers(
    host: HostRoot,
) -> None:
    dead = host.join("var/lib/kubelet/device-plugins/kubelet.sock")
    dead.parent.mkdir(parents=True)
    dead.touch()  # left behind by a kubelet that died
    async with running_node(host, start_kubelet=False) as node:
        await node.wait_readiness(False, "the kubelet answered")
        await node.kubelet.start()
        await node.kubelet.wait_for_devices(GPU, healthy(8))
        await node.wait_readiness(True)


async def test_gpus_appear_once_the_driver_is_loaded(host: HostRoot) -> None:
    kernel = SimKernel(host)
    kernel.rmmod("nvidia_uvm")
    kernel.rmmod("nvidia")
    async with running_node(host) as node:
        await node.wait_readiness(False, "NVML cannot be used")
        assert node.kubelet.resources == ()
        kernel.modprobe("nvidia")
        await node.kubelet.wait_for_devices(GPU, healthy(8))
        await node.wait_readiness(True)


async def test_a_mig_profile_that_goes_away_is_advertised_empty(host: HostRoot) -> None:
    nvml = sim_nvml(host, 8)
    nvml.enable_mig(0, ["3g.71gb", "3g.71gb"])
    mixed = config({"flags": {"migStrategy": "mixed"}})
    async with running_node(host, config=mixed, nvml=nvml) as node:
        old = await node.kubelet.wait_for_devices("nvidia.com/mig-3g.71gb", healthy(2))
        await node.kubelet.wait_for_devices(GPU, healthy(7))
        nvml.enable_mig(0, ["7g.141gb"])
        await node.validated()  # the new layout is read with the validated driver
        await node.kubelet.wait_for_devices("nvidia.com/mig-7g.141gb", healthy(1))
        await node.kubelet.wait_for_devices("nvidia.com/mig-3g.71gb", lambda d: d == ())
        with pytest.raises(grpc.aio.AioRpcError, match="no longer has this resource"):
            await node.kubelet.allocate("nvidia.com/mig-3g.71gb", [old[0].ID], pod="p")


@pytest.mark.parametrize("listing", ["envvar", "cdi"])
@pytest.mark.parametrize("sharing", ["whole", "time-sliced", "mig"])
async def test_allocate_answers_through_grpc(host: HostRoot, listing: str, sharing: str) -> None:
    document: dict[str, object] = {"flags": {"plugin": {"deviceListStrategy": listing}}}
    resource = GPU
    nvml = sim_nvml(host, 8)
    if sharing == "time-sliced":
        document["sharing"] = {"timeSlicing": {"resources": [{"name": GPU, "replicas": 2}]}}
    elif sharing == "mig":
        document["flags"] = {"migStrategy": "mixed", "plugin": {"deviceListStrategy": listing}}
        nvml.enable_mig(0, ["3g.71gb", "3g.71gb"])
        resource = "nvidia.com/mig-3g.71gb"
    async with running_node(host, config=config(document), nvml=nvml) as node:
        devices = await node.kubelet.wait_for_devices(resource)
        chosen = [devices[0].ID, devices[1].ID]
        response = await node.kubelet.allocate(resource, chosen, pod="trainer")
        expected = list(dict.fromkeys(i.split("::")[0] for i in chosen))
        if sharing == "time-sliced":
            assert len(devices) == 16 and len(expected) == 1
        if listing == "envvar":
            assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": ",".join(expected)}
        else:
            assert [d.name for d in response.cdi_devices] == [f"{cdi.KIND}={u}" for u in expected]
            assert cdi.spec_path(host).is_file()


async def test_an_unknown_device_id_gets_an_error_that_names_it(host: HostRoot) -> None:
    async with running_node(host) as node:
        devices = await node.kubelet.wait_for_devices(GPU, healthy(8))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await node.kubelet.allocate(GPU, [devices[0].ID, "GPU-nowhere"], pod="p")
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "unknown device id 'GPU-nowhere'" in (refused.value.details() or "")
        assert node.kubelet.allocations == []


async def test_preferred_allocation_picks_the_same_numa_set(host: HostRoot) -> None:
    async with running_node(host) as node:
        devices = await node.kubelet.wait_for_devices(GPU, healthy(8))
        by_id = {d.ID: d.topology.nodes[0].ID for d in devices}
        available = [devices[0].ID, *(d.ID for d in devices[4:])]
        chosen = await node.kubelet.preferred_allocation(GPU, available, 3)
        assert {by_id[i] for i in chosen} == {1}
        assert chosen == await node.kubelet.preferred_allocation(GPU, available, 3)


async def test_pause_and_resume_around_a_driver_reload(host: HostRoot) -> None:
    async with running_node(host) as node:
        devices = await node.kubelet.wait_for_devices(GPU, healthy(8))
        await node.xid(devices[6].ID, 79)
        await node.kubelet.wait_for_devices(GPU, unhealthy(devices[6].ID))
        node.kernel.rmmod("nvidia_uvm")
        with pytest.raises(ModuleInUse, match="device-plugin"):
            node.kernel.rmmod("nvidia")  # NVML is held open

        pause = await node.command(
            device.PauseOperands(components=(driver.Component.GPU,)), "pause"
        )
        (paused,) = await node.confirmations(device.OperandPaused)
        assert paused.command_id == pause.id
        assert paused.service is device.OperandService.DEVICE_PLUGIN
        await node.kubelet.wait_for_devices(GPU, unhealthy(*(d.ID for d in devices)))
        assert not node.plugins.gpu_session_open
        node.kernel.rmmod("nvidia")  # nothing holds it now
        node.kernel.modprobe("nvidia")
        node.kernel.modprobe("nvidia_uvm")
        await node.validated()
        await node.command(device.ResumeOperands(), "resume")
        await node.confirmations(device.OperandResumed)
        await node.kubelet.wait_for_devices(GPU, healthy(8))
        assert node.kernel.holders("nvidia") == ("device-plugin",)


async def test_a_restarted_plugin_stays_paused(host: HostRoot, bus: InMemoryBus) -> None:
    async with running_node(host, bus=bus) as first:
        await first.kubelet.wait_for_devices(GPU, healthy(8))
        await first.command(device.PauseOperands(components=(driver.Component.GPU,)), "pause")
        await first.confirmations(device.OperandPaused)
    async with running_node(host, bus=bus) as restarted:
        await restarted.wait_readiness(True)
        assert restarted.plugins.paused == {driver.Component.GPU}
        assert not restarted.plugins.gpu_session_open
        assert restarted.kernel.holders("nvidia") == ()
        await restarted.command(device.ResumeOperands(), "resume")
        await restarted.kubelet.wait_for_devices(GPU, healthy(8))
        assert restarted.kernel.holders("nvidia") == ("device-plugin",)


async def test_rdma_shared_devices_are_served_and_paused_with_ofed(tmp_path: Path) -> None:
    host = build_host(tmp_path / "host", 1)
    add_hca(host.path, "mlx5_0", address="0000:3b:00.0", interfaces=("ens1f0",), uverbs=0)
    document = {
        "rdma": {
            "configList": [
                {"resourceName": "roce", "rdmaHcaMax": 4, "selectors": {"linkTypes": ["ether"]}}
            ]
        }
    }
    async with running_node(host, gpus=1, config=config(document)) as node:
        devices = await node.kubelet.wait_for_devices("rdma/roce", healthy(4))
        registration = next(r for r in node.kubelet.registrations if r.resource_name == "rdma/roce")
        assert registration.endpoint == "rdma-roce.sock"
        assert not registration.options.get_preferred_allocation_available
        response = await node.kubelet.allocate("rdma/roce", [devices[0].ID], pod="mpi")
        assert [d.host_path for d in response.devices] == [
            "/dev/infiniband/uverbs0",
            "/dev/infiniband/rdma_cm",
        ]
        await node.command(device.PauseOperands(components=(driver.Component.OFED,)), "pause")
        await node.kubelet.wait_for_devices("rdma/roce", unhealthy("0", "1", "2", "3"))
        assert node.kubelet.devices(GPU)[0].health == constants.HEALTHY


async def test_the_defaults_need_no_config(host: HostRoot) -> None:
    async with running_node(host, config=DevicePluginConfig()) as node:
        assert len(await node.kubelet.wait_for_devices(GPU, healthy(8))) == 8
