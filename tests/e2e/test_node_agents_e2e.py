"""The node agents end to end: a real nats-server, the simulated cluster, and discovery (node
and cluster roles) and the driver-manager each running as its own `gpuop run` process on one
simulated 8-GPU node. The test acts only as the upgrade orchestrator would: it sends driver
commands on the bus and learns their outcome from events on the bus alone, then reads the
Node's labels through the official client, as any Kubernetes user would, and watches them
throughout: a driver reload must not make a GPU label blink."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpuop.bus import NatsBus, NatsServer
from gpuop.events import Command, Envelope, Event, decode, ids, new_command, subjects
from gpuop.events import driver as dm
from gpuop.events.hardware import HardwareDiscovered, RescanHardware
from gpuop.host import packaging, system
from gpuop.kube import client, nodes
from gpuop.kube.watching import ListWatch
from gpuop_sim import SimCluster
from gpuop_sim.cluster import hosts
from gpuop_sim.host import keys, seeding
from tests.support.processes import DISCOVERY_CONFIG, DRIVER_LABEL, DRIVER_MANAGER_CONFIG, service

pytestmark = pytest.mark.nats

OLD = seeding.RECORDED_DRIVER_VERSION
NEW = "580.200.01"
ABSENT = "580.999.99"
"""A version the driver source has no package of."""
GPUS = 8
SAGA = "e2e-upgrade-1"
COUNT_LABEL = "nvidia.com/gpu.count"
STEP_TIMEOUT = 20.0
"""Seconds one command may take to be answered, or one observation to come true."""


@dataclass
class Agents:
    """The running stack of one simulated node, as the test sees it: the bus and the API."""

    node: str
    bus: NatsBus
    kube: client.Kube
    source: Path
    logs: list[Path]
    label_history: list[dict[str, str]]
    """The Node's labels after every change the API server reported, oldest first."""
    sent: list[str] = field(default_factory=list)
    """Ids of the driver commands the test sent, in order."""

    def tail_of_logs(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-4000:]}" for log in self.logs)

    async def send(self, command: Command, step: str) -> dm.DriverResult:
        """Publish `command` as saga step `step` and return the driver event answering it."""
        cid = ids.step(SAGA, step, 1)
        self.sent.append(cid)
        await self.bus.publish(
            new_command(command, node=self.node, source="/gpuop/e2e", id=cid, correlationid=SAGA)
        )
        _, answer = await self.next_event(
            "driver", lambda _, payload: getattr(payload, "command_id", None) == cid
        )
        assert isinstance(answer, dm.DriverResult)
        return answer

    async def rescan(self, reason: str) -> HardwareDiscovered:
        """Ask discovery for a fresh inventory and return the one published for it."""
        cid = ids.step(SAGA, f"rescan-{reason}", 1)
        await self.bus.publish(
            new_command(RescanHardware(reason=reason), node=self.node, source="/gpuop/e2e", id=cid)
        )
        _, inventory = await self.next_event(
            "hardware", lambda envelope, payload: envelope.causationid == cid, name="discovered"
        )
        assert isinstance(inventory, HardwareDiscovered)
        return inventory

    async def next_event(
        self,
        domain: str,
        wanted: Callable[[Envelope, Event], bool],
        name: str = "*",
    ) -> tuple[Envelope, Event]:
        """The first event about this node in `domain` that `wanted` accepts, reading the
        stream from its start and following it until one comes."""
        subject = subjects.events_filter(domain, self.node, name, prefix=self.bus.prefix)
        stored = self.bus.read(subject, follow=True)
        assert isinstance(stored, AsyncGenerator)  # closing it deletes its server-side consumer
        try:
            async with asyncio.timeout(STEP_TIMEOUT), aclosing(stored):
                async for message in stored:
                    envelope, payload = decode(message.data)
                    assert isinstance(payload, Event)
                    if wanted(envelope, payload):
                        return envelope, payload
        except TimeoutError:
            pass
        raise AssertionError(f"no such event on {subject}\n{self.tail_of_logs()}")

    async def driver_events(self) -> list[Event]:
        """Every driver event about this node so far, in stream order."""
        subject = subjects.events_filter("driver", self.node, prefix=self.bus.prefix)
        found = []
        async for message in self.bus.read(subject):
            _, payload = decode(message.data)
            assert isinstance(payload, Event)
            found.append(payload)
        return found

    async def labels(self) -> dict[str, str]:
        return nodes.labels_of(await nodes.get(self.kube, self.node))

    async def watched_labels_until(self, key: str, value: str) -> list[dict[str, str]]:
        """The Node's GPU-labelled states the watch reported, once the last has `key=value`."""
        try:
            async with asyncio.timeout(STEP_TIMEOUT):
                while not self.label_history or self.label_history[-1].get(key) != value:
                    await asyncio.sleep(0.05)
        except TimeoutError:
            raise AssertionError(f"the Node watch never reported {key}={value}") from None
        return [seen for seen in self.label_history if COUNT_LABEL in seen]

    async def wait_for_labels(self, expected: dict[str, str]) -> dict[str, str]:
        """The Node's labels once they include `expected`."""
        labels: dict[str, str] = {}
        try:
            async with asyncio.timeout(STEP_TIMEOUT):
                while not expected.items() <= (labels := await self.labels()).items():
                    await asyncio.sleep(0.1)
        except TimeoutError:
            raise AssertionError(
                f"the Node's labels never included {expected}; they are {labels}\n"
                f"{self.tail_of_logs()}"
            ) from None
        return labels


@asynccontextmanager
async def watching(watch: Coroutine[None, None, None]) -> AsyncIterator[None]:
    """Run `watch` as a task for the block, then cancel it."""
    task = asyncio.create_task(watch, name="e2e-node-watch")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def record_labels(kube: client.Kube, node: str, history: list[dict[str, str]]) -> None:
    """Append the labels of `node` to `history` at every change, until cancelled."""
    async with ListWatch(kube, kube.core.list_node) as watch:
        async for change in watch:
            if change.object["metadata"]["name"] == node:
                history.append(nodes.labels_of(change.object))


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes whose arguments contain `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            arguments = (entry / "cmdline").read_bytes().split(b"\0")
            if any(text.encode() in argument for argument in arguments):
                found.append(b" ".join(arguments).decode(errors="replace"))
    return found


@pytest.fixture
async def agents(nats_server: NatsServer, tmp_path: Path) -> AsyncIterator[Agents]:
    """A one-node simulated cluster whose node runs driver 580.159.04, a driver source with
    that version and `NEW`, and the three agent processes; afterwards, checks that each
    stopped cleanly on SIGTERM and that none is left."""
    exit_codes: dict[str, int | None] = {}
    work = tmp_path / "e2e"
    work.mkdir()
    async with SimCluster(nodes=1, gpus=GPUS, workloads=False, seed=11) as cluster:
        (node,) = cluster.node_names
        kubeconfig = cluster.write_kubeconfig(work / "kubeconfig")
        machine = cluster.machine(node)
        root = hosts.build_host_root(
            work / "host",
            node,
            GPUS,
            gpu_version=OLD,
            boot_id=machine.boot_id,
            product_name=machine.type.name,
        )
        kernel = system.kernel_release(root)
        assert kernel is not None
        source = work / "driver-source"
        packaging.build_driver_source(
            source, [("gpu", OLD, kernel), ("gpu", NEW, kernel)], signing_key=keys.SIGNING_KEY
        )
        (work / "discovery.yaml").write_text(DISCOVERY_CONFIG)
        (work / "driver-manager.yaml").write_text(DRIVER_MANAGER_CONFIG)
        nats = ["--nats", nats_server.url]
        on_node = ["--node", node, *nats, "--host-root", str(root.path), "--nvml", f"sim:{GPUS}"]
        logs = [
            work / f"{name}.log"
            for name in ("discovery-node", "discovery-cluster", "driver-manager")
        ]
        label_history: list[dict[str, str]] = []
        bus = NatsBus(nats_server.url, name="e2e-orchestrator")
        await bus.start()
        try:
            async with (
                await client.connect(kubeconfig) as kube,
                watching(record_labels(kube, node, label_history)),
                service(
                    "discovery-node",
                    ["discovery", "--role", "node", *on_node, "--config", f"{work}/discovery.yaml"],
                    logs[0],
                    exit_codes,
                ),
                service(
                    "discovery-cluster",
                    ["discovery", "--role", "cluster", *nats, "--kubeconfig", str(kubeconfig)],
                    logs[1],
                    exit_codes,
                ),
                service(
                    "driver-manager",
                    ["driver-manager", *on_node, "--config", f"{work}/driver-manager.yaml"],
                    logs[2],
                    exit_codes,
                ),
            ):
                yield Agents(node, bus, kube, source, logs, label_history)
        finally:
            await bus.close()
    assert exit_codes == dict.fromkeys(("discovery-node", "discovery-cluster", "driver-manager"), 0)
    assert processes_mentioning(str(work)) == []


async def test_a_new_driver_is_unloaded_installed_loaded_and_validated_through_events(
    agents: Agents,
) -> None:
    labels = await agents.wait_for_labels({DRIVER_LABEL: OLD, COUNT_LABEL: str(GPUS)})
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H200"
    gpu = dm.Component.GPU
    where = dm.DriverSource(uri=str(agents.source), public_keys=(keys.PUBLIC_KEY,))

    unloaded = await agents.send(dm.UnloadDriver(component=gpu, timeout_seconds=15), "unload")
    assert isinstance(unloaded, dm.DriverUnloaded), unloaded
    assert unloaded.version == OLD and "nvidia" in unloaded.modules

    install = dm.InstallDriver(component=gpu, version=NEW, source=where)
    installed = await agents.send(install, "install")
    assert isinstance(installed, dm.DriverInstalled), installed
    assert installed.version == NEW and installed.sha256 is not None

    loaded = await agents.send(dm.LoadDriver(component=gpu, version=NEW), "load")
    assert isinstance(loaded, dm.DriverLoaded), loaded
    assert loaded.version == NEW and "nvidia" in loaded.modules

    validated = await agents.send(
        dm.ValidateDriver(component=gpu, version=NEW, expected_devices=GPUS), "validate"
    )
    assert isinstance(validated, dm.DriverValidated), validated
    assert (validated.version, validated.devices) == (NEW, GPUS)

    _, inventory = await agents.next_event(
        "hardware",
        lambda _, payload: getattr(payload, "driver_version", None) == NEW,
        name="discovered",
    )
    assert isinstance(inventory, HardwareDiscovered)
    assert len(inventory.gpus) == GPUS
    labels = await agents.wait_for_labels({DRIVER_LABEL: NEW})
    assert labels[COUNT_LABEL] == str(GPUS)
    assert labels["nvidia.com/gpu.machine"] == "p5e.48xlarge"
    labelled = await agents.watched_labels_until(DRIVER_LABEL, NEW)
    gpu_keys = {key for key in labelled[0] if key.startswith("nvidia.com/")}
    blinked = {key for seen in labelled for key in gpu_keys - seen.keys()}
    assert not blinked, "GPU labels went away while the driver was reloaded"
    versions = [seen[DRIVER_LABEL] for seen in labelled]
    assert versions == [OLD] * versions.count(OLD) + [NEW] * versions.count(NEW), versions

    results = [e for e in await agents.driver_events() if isinstance(e, dm.DriverResult)]
    assert [r.command_id for r in results] == agents.sent
    assert not [r for r in results if isinstance(r, dm.DriverFailure)]


async def test_installing_a_version_the_source_lacks_fails_and_keeps_the_old_driver(
    agents: Agents,
) -> None:
    await agents.wait_for_labels({DRIVER_LABEL: OLD, COUNT_LABEL: str(GPUS)})
    where = dm.DriverSource(uri=str(agents.source), public_keys=(keys.PUBLIC_KEY,))

    failed = await agents.send(
        dm.InstallDriver(component=dm.Component.GPU, version=ABSENT, source=where), "install"
    )

    assert isinstance(failed, dm.DriverInstallFailed), failed
    assert failed.reason is dm.InstallFailureReason.NOT_FOUND
    assert failed.version == ABSENT
    assert ABSENT in failed.message and NEW in failed.message, failed.message  # what it has
    assert not failed.retryable
    inventory = await agents.rescan("after a failed install")
    assert inventory.driver_version == OLD and len(inventory.gpus) == GPUS
    labels = await agents.wait_for_labels({COUNT_LABEL: str(GPUS)})
    assert labels[DRIVER_LABEL] == OLD
    labelled = await agents.watched_labels_until(DRIVER_LABEL, OLD)
    assert {seen[DRIVER_LABEL] for seen in labelled} == {OLD}
