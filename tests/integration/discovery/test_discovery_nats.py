"""Discovery end to end: its node role on a simulated 8-GPU node and its cluster role, each
with its own connection to a real nats-server, label the Node on the simulated API server."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuop.bus import NatsServer
from gpuop.events import driver, new_event
from gpuop.host.roots import HostRoot
from gpuop.kube import client, nodes
from gpuop.runtime.settings import Role
from gpuop.services import discovery
from gpuop.services.discovery.labeler import HASH_ANNOTATION
from gpuop_sim import ApiServer
from gpuop_sim.cluster import hosts
from gpuop_sim.host.simkernel import SimKernel
from tests.support.services import in_process
from tests.support.waiting import eventually

NODE = "gpu-1.example.com"

pytestmark = pytest.mark.nats


@pytest.fixture
def host_root(tmp_path: Path) -> Path:
    return hosts.build_host_root(tmp_path / "host", NODE, 8).path


async def test_inventories_become_node_labels_and_follow_a_driver_reload(
    nats_server: NatsServer,
    server: ApiServer,
    kubeconfig: Path,
    kube: client.Kube,
    host_root: Path,
    tmp_path: Path,
) -> None:
    server.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    config = tmp_path / "discovery.yaml"
    config.write_text("heartbeat_interval_seconds: 0.5\nretry_interval_seconds: 0.2\n")

    async def labels() -> dict[str, str]:
        return nodes.labels_of(await nodes.get(kube, NODE))

    async def inventory_hash() -> str | None:
        return nodes.annotations_of(await nodes.get(kube, NODE)).get(HASH_ANNOTATION)

    async with (
        in_process(
            discovery.SERVICE, nats_server, role=Role.CLUSTER, kubeconfig=kubeconfig, config=config
        ) as cluster,
        in_process(
            discovery.SERVICE,
            nats_server,
            role=Role.NODE,
            node=NODE,
            host_root=host_root,
            nvml="sim:8",
            config=config,
        ) as agent,
    ):

        async def labelled() -> bool:
            return (await labels()).get("nvidia.com/gpu.count") == "8"

        await eventually(labelled)
        assert cluster.ready and agent.ready
        first = await labels()
        assert first["nvidia.com/gpu.product"] == "NVIDIA-H200"
        assert first["nvidia.com/cuda.driver-version.full"] == "580.159.04"
        assert first["feature.node.kubernetes.io/pci-10de.present"] == "true"
        first_hash = await inventory_hash()

        kernel = SimKernel(HostRoot(host_root))
        kernel.rmmod("nvidia_uvm")
        kernel.rmmod("nvidia")
        unloaded = driver.DriverUnloaded(
            command_id="unload-1", component=driver.Component.GPU, version="580.159.04"
        )
        await agent.bus.publish(new_event(unloaded, node=NODE, source="/gpuop/driver-manager"))

        async def relabelled() -> bool:
            return await inventory_hash() not in (None, first_hash)

        await eventually(relabelled)
        # the driver is out for the reload: the GPU labels stay, selectors do not flap
        assert (await labels())["nvidia.com/gpu.count"] == "8"
