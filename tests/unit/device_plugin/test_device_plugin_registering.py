"""How the registrar notices what happens in the device-plugin directory: through its inotify
watch (the polls set to an hour here, so nothing else could), through the fast poll where
no watch can be set, and its retries on time either way; the kubelet is a file here and a
registration a call recorded, the gRPC side being the integration tests' part."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gpuop.host import inotify
from gpuop.kubelet import constants
from gpuop.services.device_plugin import registering
from gpuop.services.device_plugin.errors import RegistrationFailed
from gpuop.services.device_plugin.metrics import PluginMetrics

AN_HOUR = 3600.0
NOTICED_WITHIN = 2.0


class FakeServer:
    """The part of a `PluginServer` the registrar uses; serves while its socket file is
    there."""

    def __init__(self, directory: Path, name: str = "nvidia.com/gpu") -> None:
        self.name = name
        self.socket = directory / "nvidia-gpu.sock"
        self.options = None
        self.restarts = 0

    @property
    def serving(self) -> bool:
        return self.socket.exists()

    async def restart(self) -> None:
        self.restarts += 1
        self.socket.touch()


class Kubelet:
    """A kubelet.sock that a restart replaces, and the registrations it received."""

    def __init__(self, directory: Path) -> None:
        self.socket = directory / constants.KUBELET_SOCKET
        self.registrations: list[str] = []
        self.refusals = 0
        """Registrations to refuse before answering again."""

    def start(self) -> None:
        self.socket.unlink(missing_ok=True)
        self.socket.touch()

    async def register(self, socket: Path, server: FakeServer, *, timeout: float) -> None:
        if self.refusals:
            self.refusals -= 1
            raise RegistrationFailed(f"{server.name}: the kubelet answered UNAVAILABLE")
        self.registrations.append(server.name)

    async def wait_for_registrations(self, count: int) -> None:
        async with asyncio.timeout(NOTICED_WITHIN):
            while len(self.registrations) < count:
                await asyncio.sleep(0.01)


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    path = tmp_path / "device-plugins"
    path.mkdir()
    return path


@pytest.fixture
def kubelet(directory: Path, monkeypatch: pytest.MonkeyPatch) -> Kubelet:
    fake = Kubelet(directory)
    monkeypatch.setattr(registering, "register", fake.register)
    return fake


@pytest.fixture
def no_inotify(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse() -> int:
        raise inotify.WatchUnavailable("inotify refused: Too many open files")

    monkeypatch.setattr(inotify, "_init", refuse)


@asynccontextmanager
async def running(
    directory: Path,
    server: FakeServer,
    *,
    poll_interval: float = AN_HOUR,
    retry_interval: float = 0.2,
) -> AsyncIterator[registering.Registrar]:
    registrar = registering.Registrar(
        directory,
        lambda: [server],  # type: ignore[list-item]
        PluginMetrics(CollectorRegistry()),
        poll_interval=poll_interval,
        safety_interval=AN_HOUR,
        timeout=1.0,
        retry_interval=retry_interval,
    )
    stopping = asyncio.Event()
    task = asyncio.create_task(registrar.run(stopping))
    try:
        yield registrar
    finally:
        stopping.set()
        await asyncio.wait_for(task, NOTICED_WITHIN)


def inotify_descriptors() -> int:
    count = 0
    for entry in os.scandir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # scandir's own descriptor, closed
            count += os.readlink(entry.path) == "anon_inode:inotify"
    return count


@pytest.fixture
def no_leaked_watch() -> Iterator[None]:
    before = inotify_descriptors()
    yield
    assert inotify_descriptors() == before, "the watch's descriptor was left open"


@pytest.mark.usefixtures("no_leaked_watch")
async def test_a_kubelet_restart_is_noticed_through_the_watch(
    directory: Path, kubelet: Kubelet
) -> None:
    server = FakeServer(directory)
    kubelet.start()
    async with running(directory, server):
        await kubelet.wait_for_registrations(1)
        assert server.restarts == 1, "served before registering"
        kubelet.start()
        await kubelet.wait_for_registrations(2)


@pytest.mark.usefixtures("no_leaked_watch")
async def test_a_deleted_server_socket_is_served_again_and_registered_through_the_watch(
    directory: Path, kubelet: Kubelet
) -> None:
    server = FakeServer(directory)
    kubelet.start()
    async with running(directory, server):
        await kubelet.wait_for_registrations(1)
        server.socket.unlink()
        await kubelet.wait_for_registrations(2)
        assert server.restarts == 2


@pytest.mark.usefixtures("no_leaked_watch")
async def test_a_kubelet_that_appears_later_is_noticed_through_the_watch(
    directory: Path, kubelet: Kubelet
) -> None:
    async with running(directory, FakeServer(directory)):
        await asyncio.sleep(0.05)
        assert kubelet.registrations == []
        kubelet.start()
        await kubelet.wait_for_registrations(1)


@pytest.mark.usefixtures("no_leaked_watch")
async def test_a_refused_registration_is_retried_after_the_retry_interval_with_the_watch_set(
    directory: Path, kubelet: Kubelet
) -> None:
    kubelet.refusals = 1
    kubelet.start()
    async with running(directory, FakeServer(directory), poll_interval=0.05):
        await kubelet.wait_for_registrations(1)


@pytest.mark.usefixtures("no_inotify")
async def test_without_inotify_the_poll_notices_a_kubelet_restart(
    directory: Path, kubelet: Kubelet
) -> None:
    kubelet.start()
    async with running(directory, FakeServer(directory), poll_interval=0.05):
        await kubelet.wait_for_registrations(1)
        kubelet.start()
        await kubelet.wait_for_registrations(2)


@pytest.mark.usefixtures("no_leaked_watch")
async def test_a_directory_that_appears_later_is_polled_then_watched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "device-plugins"
    kubelet = Kubelet(directory)
    monkeypatch.setattr(registering, "register", kubelet.register)
    before = inotify_descriptors()
    async with running(directory, FakeServer(directory), poll_interval=0.05):
        await asyncio.sleep(0.1)
        assert inotify_descriptors() == before, "nothing to watch yet"
        directory.mkdir()
        kubelet.start()
        await kubelet.wait_for_registrations(1)
        async with asyncio.timeout(NOTICED_WITHIN):
            while inotify_descriptors() == before:
                await asyncio.sleep(0.01)


@pytest.mark.usefixtures("no_leaked_watch")
async def test_stopping_the_registrar_closes_its_watch(directory: Path, kubelet: Kubelet) -> None:
    before = inotify_descriptors()
    kubelet.start()
    async with running(directory, FakeServer(directory)):
        await kubelet.wait_for_registrations(1)
        assert inotify_descriptors() == before + 1
    assert inotify_descriptors() == before


async def test_a_registration_the_restarted_kubelet_took_is_not_made_twice(
    directory: Path, kubelet: Kubelet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restarting kubelet deletes the plugin sockets before it makes its new kubelet.sock:
    the server is served again and its registration waits for the new kubelet, which takes
    it. The new kubelet.sock seen next is no restart to register again for: the real kubelet
    refuses a second connection to the same socket (`device plugin already connected`) and,
    having dropped the first one's client on the way, never lets the plugin in again."""
    server = FakeServer(directory)
    kubelet.start()
    registrar = registering.Registrar(
        directory,
        lambda: [server],  # type: ignore[list-item]
        PluginMetrics(CollectorRegistry()),
        retry_interval=0.0,
    )
    await registrar.sync()
    assert kubelet.registrations == ["nvidia.com/gpu"]

    async def restarted_while_waiting(socket: Path, plugin: FakeServer, *, timeout: float) -> None:
        kubelet.start()  # the new kubelet's socket appears; it answers the waiting call
        kubelet.registrations.append(plugin.name)

    server.socket.unlink()  # the restarting kubelet's cleanup
    monkeypatch.setattr(registering, "register", restarted_while_waiting)
    await registrar.sync()
    monkeypatch.setattr(registering, "register", kubelet.register)
    await registrar.sync()

    assert kubelet.registrations == ["nvidia.com/gpu"] * 2
    kubelet.start()  # a restart that deletes nothing is still one to register again for
    await registrar.sync()
    assert kubelet.registrations == ["nvidia.com/gpu"] * 3
