"""GPUs through the real kubelet: gpuop's device plugin, run as `gpuop run device-plugin` on
the real node (its host root the simulated GPU node's, NVML `sim:8`, NATS on loopback),
registers with the kubelet's device manager, and the node offers `nvidia.com/gpu: 8`. A pod
asking for 2 is admitted by the kubelet; containerd injects the CDI devices the plugin named
from the spec `gpuop cdi generate` wrote for the driver in use, and the container itself
lists exactly 2 GPU device nodes, the control nodes the driver-manager's load made, and the
driver's `libnvidia-ml.so.1` mounted from the spec. A kubelet restart deletes the plugin's
socket and the plugin registers again; a GPU telemetry marks unhealthy (an XID) leaves
the node's allocatable."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gpuop.bus import NatsBus, NatsServer
from gpuop.events import device, new_event
from gpuop.host import cdi
from gpuop.host.roots import HostRoot
from tests.integration.real_node.conftest import GPUS
from tests.support import real_node
from tests.support.node_pods import pod, running
from tests.support.real_node import RealNode
from tests.support.services import connected
from tests.support.waiting import eventually

pytestmark = [pytest.mark.real_node, pytest.mark.nats]

GPU = "nvidia.com/gpu"
WAIT = {"timeout": 120, "interval": 0.5}
CONTROL = ("nvidiactl", "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools")
LIBRARY = f"{cdi.LIBRARY_DIR}/libnvidia-ml.so.1"
LISTING = f"ls -l /dev | grep nvidia; ls -lL {LIBRARY}; echo library: $(cat {LIBRARY}); echo done; "
REGISTERED = re.compile(r"registration request from device plugin with resource.*nvidia\.com/gpu")
"""The kubelet's log line for a registration (`--v=1` shows it)."""


@asynccontextmanager
async def device_plugin(node: RealNode, nats: NatsServer) -> AsyncIterator[None]:
    """The complete CDI spec written as the driver-manager writes it after a load, then
    `gpuop run device-plugin` on the node as its DaemonSet runs it; stopped after (exit 0)."""
    gpuop = [sys.executable, "-m", "gpuop.cli.main"]
    host = ["--host-root", str(node.host_root), "--nvml", f"sim:{GPUS}", "--node", node.name]
    spec = cdi.spec_path(HostRoot(node.host_root))
    generate = [*gpuop, "cdi", "generate", *host, "--out", str(spec)]
    await asyncio.to_thread(subprocess.run, generate, check=True)
    log = node.work / "device-plugin.log"
    before = len(kubelet_log(node))
    with log.open("ab") as out:
        process = await asyncio.create_subprocess_exec(
            *gpuop, "run", "device-plugin", "--role", "node", *host, "--nats", nats.url,
            "--metrics-listen", "127.0.0.1:0", "--log-format", "text",
            stdout=out, stderr=out,
        )  # fmt: skip
    try:
        # this plugin's registration: a stopped one's devices stay on the node a while
        await eventually(lambda: REGISTERED.search(kubelet_log(node)[before:]), **WAIT)
        yield
    except BaseException:
        process.terminate()
        await asyncio.wait_for(process.wait(), 30)
        raise
    process.terminate()
    code = await asyncio.wait_for(process.wait(), 30)
    assert code == 0, log.read_text()


def gpus(node: RealNode) -> tuple[str | None, str | None]:
    """The node's `nvidia.com/gpu` capacity and allocatable, as the kubelet reports them."""
    status = node.plane.call("GET", f"/api/v1/nodes/{node.name}")["status"]
    return status.get("capacity", {}).get(GPU), status.get("allocatable", {}).get(GPU)


async def offered(node: RealNode, capacity: str, allocatable: str) -> dict[str, Any]:
    await eventually(lambda: gpus(node) == (capacity, allocatable), **WAIT)
    status: dict[str, Any] = node.plane.call("GET", f"/api/v1/nodes/{node.name}")["status"]
    print(f"node {node.name} allocatable: {json.dumps(status['allocatable'], sort_keys=True)}")
    return status


def gpu_pod(name: str, count: int) -> dict[str, Any]:
    manifest = pod(name, LISTING)
    manifest["spec"]["containers"][0]["resources"] = {"limits": {GPU: count}}
    return manifest


def kubelet_log(node: RealNode) -> str:
    return (node.work / "kubelet.log").read_text(errors="replace")


async def test_the_plugin_registers_and_the_node_offers_8_gpus(
    node: RealNode, nats_server: NatsServer
) -> None:
    async with device_plugin(node, nats_server):
        status = await offered(node, str(GPUS), str(GPUS))
        plugins = sorted(p.name for p in real_node.DEVICE_PLUGINS.iterdir())

    assert status["capacity"][GPU] == status["allocatable"][GPU] == "8"
    assert REGISTERED.search(kubelet_log(node))
    assert "nvidia-gpu.sock" in plugins and "kubelet.sock" in plugins


async def test_a_pod_asking_for_2_gpus_sees_2_gpus_the_control_nodes_and_the_library(
    node: RealNode, nats_server: NatsServer
) -> None:
    async with device_plugin(node, nats_server):
        await offered(node, str(GPUS), str(GPUS))
        async with running(node, gpu_pod("cuda", 2)) as current:
            log = current["log"]
            (container,) = node.crictl("ps", "--name", "main", "--quiet").stdout.split()
            inspected = json.loads(node.crictl("inspect", container).stdout)

    listed = {
        fields[-1]: fields[0][0] + " " + fields[4] + fields[5]
        for line in log.splitlines()
        if (fields := line.split()) and fields[-1].startswith("nvidia")
    }
    gpu_nodes = sorted(n for n in listed if re.fullmatch(r"nvidia\d+", n))
    assert len(gpu_nodes) == 2, log
    assert set(listed) == {*gpu_nodes, *CONTROL}, log
    for name in gpu_nodes:
        assert listed[name] == f"c 195,{name.removeprefix('nvidia')}", log
    assert listed["nvidia-uvm"] == "c 235,0" and listed["nvidiactl"] == "c 195,255", log
    assert f"library: userspace/lib/libnvidia-ml.so.{_version(node)}" in log
    # the names the plugin gave are the complete spec's, which the runtime resolved
    devices = [d["name"] for d in inspected["info"]["config"]["CDI_devices"]]
    assert len(devices) == 2 and all(d.startswith(f"{cdi.KIND}=GPU-") for d in devices), devices


async def test_a_kubelet_restart_re_registers_the_plugin(
    node: RealNode, nats_server: NatsServer
) -> None:
    """The restarting kubelet deletes the plugin's socket; the plugin serves it again and
    registers once with the new kubelet, which then admits a GPU pod."""
    async with device_plugin(node, nats_server):
        await offered(node, str(GPUS), str(GPUS))
        before = len(kubelet_log(node))

        node.restart_kubelet()
        await eventually(lambda: REGISTERED.search(kubelet_log(node)[before:]), **WAIT)
        await offered(node, str(GPUS), str(GPUS))
        async with running(node, gpu_pod("after-restart", 1)) as current:
            log = current["log"]
        restarted = kubelet_log(node)[before:]

    assert len(REGISTERED.findall(restarted)) == 1, restarted
    assert "already connected" not in restarted
    assert len(re.findall(r" nvidia\d+$", log, re.MULTILINE)) == 1, log


async def test_a_gpu_marked_unhealthy_leaves_allocatable(
    node: RealNode, nats_server: NatsServer
) -> None:
    async with device_plugin(node, nats_server), connected(nats_server, "telemetry") as bus:
        await offered(node, str(GPUS), str(GPUS))
        uuids = [n for n in cdi.device_names(_spec(node)) if n.startswith("GPU-")]
        await xid(bus, node.name, uuids[3], 79)

        status = await offered(node, str(GPUS), str(GPUS - 1))

    assert status["capacity"][GPU] == "8" and status["allocatable"][GPU] == "7"


async def xid(bus: NatsBus, node: str, gpu_uuid: str, number: int) -> None:
    """What telemetry publishes when a GPU reports an XID that takes it out of service."""
    event = device.DeviceHealthChanged(
        gpu_uuid=gpu_uuid, healthy=False, reason=device.HealthReason.XID, xid=number
    )
    await bus.publish(new_event(event, node=node, source="/gpuop/telemetry/test"))


def _spec(node: RealNode) -> Path:
    return cdi.spec_path(HostRoot(node.host_root))


def _version(node: RealNode) -> str:
    return (node.host_root / "opt/gpuop/gpu/current").readlink().name
