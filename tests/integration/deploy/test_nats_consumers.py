"""Attacks on the JetStream consumers and replies of the shipped deploy/nats configuration,
in a real nats-server, as every service user: creating a consumer with another service's
filter, rewriting the orchestrator's durable, a consumer over every command, pulling from and
acking another's consumer, reading another user's replies, and squatting a message id. Each
attempt's outcome is printed, in two tables:

- callout mode (callout.conf, the chart's default): every service a user of its own node;
  every attempt is refused.
- static mode (accounts.conf, `nats.auth.mode=static`): one user per service; what a static
  per-service file cannot stop is printed as OPEN (deploy/nats/README.md, "What a static
  configuration cannot do") and held to that list, so a change that opens more fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuop.bus import Buckets, IdTaken, NatsBus, grants, streams, tokens, watching
from gpuop.bus.publishing import id_key, message_id
from gpuop.events import driver, subjects
from gpuop.observability.metrics import registry
from gpuop.services.upgrade_orchestrator import intake
from tests.integration.deploy.ownership import PREFIX, SERVICE_USERS, envelope_of, subject_of
from tests.support import callout_nats
from tests.support.event_samples import SAMPLES
from tests.support.shipped_nats import NODE, Refusals, ShippedNats, inbox_of

pytestmark = [pytest.mark.nats, pytest.mark.security]

API = "$JS.API"
EVENTS, COMMANDS = "GPUOP_EVENTS", "GPUOP_COMMANDS"
OTHER_NODE = "gpu-2.example.com"
CLUSTER_CONSUMERS = ("upgrade-orchestrator", "discovery-labeler")
WATCHED_BUCKETS = tuple(
    f"KV_{streams.bucket_name(PREFIX, b)}" for b in (Buckets.IPAM, Buckets.CONFIG, Buckets.SAGAS)
)
WATCH = f"{watching.NAME_PREFIX}0123456789abcdef"
"""A watch's consumer name, as `gpuop.bus.watching` makes them."""


def node_filters() -> dict[str, set[str]]:
    """Each node role's consumer filters on `NODE`, as its service creates them."""
    return {
        role: {f for c in grants.consumers(grants.Identity(role, NODE)) for f in c.filters}
        | set(grants.reads(grants.Identity(role, NODE)))
        for role in grants.NODE_ROLES
    }


def own_filters(user: str) -> set[str]:
    if user in grants.NODE_ROLES:
        return node_filters()[user]
    return set(grants.reads(grants.Identity(user, None)))


def foreign_filters(user: str) -> list[str]:
    """Consumer filters of every other service, on `NODE` for node roles, and the cluster
    consumers' filters, that `user` itself never uses."""
    mine = own_filters(user)
    theirs = {f for filters in node_filters().values() for f in filters}
    theirs |= set(intake.consumer_spec(PREFIX).subjects)
    return sorted(f for f in theirs - mine if not any(streams.subject_matches(m, f) for m in mine))


def stream_of(subject_filter: str) -> str:
    return streams.stream_for(PREFIX, subject_filter).name


def attempts(user: str) -> list[tuple[str, str]]:
    """(what, subject) for every attack `user` tries."""
    tried = [
        (
            f"consumer with another service's filter {f}",
            f"{API}.CONSUMER.CREATE.{stream_of(f)}.spy.{f}",
        )
        for f in foreign_filters(user)
    ]
    if user != "upgrade-orchestrator":
        own = sorted(own_filters(user)) or [f"{PREFIX}.evt.hardware.*.*"]
        tried += [
            (
                "update the orchestrator's durable",
                f"{API}.CONSUMER.CREATE.{EVENTS}.upgrade-orchestrator.{own[0]}",
            ),
            (
                "update the orchestrator's durable",
                f"{API}.CONSUMER.CREATE.{EVENTS}.upgrade-orchestrator",
            ),
            (
                "update the orchestrator's durable",
                f"{API}.CONSUMER.DURABLE.CREATE.{EVENTS}.upgrade-orchestrator",
            ),
        ]
    for consumer in CLUSTER_CONSUMERS:
        if user == {"upgrade-orchestrator": "upgrade-orchestrator"}.get(
            consumer, "discovery-cluster"
        ):
            continue
        tried += [
            (f"pull from {consumer}", f"{API}.CONSUMER.MSG.NEXT.{EVENTS}.{consumer}"),
            (f"ack for {consumer}", f"$JS.ACK.{EVENTS}.{consumer}.1.7.7.1700000000000000000.0"),
        ]
    tried += [
        ("a consumer over every command", f"{API}.CONSUMER.CREATE.{COMMANDS}.spy.{PREFIX}.cmd.>"),
        (
            "a consumer over every command",
            f"{API}.CONSUMER.CREATE.{COMMANDS}.spy.{PREFIX}.cmd.*.*.*",
        ),
        ("a consumer over every command", f"{API}.CONSUMER.CREATE.{COMMANDS}"),
        ("a consumer over every command", f"{API}.CONSUMER.DURABLE.CREATE.{COMMANDS}.spy"),
        ("a consumer over every event", f"{API}.CONSUMER.CREATE.{EVENTS}.spy.{PREFIX}.evt.>"),
        ("a consumer over every event", f"{API}.CONSUMER.CREATE.{EVENTS}"),
    ]
    tried += [
        # a watch's consumer has a random name, so a grant of its info could only be for
        # every consumer of the bucket, and would show every other watch's filter
        (
            f"read a watch's consumer info on {bucket}",
            f"{API}.CONSUMER.INFO.{bucket}.{WATCH}",
        )
        for bucket in WATCHED_BUCKETS
    ]
    token = subjects.encode_node(NODE)
    other = subjects.encode_node(OTHER_NODE)
    victim = (
        f"driver-manager-{token}" if user != "driver-manager" else f"discovery-{token}-commands"
    )
    tried += [
        # what a static file cannot name: consumers whose names carry the node
        (
            "pull another service's node consumer",
            f"{API}.CONSUMER.MSG.NEXT.{COMMANDS}.{victim}",
        ),
        (
            "ack another service's node consumer",
            f"$JS.ACK.{COMMANDS}.{victim}.1.7.7.1700000000000000000.0",
        ),
        (
            "pull another node's consumer of its own service",
            f"{API}.CONSUMER.MSG.NEXT.{COMMANDS}.{user}-{other}-commands",
        ),
    ]
    if user in grants.NODE_ROLES and user != "driver-manager":
        mine = sorted(f for f in own_filters(user) if stream_of(f) == COMMANDS)
        if mine:
            tried.append(
                (
                    "re-filter another service's node consumer",
                    f"{API}.CONSUMER.CREATE.{COMMANDS}.driver-manager-{token}.{mine[0]}",
                )
            )
    return tried


def open_statically(user: str, subject: str) -> bool:
    """What deploy/nats/README.md says a static file leaves open: a node user pulls, acks
    and re-filters node consumers of the streams it reads, whatever their name, and creates
    consumers with its own service's filters for any node."""
    if user not in grants.NODE_ROLES:
        return False
    tokens = subject.split(".")
    if subject.startswith((f"{API}.CONSUMER.MSG.NEXT.", "$JS.ACK.")):
        stream = tokens[5] if subject.startswith(API) else tokens[2]
        name = tokens[6] if subject.startswith(API) else tokens[3]
        readable = {stream_of(f) for f in own_filters(user)}
        return stream in readable and name not in CLUSTER_CONSUMERS
    if subject.startswith(f"{API}.CONSUMER.CREATE.") and len(tokens) > 6:
        # its own service's filters, for any node: the node token is wildcarded
        token = subjects.encode_node(NODE)
        widened = {f.replace(f".{token}.", ".*.") for f in own_filters(user)}
        wanted = ".".join(tokens[6:])
        return tokens[5] not in CLUSTER_CONSUMERS and any(
            streams.subject_matches(pattern, wanted) for pattern in widened
        )
    return False


INBOXES = ("_INBOX.>", *(f"{grants.INBOX}_{role}.>" for role in sorted(grants.ROLES)))


@pytest.mark.parametrize("user", SERVICE_USERS)
async def test_in_callout_mode_no_user_reaches_another_users_consumers_or_replies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, user: str
) -> None:
    """The same attempts as in static mode, each user admitted by the callout as its role on
    `NODE` (a node role) or as the cluster role: none left open."""
    identity = grants.Identity(user, NODE if user in grants.NODE_ROLES else None)
    async with callout_nats.running(tmp_path / "nats") as server:
        monkeypatch.setenv("SSL_CERT_FILE", str(server.ca_file))
        admin = NatsBus(
            server.url.replace("tls://", f"tls://admin:{server.passwords['admin']}@"),
            name="test-admin",
        )
        await admin.start()  # the streams, the buckets and the orchestrator's durable
        try:
            subscription = await admin.consume(intake.consumer_spec(PREFIX), _ignore)
            await subscription.stop()
            before = (await admin.js.consumer_info(EVENTS, "upgrade-orchestrator")).config
            tried = attempts(user)
            client = Refusals()
            client.nc = await server.token_client(
                server.token(user, identity.node), identity, error_cb=client.record
            )
            try:
                for _, subject in tried:
                    await client.nc.publish(subject, b'{"stream_name":"x","config":{}}')
                # every other identity's replies: other services', its own service's on
                # every node and on another node (a static user's own prefix covered those)
                own = f"{grants.inbox_prefix(identity)}.>"
                others = [s for s in INBOXES if s != own]
                if identity.node is not None:
                    other = grants.Identity(user, OTHER_NODE)
                    others.append(f"{grants.inbox_prefix(other)}.>")
                for inbox in others:
                    await client.nc.subscribe(inbox)
                await client.settle()
            finally:
                await client.nc.close()
            after = (await admin.js.consumer_info(EVENTS, "upgrade-orchestrator")).config
        finally:
            await admin.close()

    rows, opened = [f"callout mode (the chart's default), {identity}:"], []
    for what, subject in tried:
        refused = client.refused_publish(subject)
        rows.append(f"{user:<24} {what:<50} {subject:<100} {'refused' if refused else 'OPEN'}")
        if not refused:
            opened.append((what, subject))
    for inbox in others:
        refused = client.refused_subscription(inbox)
        rows.append(f"{user:<24} {'read another user`s replies':<50} {inbox:<100} "
                    f"{'refused' if refused else 'OPEN'}")  # fmt: skip
        if not refused:
            opened.append(("subscribe", inbox))
    print("\n" + "\n".join(rows))
    assert opened == []
    assert after.filter_subjects == before.filter_subjects, "the orchestrator's durable changed"


@pytest.mark.parametrize("user", SERVICE_USERS)
async def test_in_static_mode_no_user_reaches_another_users_consumers_or_replies(
    server: ShippedNats, user: str
) -> None:
    orchestrator = server.bus("upgrade-orchestrator")
    admin = server.bus("admin")
    await orchestrator.start()
    await admin.connect()
    try:
        subscription = await orchestrator.consume(intake.consumer_spec(PREFIX), _ignore)
        await subscription.stop()
        before = (await admin.js.consumer_info(EVENTS, "upgrade-orchestrator")).config
        tried = attempts(user)
        async with server.client(user) as client:
            for _, subject in tried:
                await client.nc.publish(subject, b'{"stream_name":"x","config":{}}')
            others = [s for s in INBOXES if not s.startswith(inbox_of(user) + ".")]
            if user in grants.NODE_ROLES:  # a static user's own prefix covers its nodes
                others = [s for s in others if s != f"{grants.INBOX}_{user}.>"]
            for inbox in others:
                await client.nc.subscribe(inbox)
            await client.settle()
        after = (await admin.js.consumer_info(EVENTS, "upgrade-orchestrator")).config
    finally:
        await orchestrator.close()
        await admin.close()

    rows = [f"static mode (nats.auth.mode=static), {user}: OPEN rows stay open there"]
    unexpected = []
    for what, subject in tried:
        refused = client.refused_publish(subject)
        expected_open = open_statically(user, subject)
        outcome = "refused" if refused else "OPEN (static file; callout mode closes it)"
        if refused == expected_open:
            unexpected.append((what, subject, outcome))
        rows.append(f"{user:<24} {what:<50} {subject:<100} {outcome}")
    for inbox in others:
        refused = client.refused_subscription(inbox)
        rows.append(f"{user:<24} {'read another user`s replies':<50} {inbox:<100} "
                    f"{'refused' if refused else 'ALLOWED'}")  # fmt: skip
        if not refused:
            unexpected.append(("subscribe", inbox, "allowed"))
    print("\n" + "\n".join(rows))
    assert unexpected == []
    assert after.filter_subjects == before.filter_subjects, "the orchestrator's durable changed"


async def _ignore(delivery: object) -> None:
    """Nothing is consumed: the attacks only try to reach the consumers."""


async def test_a_squatted_message_id_is_an_alarm_for_the_real_publisher(
    server: ShippedNats,
) -> None:
    """The driver-manager of gpu-2 shares its static user, so its message-id key, with the
    driver-manager of gpu-1: it can store gpu-1's next driver result id on a subject of its
    own, and the real result is then dropped. Not prevented by a static file (per-node users
    have keys of their own); detected: the real publisher's first try is answered as a
    duplicate, logged, counted and raised as `IdTaken`, never taken for a success."""
    loaded = next(p for p in SAMPLES if isinstance(p, driver.DriverLoaded))
    result = envelope_of(loaded)
    key = id_key([server.url("driver-manager")])
    squat = message_id(key, subject_of(loaded), result.id)
    elsewhere = subjects.event_subject(driver.DriverLoaded.DOMAIN, OTHER_NODE, "loaded")
    taken = registry().get_sample_value("gpuop_bus_ids_taken_total", {"kind": "evt"}) or 0.0
    squatter = server.bus("driver-manager", node=OTHER_NODE)
    victim = server.bus("driver-manager")
    await squatter.start()
    await victim.connect()
    try:
        await squatter.publish_raw(elsewhere, b"{}", {"Nats-Msg-Id": squat})
        with pytest.raises(IdTaken, match="driver") as alarm:
            await victim.publish(result)
    finally:
        await squatter.close()
        await victim.close()
    print(
        f"\ndriver-manager@{OTHER_NODE} stores the id of {subject_of(loaded)} on {elsewhere}: "
        f"the real publisher gets {type(alarm.value).__name__}: {alarm.value}"
    )
    assert registry().get_sample_value("gpuop_bus_ids_taken_total", {"kind": "evt"}) == taken + 1


async def test_in_callout_mode_another_nodes_driver_manager_cannot_squat_a_result_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The static squat above, with each driver-manager a user of its own node (callout
    mode): gpu-2's agent stores, on its own node's subject, every id of gpu-1's next driver
    result it can compute (the envelope id, and that id keyed with its own key file); the
    real result is stored all the same. Only gpu-1's key makes its ids, and that key never
    leaves gpu-1's pod: were it leaked, the squat would drop the real result, and the real
    publisher's first try is then an alarm (`IdTaken`, counted), never a success."""
    victim_id = grants.Identity("driver-manager", NODE)
    squatter_id = grants.Identity("driver-manager", OTHER_NODE)
    loaded = next(p for p in SAMPLES if isinstance(p, driver.DriverLoaded))
    result, next_result = envelope_of(loaded), envelope_of(loaded)
    subject = subject_of(loaded)
    elsewhere = subjects.event_subject(driver.DriverLoaded.DOMAIN, OTHER_NODE, "loaded")
    taken = registry().get_sample_value("gpuop_bus_ids_taken_total", {"kind": "evt"}) or 0.0
    async with callout_nats.running(tmp_path / "nats") as server:
        monkeypatch.setenv("SSL_CERT_FILE", str(server.ca_file))

        def agent(identity: grants.Identity) -> tuple[NatsBus, Path]:
            token, key = tmp_path / f"{identity.node}.token", tmp_path / f"{identity.node}.key"
            token.write_text(server.token(identity.role, identity.node))
            bus = NatsBus(
                server.url,
                name=f"test-{identity}",
                identity=identity,
                token_file=str(token),
                id_key_file=str(key),
            )
            return bus, key

        admin = NatsBus(
            server.url.replace("tls://", f"tls://admin:{server.passwords['admin']}@"),
            name="test-admin",
        )
        await admin.start()
        await admin.close()
        (victim, victim_key), (squatter, squatter_key) = agent(victim_id), agent(squatter_id)
        await victim.connect()
        await squatter.connect()
        rows: list[tuple[str, str, str]] = []
        try:
            own = id_key([server.url], tokens.id_key(squatter_key))
            computable = {
                "squat gpu-1's result id: the envelope id": result.id,
                "squat gpu-1's result id: keyed by its own key": message_id(
                    own, subject, result.id
                ),
            }
            for what, squat in computable.items():
                await squatter.publish_raw(elsewhere, b"{}", {"Nats-Msg-Id": squat})
                rows.append((what, squat, "no effect"))
            stored = await victim.publish(result)
            rows = [(w, s, f"{o}: the real result is stored") for w, s, o in rows]
            leaked = id_key([server.url], tokens.id_key(victim_key))
            squat = message_id(leaked, subject, next_result.id)
            await squatter.publish_raw(elsewhere, b"{}", {"Nats-Msg-Id": squat})
            with pytest.raises(IdTaken, match="driver") as alarm:
                await victim.publish(next_result)
            outcome = f"alarm for the real publisher: {type(alarm.value).__name__}"
            rows.append(("squat with gpu-1's key (were it leaked)", squat, outcome))
        finally:
            await squatter.close()
            await victim.close()
    lines = [f"callout mode (the chart's default), {squatter_id} against {victim_id}:"]
    lines += [f"{'driver-manager':<24} {w:<50} {s:<100} {o}" for w, s, o in rows]
    print("\n" + "\n".join(lines))
    assert not stored.duplicate
    assert registry().get_sample_value("gpuop_bus_ids_taken_total", {"kind": "evt"}) == taken + 1
