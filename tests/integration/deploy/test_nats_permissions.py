"""The permission matrix of deploy/nats against a real nats-server running it as shipped:
every event and command only from its owner, no stream administration, no bucket of another
service, subscriptions only for the observer and only to upgrade events, TLS and a password
for everyone."""

from __future__ import annotations

import asyncio

import nats.errors
import nats.js.errors
import pytest

from gpuop.bus import BusError, ConsumerSpec, Delivery, NatsBus, streams
from gpuop.bus.publishing import id_key, message_id
from gpuop.events import Command, Envelope, device, driver, hardware, upgrade
from gpuop.events.deadlines import DeadlineExpired
from tests.integration.deploy.ownership import (
    ALL_USERS,
    KV_WRITERS,
    OPERAND_CONFIRMATIONS,
    PREFIX,
    SERVICE_USERS,
    TOKEN,
    envelope_of,
    may_publish,
    subject_of,
)
from tests.support.buses import dead_letters, wait_until
from tests.support.event_samples import SAMPLES
from tests.support.shipped_nats import ShippedNats, shipped_users, stored

pytestmark = [pytest.mark.nats, pytest.mark.security]


@pytest.mark.parametrize("user", ALL_USERS)
async def test_events_and_commands_go_only_to_their_owners(server: ShippedNats, user: str) -> None:
    admin = server.bus("admin")
    await admin.start()
    try:
        async with server.client(user) as client:
            forbidden = []
            for payload in SAMPLES:
                subject = subject_of(payload)
                if may_publish(user, type(payload)):
                    stream = "GPUOP_COMMANDS" if isinstance(payload, Command) else "GPUOP_EVENTS"
                    ack = await client.nc.jetstream().publish(
                        subject, envelope_of(payload).to_bytes(), timeout=5.0
                    )
                    assert ack.stream == stream, subject
                else:
                    forbidden.append(subject)
                    await client.nc.publish(subject, b"forged")
            if forbidden:
                await client.settle()
        kept = await stored(admin, f"{PREFIX}.evt.>") + await stored(admin, f"{PREFIX}.cmd.>")
    finally:
        await admin.close()

    allowed = len(SAMPLES) - len(forbidden)
    assert kept == allowed, f"{user}: {kept} messages stored, {allowed} allowed"
    assert [s for s in forbidden if not client.refused_publish(s)] == []


def administration(user: str) -> list[str]:
    """JetStream operations a service never does; which of them `user` is refused."""
    refused = [
        "$JS.API.STREAM.DELETE.GPUOP_EVENTS",
        "$JS.API.STREAM.PURGE.GPUOP_COMMANDS",
        "$JS.API.STREAM.MSG.DELETE.GPUOP_EVENTS",
        "$JS.API.STREAM.CREATE.ANOTHER_STREAM",
        "$JS.API.STREAM.DELETE.KV_gpuop_sagas",
        "$JS.API.STREAM.PURGE.KV_gpuop_ipam",
        "$JS.API.CONSUMER.DELETE.GPUOP_COMMANDS.driver-manager-gpu-1",
        "$JS.API.CONSUMER.DELETE.GPUOP_EVENTS.upgrade-orchestrator",
    ]
    if user != "device-plugin":  # it consumes every event of its node (health history)
        refused.append("gpuop.dlq.gpuop.evt.upgrade.gpu-1.state-changed")
    if user != "upgrade-orchestrator":
        refused += ["$JS.API.STREAM.UPDATE.GPUOP_EVENTS", "$JS.API.STREAM.UPDATE.GPUOP_DLQ"]
    for bucket, writers in KV_WRITERS.items():
        if user not in writers:
            refused.append(f"$KV.{PREFIX}_{bucket}.{TOKEN}")
    return refused


@pytest.mark.parametrize("user", [*SERVICE_USERS, "observer"])
async def test_streams_consumers_and_other_buckets_are_out_of_reach(
    server: ShippedNats, user: str
) -> None:
    subjects_refused = administration(user)
    async with server.client(user) as client:
        for subject in subjects_refused:
            await client.nc.publish(subject, b"{}")
        await client.settle()

    assert [s for s in subjects_refused if not client.refused_publish(s)] == []


SUBSCRIPTIONS = (
    f"{PREFIX}.evt.upgrade.>",
    f"{PREFIX}.evt.driver.>",
    f"{PREFIX}.evt.>",
    f"{PREFIX}.cmd.driver-manager.>",
    f"{PREFIX}.cmd.>",
    f"{PREFIX}.dlq.>",
    f"$KV.{PREFIX}_sagas.>",
    "$JS.EVENT.>",
    ">",
)


@pytest.mark.parametrize("user", [*SERVICE_USERS, "observer"])
async def test_only_the_observer_subscribes_and_only_to_upgrade_events(
    server: ShippedNats, user: str
) -> None:
    allowed = {f"{PREFIX}.evt.upgrade.>"} if user == "observer" else set()
    async with server.client(user) as client:
        for subject in SUBSCRIPTIONS:
            await client.nc.subscribe(subject)
        await client.settle()

    refused = {s for s in SUBSCRIPTIONS if client.refused_subscription(s)}
    assert refused == set(SUBSCRIPTIONS) - allowed


async def test_the_observer_follows_upgrade_events_live_and_nothing_else(
    server: ShippedNats,
) -> None:
    orchestrator = server.bus("upgrade-orchestrator")
    manager = server.bus("driver-manager")
    await orchestrator.start()
    await manager.connect()
    state = upgrade.NodeUpgradeStateChanged
    changed = next(p for p in SAMPLES if isinstance(p, state))
    loaded = next(p for p in SAMPLES if isinstance(p, driver.DriverLoaded))
    try:
        async with server.client("observer") as observer:
            upgrades = await observer.nc.subscribe(f"{PREFIX}.evt.upgrade.>")
            drivers = await observer.nc.subscribe(f"{PREFIX}.evt.driver.>")
            await observer.nc.flush()
            await manager.publish(envelope_of(loaded))
            await orchestrator.publish(envelope_of(changed))
            message = await upgrades.next_msg(timeout=5.0)
            with pytest.raises(nats.errors.TimeoutError):
                await drivers.next_msg(timeout=0.2)
            # and no JetStream: no history, no consumer of its own
            await observer.nc.publish("$JS.API.CONSUMER.CREATE.GPUOP_EVENTS", b"{}")
            await observer.nc.publish("$JS.API.STREAM.MSG.GET.GPUOP_EVENTS", b"{}")
            await observer.settle()
    finally:
        await manager.close()
        await orchestrator.close()

    assert message.subject == subject_of(changed)
    assert Envelope.model_validate_json(message.data).type == state.TYPE
    assert observer.refused_subscription(f"{PREFIX}.evt.driver.>")
    assert observer.refused_publish("$JS.API.CONSUMER.CREATE.GPUOP_EVENTS")
    assert observer.refused_publish("$JS.API.STREAM.MSG.GET.GPUOP_EVENTS")


# --- connecting --------------------------------------------------------------------------


async def test_the_account_holds_at_most_sixteen_streams_even_for_admin(
    server: ShippedNats,
) -> None:
    admin = server.bus("admin")
    await admin.start()  # gpuop's own 3 streams and 4 buckets
    made, refusal = 7, ""
    try:
        for n in range(20):
            try:
                await admin.js.add_stream(name=f"FLOOD_{n}", subjects=[f"flood.{n}"])
            except nats.js.errors.APIError as error:
                refusal = str(error.description)
                break
            made += 1
        info = await admin.js.account_info()
    finally:
        await admin.close()
    assert made == 16 and "maximum number of streams reached" in refusal
    assert info.limits.max_streams == 16 and info.limits.max_storage == 10 << 30


async def test_a_wrong_password_is_refused(server: ShippedNats) -> None:
    bus = NatsBus(server.url("driver-manager", password="guessed"), retry_for=0.5)
    with pytest.raises(BusError):
        await bus.connect()
    await bus.close()


async def test_a_client_without_tls_is_refused(server: ShippedNats) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        info = await reader.readline()
        assert b'"tls_required":true' in info
        writer.write(b'CONNECT {"user":"observer","verbose":false}\r\nPING\r\n')
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(200), 5.0)
    finally:
        writer.close()
        await writer.wait_closed()

    assert answer == b"", "the server must hang up on a client that does not start TLS"


def test_every_user_has_a_password_from_the_environment() -> None:
    users = shipped_users()

    assert set(users) == set(ALL_USERS)
    for name, user in users.items():
        assert user.password_variable == name.upper().replace("-", "_") + "_PASSWORD"


def test_the_samples_cover_every_owner() -> None:
    owned = {user: [type(p) for p in SAMPLES if may_publish(user, type(p))] for user in ALL_USERS}

    assert {device.DeviceHealthChanged, *OPERAND_CONFIRMATIONS} <= set(owned["telemetry"])
    assert hardware.HardwareDiscovered in owned["discovery"]
    assert DeadlineExpired in owned["upgrade-orchestrator"]
    assert owned["observer"] == [] and owned["telemetry-cluster"] == []


# --- forged types ------------------------------------------------------------------------


PUBLISHERS = [u for u in SERVICE_USERS if any(may_publish(u, type(p)) for p in SAMPLES)]
"""The users that may publish some event or command (the rest may publish none: see above)."""


def test_every_publisher_is_tried_for_forged_types() -> None:
    assert {"discovery", "driver-manager", "upgrade-orchestrator"} <= set(PUBLISHERS)


@pytest.mark.parametrize("user", PUBLISHERS)
async def test_no_user_passes_off_a_type_it_may_not_send_on_a_subject_it_may(
    server: ShippedNats, user: str
) -> None:
    """Every type `user` may not send, wrapped in an envelope and published (and stored) on a
    subject it may publish: every consumer dead-letters each as malformed, none reaches a
    handler. Printed: the attempts and what came of them."""
    own = [p for p in SAMPLES if may_publish(user, type(p))]
    foreign = [p for p in SAMPLES if not may_publish(user, type(p))]
    assert own and foreign, user
    carrier = subject_of(own[0])
    admin = server.bus("admin")
    await admin.start()
    handled: list[str] = []

    async def record(delivery: Delivery) -> None:
        handled.append(delivery.envelope.type)

    kind = "cmd" if isinstance(own[0], Command) else "evt"
    spec = ConsumerSpec(f"forged-{user}", [f"{PREFIX}.{kind}.>"], max_deliver=1)
    try:
        async with server.client(user) as client:
            js = client.nc.jetstream()
            for payload in foreign:
                await js.publish(carrier, envelope_of(payload).to_bytes(), timeout=5.0)
        subscription = await admin.consume(spec, record)
        try:
            await wait_until(lambda: _dead_letters(admin, len(foreign)), timeout=30)
        finally:
            await subscription.stop()
        letters = await dead_letters(admin)
    finally:
        await admin.close()

    outcome = {t: "HANDLED" for t in handled}
    for letter in letters:
        kind, reason = letter.headers[streams.DLQ_KIND], letter.headers[streams.DLQ_REASON]
        forged = Envelope.model_validate_json(letter.data).type
        outcome[forged] = f"dead-lettered, {kind}" if "travels on" in reason else reason
    rows = [f"{user:<22} {type(p).TYPE:<46} on {carrier}: {outcome.get(type(p).TYPE)}"
            for p in foreign]  # fmt: skip
    print("\n" + "\n".join(rows))
    assert {outcome.get(type(p).TYPE) for p in foreign} == {"dead-lettered, malformed"}


async def _dead_letters(bus: NatsBus, count: int) -> bool:
    return len(await dead_letters(bus)) >= count


async def test_no_user_takes_the_message_id_of_another_first(server: ShippedNats) -> None:
    """A driver result's id follows from its command's (`gpuop.events.ids`). Discovery
    stores, on its own subject, that id as it is and as discovery's key would make it; the
    driver-manager's result is stored all the same, and its retry is still dropped."""
    loaded = next(p for p in SAMPLES if isinstance(p, driver.DriverLoaded))
    result = envelope_of(loaded)
    carrier = subject_of(next(p for p in SAMPLES if isinstance(p, hardware.HardwareHeartbeat)))
    squats = [
        result.id,
        message_id(id_key([server.url("discovery")]), subject_of(loaded), result.id),
    ]
    admin = server.bus("admin")
    await admin.start()  # the streams
    await admin.close()
    manager = server.bus("driver-manager")
    await manager.connect()
    try:
        async with server.client("discovery") as squatter:
            js = squatter.nc.jetstream()
            for squat in squats:
                ack = await js.publish(carrier, b"{}", headers={"Nats-Msg-Id": squat}, timeout=5.0)
                assert not ack.duplicate
        first = await manager.publish(result)
        retry = await manager.publish(result, republish=True)
    finally:
        await manager.close()
    assert not first.duplicate, "the driver result was dropped as a duplicate of a squat"
    assert retry.duplicate and retry.seq == first.seq
