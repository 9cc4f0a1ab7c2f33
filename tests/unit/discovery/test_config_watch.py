"""Discovery notices a new CDI spec or runtime drop-in at once: the inotify watches on the
spec and configuration directories wake its scan, a directory that appears later is watched
then, and a node agent publishes the inventory that makes the node ready without waiting
for its scan period."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from gpuop.bus import InMemoryBus
from gpuop.events import hardware
from gpuop.host.roots import HostRoot
from gpuop.inventory import containers
from gpuop.services.discovery.node_agent import NodeAgent
from gpuop.services.discovery.watching import DIRECTORIES, ConfigWatch
from tests.support import container_runtimes as files
from tests.support.node_agents import published, running

Discovered = hardware.HardwareDiscovered


@asynccontextmanager
async def watching(root: HostRoot, recheck_seconds: float = 5.0) -> AsyncIterator[asyncio.Event]:
    wake, stopping = asyncio.Event(), asyncio.Event()
    watch = ConfigWatch(root, recheck_seconds=recheck_seconds, settle_seconds=0.01)
    task = asyncio.create_task(watch.run(wake, stopping))
    await asyncio.sleep(0.05)  # the watches are set
    try:
        yield wake
    finally:
        stopping.set()
        await asyncio.wait_for(task, 5)


async def woken(wake: asyncio.Event, within: float = 2.0) -> bool:
    try:
        await asyncio.wait_for(wake.wait(), within)
    except TimeoutError:
        return False
    wake.clear()
    return True


def make_directories(root: HostRoot) -> None:
    for directory in DIRECTORIES:
        root.join(directory).mkdir(parents=True, exist_ok=True)


async def test_a_spec_written_atomically_wakes_the_scan(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    make_directories(root)
    async with watching(root) as wake:
        assert not await woken(wake, within=0.2)
        files.write_spec(root)
        assert await woken(wake)


async def test_a_drop_in_rewritten_in_place_wakes_the_scan(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    files.containerd_with_handler(root)
    async with watching(root) as wake:
        with root.join(files.CONTAINERD_DROP_IN).open("a") as stream:
            stream.write("# edited\n")
        assert await woken(wake)


async def test_a_spec_directory_that_appears_later_is_watched_and_wakes(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    async with watching(root, recheck_seconds=0.05) as wake:
        assert not await woken(wake, within=0.2)
        files.write_spec(root)  # makes var/run/cdi with the spec in it
        assert await woken(wake)
        files.write_spec(root, gpus=4)
        assert await woken(wake)


async def test_a_removed_directory_is_watched_again_when_it_comes_back(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    spec = files.write_spec(root)
    async with watching(root, recheck_seconds=0.05) as wake:
        spec.unlink()
        spec.parent.rmdir()
        assert await woken(wake)
        files.write_spec(root)
        assert await woken(wake)


async def test_a_host_root_without_any_of_the_directories_is_no_error(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    root.join("etc").mkdir()
    root.join("etc/cdi").write_text("a file where the directory belongs")
    async with watching(root, recheck_seconds=0.05) as wake:
        assert not await woken(wake, within=0.3)


async def test_the_watches_are_closed_when_discovery_stops(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    make_directories(root)
    before = len(os.listdir("/proc/self/fd"))
    watch = ConfigWatch(root)
    wake, stopping = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(watch.run(wake, stopping))
    await asyncio.sleep(0.05)
    assert len(watch.watched) == len(DIRECTORIES)
    stopping.set()
    await asyncio.wait_for(task, 5)

    assert watch.watched == ()
    assert len(os.listdir("/proc/self/fd")) == before


async def test_the_agent_publishes_readiness_as_soon_as_spec_and_drop_in_land(
    bus: InMemoryBus, make_agent: Callable[..., NodeAgent], host: HostRoot
) -> None:
    # QUIET: an hour between scans, so only the watch can make the agent scan again
    make_directories(host)
    agent = make_agent()
    async with running(agent):
        [(_, first)] = await _inventories(bus, 1)
        files.containerd_with_handler(host)
        files.write_spec(host, gpus=2)
        *_, (_, ready) = await _inventories(bus, 2, until=containers.ready)
        files.write(host, files.SPEC, "{")
        *_, (_, broken) = await _inventories(bus, 3, until=lambda i: not containers.ready(i))

    assert not containers.ready(first)
    assert ready.cdi_specs[0].device_count == 3
    assert broken.cdi_specs[0].error is not None


async def _inventories(
    bus: InMemoryBus,
    count: int,
    until: Callable[[Discovered], bool] = lambda _: True,
    timeout: float = 5.0,
) -> list[tuple[object, Discovered]]:
    async with asyncio.timeout(timeout):
        while True:
            found = await published(bus, Discovered)
            if len(found) >= count and until(found[-1][1]):
                return list(found)
            await asyncio.sleep(0.02)
