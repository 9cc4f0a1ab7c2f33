"""A driver-manager on a simulated host for tests: a seeded host root, a driver source, the
agent consuming from a bus, and helpers that send a command and wait for its answer."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry

from gpuop.bus import Bus, Subscription
from gpuop.clocks import Clock, VirtualClock
from gpuop.events import Command, Envelope, Event, decode, new_command, subjects
from gpuop.events import driver as dm
from gpuop.host import packaging
from gpuop.host.roots import HostRoot
from gpuop.runtime.settings import Settings
from gpuop.services.driver_manager import agent as agents
from gpuop.services.driver_manager.anchors import TrustAnchor
from gpuop.services.driver_manager.config import DriverManagerConfig
from gpuop.services.driver_manager.state import StateStore
from gpuop_sim import recordings
from gpuop_sim.host import keys, seeding

NODE = "n1"
KERNEL = "6.18.44-fc-v657-gpu"
OLD = seeding.RECORDED_DRIVER_VERSION
NEW = "580.200.01"
OFED_OLD = "24.10-1.1.4.0"
OFED_NEW = "25.01-0.6.0.0"
BOOT_ID = "8c1f2f5e-0c53-4d57-a0a4-3e3c1b0c9a11"
SAGA = "saga-n1-1"

TRUSTED = TrustAnchor.model_validate(keys.TRUST)
"""The simulated node's driver trust anchor: the simulation's key, local and loopback sources."""

_ids = itertools.count(1)


def recorded_host() -> Path:
    return recordings.H200_HOST_ROOT


def seed(directory: Path, *, ofed: bool = False) -> HostRoot:
    """A simulated H200 host running GPU driver 580.159.04 (and OFED 24.10 when asked)."""
    return seeding.seed_host_root(
        directory, recorded_host(), ofed_version=OFED_OLD if ofed else None, boot_id=BOOT_ID
    )


def build_source(directory: Path) -> tuple[packaging.BuiltPackage, ...]:
    """The test source: both GPU and both OFED versions, signed with the simulation's key
    (which `source_of` trusts)."""
    return packaging.build_driver_source(
        directory,
        [
            ("gpu", OLD, KERNEL),
            ("gpu", NEW, KERNEL),
            ("ofed", OFED_OLD, KERNEL),
            ("ofed", OFED_NEW, KERNEL),
        ],
        signing_key=keys.SIGNING_KEY,
    )


def rewrite_index(directory: Path, change: dict[str, dict[str, str]], *, sign: bool = True) -> None:
    """Change fields of index entries, keyed by archive file name, and sign the new index
    (as its publisher would); `sign=False` leaves the old signature, as a tamperer would."""
    path = directory / packaging.INDEX
    index = json.loads(path.read_text())
    for entry in index["packages"]:
        entry.update(change.get(entry["file"], {}))
    path.write_text(json.dumps(index))
    if sign:
        packaging.sign_driver_source(directory, keys.SIGNING_KEY)


def command_id() -> str:
    return f"cmd-{next(_ids):04d}"


@dataclass
class Harness:
    """An agent consuming its node's commands from `bus`."""

    bus: Bus
    root: HostRoot
    source: Path
    registry: CollectorRegistry
    store: StateStore
    subscription: Subscription
    sent: list[str] = field(default_factory=list)

    async def send(self, command: Command, id: str | None = None, timeout: float = 10.0) -> Event:
        """Publish `command` and wait for its result event."""
        envelope = self.command(command, id)
        await self.bus.publish(envelope)
        answer = await self.result(envelope.id, timeout)
        assert answer is not None, f"no result for {envelope.id}"
        return answer[1]

    def command(self, command: Command, id: str | None = None) -> Envelope:
        cid = id or command_id()
        self.sent.append(cid)
        return new_command(command, node=NODE, source="/gpuop/test", id=cid, correlationid=SAGA)

    async def result(self, command_id: str, timeout: float = 10.0) -> tuple[Envelope, Event] | None:
        """The result of `command_id`, waiting up to `timeout`; None when none came."""
        return await result_of(self.bus, command_id, timeout)

    async def events(self) -> list[tuple[Envelope, Event]]:
        return await driver_events(self.bus)

    def counted(self, verb: str, outcome: str) -> float:
        value = self.registry.get_sample_value(
            "gpuop_driver_commands_total", {"verb": verb, "outcome": outcome}
        )
        return value or 0.0

    async def wait_counted(self, verb: str, outcome: str, count: float) -> None:
        async with asyncio.timeout(10):
            while self.counted(verb, outcome) < count:
                await asyncio.sleep(0.01)

    async def install_load_validate(self, version: str, flavour: dm.Flavour | None) -> None:
        """Install (from this harness's source), load and validate the GPU driver `version`,
        asserting each result."""
        gpu = dm.Component.GPU
        installed = await self.send(
            dm.InstallDriver(
                component=gpu, version=version, source=source_of(self.source), flavour=flavour
            ),
            timeout=120,
        )
        assert isinstance(installed, dm.DriverInstalled), installed
        loaded = await self.send(dm.LoadDriver(component=gpu, version=version), timeout=60)
        assert isinstance(loaded, dm.DriverLoaded), loaded
        validated = await self.send(
            dm.ValidateDriver(component=gpu, version=version, timeout_seconds=30), timeout=60
        )
        assert isinstance(validated, dm.DriverValidated), validated


async def driver_events(bus: Bus) -> list[tuple[Envelope, Event]]:
    """Every driver event about the test node, in stream order."""
    found = []
    async for stored in bus.read(subjects.events_filter("driver", NODE, prefix=bus.prefix)):
        envelope, payload = decode(stored.data)
        assert isinstance(payload, Event)
        found.append((envelope, payload))
    return found


async def result_of(
    bus: Bus, command_id: str, timeout: float = 10.0
) -> tuple[Envelope, Event] | None:
    """The result event of `command_id`, waiting up to `timeout`; None when none came."""
    wanted = agents.result_id(command_id)
    try:
        async with asyncio.timeout(timeout):
            while True:
                for envelope, payload in await driver_events(bus):
                    if envelope.id == wanted:
                        return envelope, payload
                await asyncio.sleep(0.01)
    except TimeoutError:
        return None


async def wait_for_result(bus: Bus, command_id: str, timeout: float = 10.0) -> Event:
    answer = await result_of(bus, command_id, timeout)
    assert answer is not None, f"no result for {command_id}"
    return answer[1]


def settings_for(root: HostRoot, nvml: str = "sim:8") -> Settings:
    return Settings(service=dm.SERVICE, node=NODE, host_root=root.path, nvml=nvml)


@asynccontextmanager
async def running_agent(
    bus: Bus,
    root: HostRoot,
    source: Path,
    config: DriverManagerConfig | None = None,
    clock: Clock | None = None,
) -> AsyncIterator[Harness]:
    """An agent on `root` consuming from `bus` until the block ends."""
    config = config or DriverManagerConfig(trust=TRUSTED)
    registry = CollectorRegistry()
    executor = agents.build_executor(settings_for(root), config, clock or VirtualClock())
    store = StateStore(root)
    agent = agents.CommandAgent(bus, NODE, executor, store, registry)
    subscription = await bus.consume(agent.consumer_spec(config), agent.handle)
    try:
        yield Harness(bus, root, source, registry, store, subscription)
    finally:
        await subscription.stop()


def source_of(directory: Path | str, sha256: str | None = None) -> dm.DriverSource:
    """`directory` (or a URL) as a command names it, trusting the simulation's key."""
    return dm.DriverSource(uri=str(directory), sha256=sha256, public_keys=(keys.PUBLIC_KEY,))
