"""Per-node identities in a real nats-server: `gpuop.bus.grants.for_identity` for the node
agents of gpu-1 and gpu-2 and the orchestrator, as password users (what the auth callout
issues as JWTs). Each agent works for its own node, and gpu-1's agents cannot act for gpu-2:
publish its events, create, pull or ack its consumers, read or write its KV keys, read its
replies. Every attempt's outcome is printed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import nats.js.errors
import pytest

from gpuop.bus import ConsumerSpec, Delivery, grants, streams
from gpuop.bus.protocol import Buckets
from gpuop.events import Event, driver, new_command, new_event, subjects
from gpuop.services.network_manager.addressing import (
    Addresses,
    PoolExhausted,
    claim_key,
    legacy_claim_key,
)
from gpuop.services.upgrade_orchestrator import intake
from tests.integration.deploy.per_node_nats import PerNodeNats, user_name
from tests.support.event_samples import SAMPLES
from tests.support.networks import network
from tests.support.shipped_nats import Refusals

pytestmark = [pytest.mark.nats, pytest.mark.security]

PREFIX = "gpuop"
MINE, THEIRS = "gpu-1.example.com", "gpu-2.example.com"
ORCHESTRATOR = grants.Identity("upgrade-orchestrator", None)
NODE_ROLES = sorted(grants.NODE_ROLES)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[PerNodeNats]:
    identities = [grants.Identity(r, n) for r in NODE_ROLES for n in (MINE, THEIRS)]
    running = PerNodeNats(tmp_path / "nats", [*identities, ORCHESTRATOR])
    await running.start()
    admin = running.bus(None)
    try:
        await admin.start()  # the streams and buckets, as a first service would
        await admin.close()
        yield running
    finally:
        await running.stop()


def specs(identity: grants.Identity) -> list[ConsumerSpec]:
    """The identity's consumers as its service builds them (the table the services use)."""
    return [
        ConsumerSpec(c.durable, c.filters, deliver_new_only=c.deliver_new_only, retry_delay=0.1)
        for c in grants.consumers(identity, prefix=PREFIX)
    ]


def concrete(subject_filter: str) -> str:
    return subject_filter.replace("*", "probe").replace(">", "probe")


async def ignore(delivery: Delivery) -> None:
    """The attacks only try to reach the consumers."""


@pytest.mark.parametrize("role", NODE_ROLES)
async def test_a_node_agent_works_for_its_own_node(server: PerNodeNats, role: str) -> None:
    identity = grants.Identity(role, MINE)
    bus = server.bus(identity, publish_timeout=2.0, retry_for=5.0)
    try:
        await bus.start()
        subscriptions = [await bus.consume(spec, ignore) for spec in specs(identity)]
        granted = grants.for_identity(identity)
        published = 0
        for payload in SAMPLES:
            if not isinstance(payload, Event):
                continue
            subject = subjects.event_subject(payload.DOMAIN, MINE, payload.NAME, prefix=PREFIX)
            if any(streams.subject_matches(p, subject) for p in granted.publish):
                envelope = new_event(payload, node=MINE, source="/test")
                assert (await bus.publish(envelope)).stream == "GPUOP_EVENTS"
                published += 1
        for subject_filter in grants.reads(identity):
            [m async for m in bus.read(subject_filter)]
        if role == "discovery":
            nodes = await bus.kv(Buckets.NODES)
            await nodes.put(subjects.encode_node(MINE), b"inventory")
            assert (await nodes.get(subjects.encode_node(MINE))) is not None
        if role == "network-manager":
            ipam = await bus.kv(Buckets.IPAM)
            await ipam.put(f"node.{subjects.encode_node(MINE)}.rdma0", b"10.10.0.7")
            claims = Addresses(ipam, MINE)
            held = await claims.claim(network(ipam={"cidr": "10.10.0.0/24"}))
            await claims.give_back("roce-a", held)
            assert await ipam.get(f"node.{subjects.encode_node(MINE)}.rdma0") is not None
            await (await bus.kv(Buckets.CONFIG)).get("networks")
        for subscription in subscriptions:
            await subscription.stop()
    finally:
        await bus.close()
    assert published > 0 or role not in ("discovery", "driver-manager", "network-manager")
    assert "Violation" not in server.log_file.read_text()


async def test_a_command_for_gpu_1_reaches_its_driver_manager_and_the_result_the_orchestrator(
    server: PerNodeNats,
) -> None:
    agent_identity = grants.Identity("driver-manager", MINE)
    orchestrator = server.bus(ORCHESTRATOR)
    agent = server.bus(agent_identity)
    results: asyncio.Queue[Delivery] = asyncio.Queue()

    async def execute(delivery: Delivery) -> None:
        assert isinstance(delivery.payload, driver.UnloadDriver)
        done = driver.DriverUnloaded(
            component=driver.Component.GPU, modules=("nvidia",), command_id=delivery.envelope.id
        )
        await agent.publish(new_event(done, node=MINE, source="/test/driver-manager"))

    command = new_command(
        driver.UnloadDriver(component=driver.Component.GPU, timeout_seconds=60),
        node=MINE,
        source="/test/orchestrator",
        id="unload-1",
    )
    try:
        await orchestrator.start()
        await agent.start()
        await orchestrator.consume(intake.consumer_spec(PREFIX), results.put)
        await agent.consume(specs(agent_identity)[0], execute)
        await orchestrator.publish(command)
        result = await asyncio.wait_for(results.get(), 10.0)
    finally:
        await agent.close()
        await orchestrator.close()
    assert isinstance(result.payload, driver.DriverUnloaded)
    assert "Violation" not in server.log_file.read_text()


def attacks(role: str) -> list[tuple[str, str]]:
    """(what, subject) gpu-1's `role` agent tries against gpu-2."""
    mine, theirs = grants.Identity(role, MINE), grants.Identity(role, THEIRS)
    token, other = subjects.encode_node(MINE), subjects.encode_node(THEIRS)
    tried = []
    for subject in grants.for_identity(theirs).publish:
        if other not in subject:
            continue
        if subject.startswith(("$JS.API.CONSUMER.CREATE.", "$JS.API.DIRECT.GET.")):
            tried.append(("do what gpu-2's agent may", subject))
        else:
            tried.append(("do what gpu-2's agent may", concrete(subject)))
    for own, their in zip(grants.consumers(mine), grants.consumers(theirs), strict=True):
        s = own.stream
        create = f"$JS.API.CONSUMER.CREATE.{s}"
        everywhere = own.filters[0].replace(token, "*")
        tried += [
            ("gpu-2's consumer with my filter", f"{create}.{their.durable}.{own.filters[0]}"),
            ("my consumer with gpu-2's filter", f"{create}.{own.durable}.{their.filters[0]}"),
            ("my consumer over every node", f"{create}.{own.durable}.{everywhere}"),
            ("my consumer, filter in the body", f"{create}.{own.durable}"),
            ("pull gpu-2's consumer", f"$JS.API.CONSUMER.MSG.NEXT.{s}.{their.durable}"),
            ("ack gpu-2's consumer", f"$JS.ACK.{s}.{their.durable}.1.5.5.1700000000000000000.0"),
        ]  # fmt: skip
    tried += [
        ("publish gpu-2's heartbeat", f"{PREFIX}.evt.hardware.{other}.heartbeat"),
        ("publish gpu-2's driver result", f"{PREFIX}.evt.driver.{other}.loaded"),
        ("publish gpu-2's GPU reset", f"{PREFIX}.evt.driver.{other}.gpu-reset"),
        ("publish gpu-2's GPU holders", f"{PREFIX}.evt.device.{other}.gpu-holders-listed"),
        ("answer gpu-2's holders unknown", f"{PREFIX}.evt.device.{other}.gpu-holders-unknown"),
        ("write gpu-2's inventory", f"$KV.gpuop_nodes.{other}"),
        ("read gpu-2's inventory", f"$JS.API.DIRECT.GET.KV_gpuop_nodes.$KV.gpuop_nodes.{other}"),
        ("read any key", "$JS.API.STREAM.MSG.GET.KV_gpuop_nodes"),
        ("read any key", "$JS.API.DIRECT.GET.KV_gpuop_nodes"),
        ("dead-letter gpu-2's command", f"{PREFIX}.dlq.{PREFIX}.cmd.{role}.{other}.install"),
    ]
    return tried


@pytest.mark.parametrize("role", NODE_ROLES)
async def test_a_node_agent_cannot_act_for_another_node(server: PerNodeNats, role: str) -> None:
    identity = grants.Identity(role, MINE)
    granted = grants.for_identity(identity)
    tried = attacks(role)
    refusals = Refusals()
    nc = await nats.connect(
        server.url(user_name(identity)),
        inbox_prefix=granted.inbox_prefix,
        error_cb=refusals.record,
        allow_reconnect=False,
    )
    refusals.nc = nc
    inboxes = [f"_INBOX_{role}.{subjects.encode_node(THEIRS)}.>", "_INBOX.>", f"_INBOX_{role}.>"]
    try:
        for _, subject in tried:
            await nc.publish(subject, b"{}")
        for inbox in inboxes:
            await nc.subscribe(inbox)
        await refusals.settle()
    finally:
        await nc.close()

    def outcome(refused: bool) -> str:
        return "refused" if refused else "ALLOWED"

    rows = [
        f"{role}@{MINE:<18} {what:<36} {subject:<110} {outcome(refusals.refused_publish(subject))}"
        for what, subject in tried
    ]
    rows += [
        f"{role}@{MINE:<18} {'read replies':<36} {inbox:<110} "
        f"{outcome(refusals.refused_subscription(inbox))}"
        for inbox in inboxes
    ]
    print("\n" + "\n".join(rows))
    assert [row for row in rows if row.endswith("ALLOWED")] == []


def test_every_role_is_rendered_and_an_unknown_one_is_refused() -> None:
    assert {i.role for i in [grants.Identity(r, MINE) for r in NODE_ROLES]} == grants.NODE_ROLES
    with pytest.raises(ValueError, match="unknown NATS role"):
        grants.Identity("driver-manager2", MINE)


ONE = "10.10.0.7"
"""The one address of the pool the two network-managers claim from."""


async def test_a_network_manager_cannot_take_or_outrank_another_nodes_address_claim(
    server: PerNodeNats,
) -> None:
    """gpu-1's network-manager holds the one address of a pool. gpu-2's, with its own
    credential, tries to overwrite, create, delete and purge gpu-1's claim, to write an old
    style claim of the address and to purge the bucket: every write is refused. Its own claim
    of the address, made later, does not hold it: gpu-2 withdraws it and finds the pool
    exhausted, and gpu-1 still holds the address with the claim it made."""
    mine, theirs = (grants.Identity("network-manager", n) for n in (MINE, THEIRS))
    roce = network(ipam={"cidr": "10.10.0.0/24", "rangeStart": ONE, "rangeEnd": ONE})
    holder, rival, admin = server.bus(mine), server.bus(theirs), server.bus(None)
    refusals = Refusals()
    rows: list[tuple[str, str, str]] = []
    try:
        for bus in (holder, rival, admin):
            await bus.start()
        holder_kv, rival_kv = await holder.kv(Buckets.IPAM), await rival.kv(Buckets.IPAM)
        stored = await admin.kv(Buckets.IPAM)  # what is in the bucket, read as admin
        held = await Addresses(holder_kv, MINE).claim(roce)
        before = await stored.get(claim_key(held, MINE))
        assert before is not None
        victim = f"$KV.gpuop_ipam.{claim_key(held, MINE)}"
        tried = [
            ("overwrite gpu-1's claim", victim, {}),
            ("create gpu-1's claim", victim, {"Nats-Expected-Last-Subject-Sequence": "0"}),
            ("delete gpu-1's claim", victim, {"KV-Operation": "DEL"}),
            ("purge gpu-1's claim", victim, {"KV-Operation": "PURGE", "Nats-Rollup": "sub"}),
            ("write an old-style claim", f"$KV.gpuop_ipam.{legacy_claim_key(held)}", {}),
            ("purge the bucket", "$JS.API.STREAM.PURGE.KV_gpuop_ipam", {}),
            ("delete a message", "$JS.API.STREAM.MSG.DELETE.KV_gpuop_ipam", {}),
        ]
        refusals.nc = await nats.connect(
            server.url(user_name(theirs)),
            inbox_prefix=grants.for_identity(theirs).inbox_prefix,
            error_cb=refusals.record,
            allow_reconnect=False,
        )
        for _, subject, headers in tried:
            await refusals.nc.publish(subject, b"{}", headers=headers)
        await refusals.settle()
        for what, subject, _ in tried:
            refused = refusals.refused_publish(subject)
            rows.append((what, subject, "refused" if refused else "ALLOWED"))

        # its own key, allowed, with a roll-up of the whole bucket (`Nats-Rollup: all`)
        own = f"$KV.gpuop_ipam.{claim_key(held, THEIRS)}"
        try:
            await refusals.nc.jetstream().publish(own, b"{}", headers={"Nats-Rollup": "all"})
            rolled = "ALLOWED" if await stored.get(claim_key(held, MINE)) != before else "kept"
        except nats.js.errors.APIError as refused:
            rolled = f"refused ({refused.description})"
        rows.append(("roll up the whole bucket", own, rolled))
        await rival_kv.delete(claim_key(held, THEIRS))

        rivals = Addresses(rival_kv, THEIRS)
        taken = await rivals.confirm(roce, held)  # claims it: later than gpu-1's
        rows.append(("claim the held address", claim_key(held, THEIRS), _held(taken)))
        with pytest.raises(PoolExhausted):
            await rivals.claim(roce)
        rows.append(("claim from the pool", "claim.*.10.10.0.0_24.>", "exhausted"))

        assert await Addresses(holder_kv, MINE).confirm(roce, held)
        assert await stored.get(claim_key(held, MINE)) == before
        assert await stored.get(claim_key(held, THEIRS)) is None  # withdrawn
    finally:
        if hasattr(refusals, "nc"):
            await refusals.nc.close()
        for bus in (admin, rival, holder):
            await bus.close()
    print(f"\nnetwork-manager@{THEIRS} against {MINE}'s address claim:")
    for what, subject, outcome in rows:
        print(f"  {what:<26} {subject:<70} {outcome}")
    assert not taken
    assert [row for row in rows if not row[2].startswith(("refused", "lost", "exhausted"))] == []


def _held(taken: bool) -> str:
    return "HELD" if taken else "lost, withdrawn"


REMEDIATION_ANSWERS = {
    "gpu-reset": ("driver", "driver-manager"),
    "gpu-reset-failed": ("driver", "driver-manager"),
    "gpu-holders-listed": ("device", "device-plugin"),
    "gpu-holders-unknown": ("device", "device-plugin"),
}
"""The remediation saga's answers about a node: domain, and the one service that gives them."""


@pytest.mark.parametrize("role", NODE_ROLES)
async def test_only_a_nodes_own_agent_answers_the_remediation_commands(
    server: PerNodeNats, role: str
) -> None:
    identity = grants.Identity(role, MINE)
    refusals = Refusals()
    nc = await nats.connect(
        server.url(user_name(identity)),
        inbox_prefix=grants.for_identity(identity).inbox_prefix,
        error_cb=refusals.record,
        allow_reconnect=False,
    )
    refusals.nc = nc
    token = subjects.encode_node(MINE)
    tried = {
        name: (f"{PREFIX}.evt.{domain}.{token}.{name}", owner)
        for name, (domain, owner) in REMEDIATION_ANSWERS.items()
    }
    try:
        for subject, _ in tried.values():
            await nc.publish(subject, b"{}")
        await refusals.settle()
    finally:
        await nc.close()

    rows = [
        (f"{role}@{MINE:<18} {subject:<60}", refusals.refused_publish(subject), owner == role)
        for subject, owner in tried.values()
    ]
    print(
        "\n" + "\n".join(f"{row} {'refused' if refused else 'ALLOWED'}" for row, refused, _ in rows)
    )
    assert [row for row, refused, owns in rows if refused == owns] == []
