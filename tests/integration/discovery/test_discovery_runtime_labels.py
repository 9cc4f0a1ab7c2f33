"""Discovery end to end on a simulated node: its node role on the simulated host root and its
cluster role, each with its own connection to a real nats-server, put `nvidia.com/cdi.ready`
and `gpuop.io/runtime.nvidia` on the Node once the CDI spec and the containerd drop-in are
both there, and take them off when the spec breaks; the node role notices each file through
its watch, long before its scan period."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuop.bus import NatsServer
from gpuop.inventory.labeling import CDI_READY, RUNTIME_NVIDIA
from gpuop.kube import client, nodes
from gpuop.runtime.settings import Role
from gpuop.services import discovery
from gpuop.services.discovery.labeler import HASH_ANNOTATION
from gpuop.services.discovery.watching import DIRECTORIES
from gpuop_sim import ApiServer
from gpuop_sim.cluster import hosts
from tests.support import container_runtimes as files
from tests.support.services import in_process
from tests.support.waiting import eventually

NODE = "gpu-1.example.com"

pytestmark = pytest.mark.nats


async def test_readiness_labels_follow_the_spec_and_the_drop_in(
    nats_server: NatsServer,
    server: ApiServer,
    kubeconfig: Path,
    kube: client.Kube,
    tmp_path: Path,
) -> None:
    host = hosts.build_host_root(tmp_path / "host", NODE, 8)
    for directory in DIRECTORIES:  # as a node with containerd and CDI has them
        host.join(directory).mkdir(parents=True, exist_ok=True)
    server.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    config = tmp_path / "discovery.yaml"
    # an hour between scans: only the watch can make the node role look again in time
    config.write_text("scan_interval_seconds: 3600\nretry_interval_seconds: 0.2\n")

    async def labels() -> dict[str, str]:
        return nodes.labels_of(await nodes.get(kube, NODE))

    async def inventory_hash() -> str | None:
        return nodes.annotations_of(await nodes.get(kube, NODE)).get(HASH_ANNOTATION)

    async def gpus_labelled() -> bool:
        return (await labels()).get("nvidia.com/gpu.count") == "8"

    async def ready() -> bool:
        return (await labels()).get(CDI_READY) == "true"

    async def not_ready() -> bool:
        return CDI_READY not in await labels()

    async with (
        in_process(
            discovery.SERVICE, nats_server, role=Role.CLUSTER, kubeconfig=kubeconfig, config=config
        ),
        in_process(
            discovery.SERVICE,
            nats_server,
            role=Role.NODE,
            node=NODE,
            host_root=host.path,
            nvml="sim:8",
            config=config,
        ),
    ):
        await eventually(gpus_labelled)
        first_hash = await inventory_hash()

        async def relabelled() -> bool:
            return await inventory_hash() not in (None, first_hash)

        files.write_spec(host, gpus=8)
        await eventually(relabelled)
        assert await not_ready()  # the spec alone: no runtime with the handler yet

        files.containerd_with_handler(host, version=2)
        await eventually(ready)
        assert (await labels())[RUNTIME_NVIDIA] == "true"

        files.write(host, files.SPEC, '{"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu"}')
        await eventually(not_ready)
        after = await labels()
        assert RUNTIME_NVIDIA not in after
        assert after["nvidia.com/gpu.count"] == "8"
