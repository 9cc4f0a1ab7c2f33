"""Each gpuop service on the shipped NATS configuration, with its own user: its real consumer
specs, reads, publishes and KV operations through the real `NatsBus` over TLS, as the Helm
chart connects it. Nothing it does may be refused, and every subject its user may publish to
must have been needed on the way: a permission nothing uses is a permission too many."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from dataclasses import dataclass, field

import pytest

from gpuop.bus import ConsumerSpec, Delivery, NatsBus
from gpuop.bus.kv import NatsKeyValue
from gpuop.bus.protocol import Buckets, KvEntry
from gpuop.events import Command, device, driver, new_event, subjects, upgrade
from gpuop.inventory import claims
from gpuop.services.device_plugin import consumers as device_plugin
from gpuop.services.device_plugin.cluster import role as dra_role
from gpuop.services.discovery import consumers as discovery
from gpuop.services.discovery import selections as discovery_selections
from gpuop.services.network_manager import consumers as network_manager
from gpuop.services.network_manager.addressing import Addresses
from gpuop.services.network_manager.blocks import BlockAllocator
from gpuop.services.telemetry import consumers as telemetry
from gpuop.services.upgrade_orchestrator import intake
from tests.integration.deploy.ownership import (
    NODE,
    PREFIX,
    SERVICE_USERS,
    TOKEN,
    envelope_of,
    may_publish,
)
from tests.support.event_samples import SAMPLES
from tests.support.networks import network
from tests.support.shipped_nats import (
    ShippedNats,
    shipped_users,
    stored,
    subject_matches,
)

pytestmark = pytest.mark.nats

RETRY = 0.1
"""Seconds before a consumer retries: the flows dead-letter at once anyway."""
FLOW_CONTROL = "$JS.FC."
"""Flow-control replies of KV watchers: only sent when a watcher falls megabytes behind, so
the service flows cannot show them; `test_a_kv_watcher_that_falls_behind_may_answer_flow_control`
does."""


async def wait_for(
    predicate: Callable[[], Awaitable[bool]], what: str, timeout: float = 10.0
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def concrete(subject_filter: str) -> str:
    """A subject the filter matches: this node's token for the node, `probe` elsewhere."""
    tokens = subject_filter.split(".")
    return ".".join(
        (TOKEN if i == 3 else "probe") if token in ("*", ">") else token
        for i, token in enumerate(tokens)
    )


@dataclass
class Flow:
    """What one service user does on the bus, with the services' own consumer specs."""

    consumers: list[ConsumerSpec] = field(default_factory=list)
    reads: list[str] = field(default_factory=list)
    kv: dict[Buckets, tuple[str, ...]] = field(default_factory=dict)
    """Per bucket, the operations: get, put, create, update, delete, keys, watch."""
    lasts: list[str] = field(default_factory=list)
    """Subjects whose latest stored message it reads (`Bus.last`)."""
    changes_streams: bool = False
    """Starts a second bus with another retention, which must update the streams."""


def flows() -> dict[str, Flow]:
    return {
        "discovery": Flow(
            consumers=[
                discovery.node_commands(PREFIX, NODE, retry_delay=RETRY),
                discovery.node_rescans(PREFIX, NODE, retry_delay=RETRY),
                discovery.node_driver_results(PREFIX, NODE, retry_delay=RETRY),
            ],
            reads=[subjects.commands_filter(device.OPERANDS, NODE, prefix=PREFIX)],
            kv={Buckets.NODES: ("put", "get")},
        ),
        "discovery-cluster": Flow(
            consumers=[discovery.labeler(PREFIX, retry_delay=RETRY)],
            # at start: what it told each node's plugin and MIG saga, what each plugin runs
            reads=[
                discovery_selections.selections_filter(PREFIX),
                discovery_selections.MIG_CONFIG.filter(PREFIX),
                discovery.plugin_configs_filter(PREFIX),
            ],
            kv={Buckets.NODES: ("get",)},
        ),
        "device-plugin-cluster": Flow(
            consumers=[dra_role.consumer_spec(PREFIX, retry_delay=RETRY)],
            # at start: each node's device API answer, and what it told of claims
            reads=[dra_role.api_applied_filter(PREFIX), dra_role.dra_filter(PREFIX)],
            kv={Buckets.NODES: ("get", "keys")},
        ),
        "driver-manager": Flow(
            # as driver_manager.agent.CommandAgent.consumer_spec builds it
            consumers=[
                ConsumerSpec(
                    durable=f"{driver.SERVICE}-{TOKEN}",
                    subjects=(subjects.commands_filter(driver.SERVICE, NODE, prefix=PREFIX),),
                    max_in_flight=1,
                    retry_delay=RETRY,
                )
            ],
        ),
        "device-plugin": Flow(
            consumers=[
                device_plugin.node_commands(PREFIX, NODE, retry_delay=RETRY),
                device_plugin.node_own_commands(PREFIX, NODE, retry_delay=RETRY),
                device_plugin.node_health(PREFIX, NODE, retry_delay=RETRY),
                device_plugin.node_config(PREFIX, NODE, retry_delay=RETRY),
            ],
            reads=[
                subjects.commands_filter(device.OPERANDS, NODE, prefix=PREFIX),
                *device_plugin.health_subjects(PREFIX, NODE),
                device_plugin.config_subject(PREFIX, NODE),
                claims.claim_subjects(NODE, prefix=PREFIX),
            ],
        ),
        "network-manager": Flow(
            consumers=[
                network_manager.node_commands(PREFIX, NODE, retry_delay=RETRY),
                network_manager.node_driver_results(PREFIX, NODE, retry_delay=RETRY),
            ],
            kv={
                Buckets.CONFIG: ("get", "watch"),
                # no key listing: its watches name its node's records or a pool's claims
                Buckets.IPAM: ("get", "put", "create", "delete", "watch", "claim"),
            },
        ),
        "network-manager-cluster": Flow(
            kv={Buckets.CONFIG: ("get", "create", "update"), Buckets.IPAM: ("blocks",)}
        ),
        "telemetry": Flow(
            consumers=[telemetry.node_commands(PREFIX, NODE, retry_delay=RETRY)],
            reads=[
                subjects.commands_filter(device.OPERANDS, NODE, prefix=PREFIX),
                # its node's ResourceClaims, for the pod labels of GPUs held through them
                claims.claim_subjects(NODE, prefix=PREFIX),
            ],
        ),
        "telemetry-cluster": Flow(
            reads=[
                subjects.events_filter(upgrade.DOMAIN, prefix=PREFIX),
                # the GPU health history the cluster exporter replays at its start
                subjects.events_filter(
                    device.DeviceHealthChanged.DOMAIN,
                    name=device.DeviceHealthChanged.NAME,
                    prefix=PREFIX,
                ),
                subjects.stream_filter(subjects.Kind.EVENT, prefix=PREFIX),
                subjects.stream_filter(subjects.Kind.DEAD_LETTER, prefix=PREFIX),
            ]
        ),
        "upgrade-orchestrator": Flow(
            consumers=[intake.consumer_spec(PREFIX)],
            kv={
                Buckets.SAGAS: ("get", "create", "update", "delete", "keys", "watch"),
                Buckets.NODES: ("get", "keys"),
            },
            # a takeover asks whether a saga's latest state change is in the log, a
            # remediation's start and the device-API starter which device API a node serves
            # last, and a switch's start; the pod deletions read every node's claims
            reads=[claims.claim_subjects(None, prefix=PREFIX)],
            lasts=[
                subjects.event_subject(upgrade.DOMAIN, NODE, "cordon-required", prefix=PREFIX),
                subjects.event_subject("device", NODE, "api-applied", prefix=PREFIX),
                subjects.event_subject("device-api", NODE, "started", prefix=PREFIX),
            ],
            changes_streams=True,
        ),
    }


async def ignore(delivery: Delivery) -> None:
    """The flows seed only malformed messages: the bus dead-letters them before a handler."""


async def run_kv(bus: NatsBus, bucket: Buckets, operations: tuple[str, ...]) -> None:
    kv = await bus.kv(bucket)
    # the keys the services write: discovery its node's inventory, network-manager its
    # node's address records
    key = {Buckets.NODES: TOKEN, Buckets.IPAM: f"node.{TOKEN}.probe"}.get(bucket, f"{TOKEN}.probe")
    for operation in operations:
        if operation == "get":
            await kv.get(key)
        elif operation == "put":
            await kv.put(key, b"v1")
        elif operation == "create":
            await kv.create(f"{key}-new", b"v1")
        elif operation == "update":
            entry = await kv.get(f"{key}-new")
            assert entry is not None
            await kv.update(f"{key}-new", b"v2", entry.revision)
        elif operation == "delete":
            await kv.delete(key)
        elif operation == "claim":  # an address of each family, claimed and given back
            addresses = Addresses(kv, NODE)
            for cidr in ("10.10.0.0/24", "fd00:10::/120"):
                held = await addresses.claim(network(ipam={"cidr": cidr}))
                assert await addresses.confirm(network(ipam={"cidr": cidr}), held)
                await addresses.give_back("roce-a", held)
        elif operation == "blocks":  # two nodes' blocks given, one node's freed
            pool = network(ipam={"cidr": "10.10.0.0/24", "perNodeBlockSize": 8}).ipam
            allocator = BlockAllocator(kv)
            for names in ((NODE, f"{NODE}-2"), (NODE,)):
                await allocator.reconcile([pool], _listing(names))
        elif operation == "keys":
            await kv.keys()
        elif operation == "watch":
            await first_of(kv.watch(key))


def _listing(names: tuple[str, ...]) -> Callable[[], Awaitable[Collection[str]]]:
    async def listed() -> Collection[str]:
        return names

    return listed


async def first_of(watch: AsyncIterator[KvEntry | None]) -> None:
    """The current value, or the mark of being caught up: the watch's consumer was made."""
    try:
        await asyncio.wait_for(anext(watch), 5.0)
    finally:
        await watch.aclose()


@pytest.mark.parametrize("user", SERVICE_USERS)
async def test_each_service_works_with_its_user_and_needs_every_permission_it_has(
    server: ShippedNats, user: str
) -> None:
    flow = flows()[user]
    bus = server.bus(user, publish_timeout=2.0, retry_for=2.0)
    admin = server.bus("admin")
    try:
        await bus.start()  # first on an empty server: it creates the streams and buckets
        await admin.connect()
        subscriptions = [await bus.consume(spec, ignore) for spec in flow.consumers]
        # one malformed message on every subject it consumes (dead-lettered by the bus) or
        # reads back
        dead_letters = {concrete(s) for spec in flow.consumers for s in spec.subjects}
        for subject in sorted(dead_letters | {concrete(s) for s in flow.reads}):
            await admin.publish_raw(subject, b"not an envelope")

        for payload in SAMPLES:
            if not isinstance(payload, Command) and may_publish(user, type(payload)):
                ack = await bus.publish(envelope_of(payload))
                assert ack.stream == "GPUOP_EVENTS"
            elif isinstance(payload, Command) and may_publish(user, type(payload)):
                ack = await bus.publish(envelope_of(payload))
                assert ack.stream == "GPUOP_COMMANDS"
        for subject in flow.reads:
            assert [m async for m in bus.read(subject)], f"{user} read nothing on {subject}"
        for subject in flow.lasts:
            await bus.last(subject)
        for bucket, operations in flow.kv.items():
            # a key of someone else's in every bucket, so that listing one is not answered
            # from the stream's size alone
            await (await admin.kv(bucket)).put(f"{TOKEN}.other", b"v0")
            await run_kv(bus, bucket, operations)
        if dead_letters:
            await wait_for(
                lambda: _at_least(admin, f"{PREFIX}.dlq.>", len(dead_letters)),
                f"{user}'s dead letters",
            )
        for subscription in subscriptions:
            await subscription.stop()
        if flow.changes_streams:
            other = server.bus(user, events_max_age=7 * 86400.0)
            try:
                await other.start()
            finally:
                await other.close()
    finally:
        await bus.close()
        await admin.close()
    await server.stop()  # flushes the trace

    assert [v for v in server.violations() if v.user == user] == []
    published = server.published_by(user)
    unused = [
        allowed
        for allowed in shipped_users()[user].publish_allow
        if not allowed.startswith(FLOW_CONTROL)
        and not any(subject_matches(allowed, subject) for subject in published)
    ]
    assert unused == [], f"{user} may publish to subjects it never needs"


async def _at_least(admin: NatsBus, subject: str, wanted: int) -> bool:
    return await stored(admin, subject) >= wanted


async def test_a_command_reaches_the_driver_manager_and_its_result_the_orchestrator(
    server: ShippedNats,
) -> None:
    orchestrator = server.bus("upgrade-orchestrator")
    agent = server.bus("driver-manager")
    results: asyncio.Queue[Delivery] = asyncio.Queue()
    unload = driver.UnloadDriver(component=driver.Component.GPU, timeout_seconds=60)
    command = envelope_of(unload)

    async def execute(delivery: Delivery) -> None:
        assert isinstance(delivery.payload, driver.UnloadDriver)
        done = driver.DriverUnloaded(
            component=driver.Component.GPU, modules=("nvidia",), command_id=delivery.envelope.id
        )
        await agent.publish(new_event(done, node=NODE, source="/test/driver-manager"))

    try:
        await orchestrator.start()
        await agent.start()
        await orchestrator.consume(intake.consumer_spec(PREFIX), results.put)
        spec = flows()["driver-manager"].consumers[0]
        await agent.consume(spec, execute)
        await orchestrator.publish(command)
        result = await asyncio.wait_for(results.get(), 10.0)
    finally:
        await agent.close()
        await orchestrator.close()

    assert isinstance(result.payload, driver.DriverUnloaded)
    assert result.subject == f"{PREFIX}.evt.driver.{TOKEN}.unloaded"
    assert server.violations() == []


async def test_a_kv_watcher_that_falls_behind_may_answer_flow_control(
    server: ShippedNats,
) -> None:
    orchestrator = server.bus("upgrade-orchestrator")
    try:
        await orchestrator.start()
        sagas = await orchestrator.kv(Buckets.SAGAS)
        for n in range(12):  # enough bytes that the server asks the watcher to confirm
            await sagas.put(f"node-{n}", b"x" * 900_000)
        watched = await asyncio.wait_for(_watch_all(sagas), 20.0)
    finally:
        await orchestrator.close()
    await server.stop()

    assert watched == 12
    assert any(s.startswith(FLOW_CONTROL) for s in server.published_by("upgrade-orchestrator"))
    assert server.violations() == []


async def _watch_all(kv: NatsKeyValue) -> int:
    seen = 0
    watch = kv.watch()
    try:
        async for entry in watch:
            if entry is None:  # caught up
                break
            seen += 1
    finally:
        await watch.aclose()
    return seen
