"""The device plugin's cluster role on the simulated API server and an in-memory bus: one
of each per test, and the role running until the test ends (`running`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import pytest

from gpuop.bus import Buckets, InMemoryBus
from gpuop.events.device_api_commands import DeviceApi, DeviceApiApplied
from gpuop.events.envelope import Event, new_event
from gpuop.kube import client
from gpuop.services.device_plugin.cluster.role import DraPublisher, consumer_spec
from gpuop_sim import ApiServer
from tests.support import node_agents
from tests.support.inventories import inventory

Running = Callable[[], AbstractAsyncContextManager[DraPublisher]]
NODE = "node-1"


@pytest.fixture
async def server() -> AsyncIterator[ApiServer]:
    async with ApiServer(bookmark_interval=0.2) as running:
        yield running


@pytest.fixture
async def kube(server: ApiServer, tmp_path: Path) -> AsyncIterator[client.Kube]:
    async with await client.connect(server.write_kubeconfig(tmp_path / "kubeconfig")) as kube:
        yield kube


@pytest.fixture
async def bus() -> AsyncIterator[InMemoryBus]:
    memory = InMemoryBus()
    await memory.start()
    yield memory
    await memory.close()


@pytest.fixture
def running(bus: InMemoryBus, kube: client.Kube) -> Running:
    """Start the role as `run` does (restore, consume, sync and watch); stop it on exit."""

    @asynccontextmanager
    async def start() -> AsyncIterator[DraPublisher]:
        publisher = DraPublisher(bus, kube, retry_delay=0.05, resync_interval=3600)
        await publisher.restore()
        subscription = await bus.consume(
            consumer_spec(bus.prefix, retry_delay=0.05), publisher.handle
        )
        try:
            async with node_agents.running(publisher):
                yield publisher
        finally:
            await subscription.stop()

    return start


async def send(bus: InMemoryBus, event: Event, node: str = NODE) -> None:
    await bus.publish(new_event(event, node=node, source="/gpuop/test"))


async def add_node(kube: client.Kube, name: str = NODE) -> str:
    body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
    created = await kube.call(kube.core.create_node, body)
    return str(created["metadata"]["uid"])


def serving(api: DeviceApi = DeviceApi.DRA, on: bool = True) -> DeviceApiApplied:
    return DeviceApiApplied(api=api, serving=on)


@pytest.fixture
async def serving_node(bus: InMemoryBus, kube: client.Kube) -> str:
    """`dra_node`, for tests that start with one."""
    return await dra_node(bus, kube)


async def dra_node(bus: InMemoryBus, kube: client.Kube) -> str:
    """A Node serving DRA, its inventory in the bucket too, as discovery keeps it; its uid."""
    uid = await add_node(kube)
    await (await bus.kv(Buckets.NODES)).put(NODE, inventory().model_dump_json().encode())
    await send(bus, inventory())
    await send(bus, serving())
    return uid


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.02)
