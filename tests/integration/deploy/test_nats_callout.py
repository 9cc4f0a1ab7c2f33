"""Callout mode against a real nats-server: deploy/nats/callout.conf as shipped, gpuop's auth
callout answering with an in-memory token authority. One node's credential cannot act for
another node; a token the authority refuses, or no callout at all, keeps a client out while
admin still gets in; a user that expires with its token is disconnected and comes back with
the refreshed token."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats.errors
import pytest
from nats.js.api import ConsumerConfig

from gpuop.bus import NatsBus, grants, nkeys, tokens, watching
from gpuop.bus.errors import BusUnavailable
from gpuop.bus.publishing import message_id
from gpuop.events import driver, new_event
from tests.support.callout_nats import CalloutNats
from tests.support.shipped_nats import Refusals
from tests.support.waiting import eventually

pytestmark = [pytest.mark.nats, pytest.mark.security]

GPU_1 = grants.Identity("driver-manager", "gpu-1")
COMMANDS = "GPUOP_COMMANDS"


@pytest.fixture
def server(callout_server: CalloutNats) -> CalloutNats:
    return callout_server


async def connected(server: CalloutNats, identity: grants.Identity) -> Refusals:
    refusals = Refusals()
    token = server.token(identity.role, identity.node)
    refusals.nc = await server.token_client(token, identity, error_cb=refusals.record)
    return refusals


async def refused_request(client: Refusals, subject: str, body: bytes = b"") -> None:
    with pytest.raises(nats.errors.TimeoutError):
        await client.nc.request(subject, body, timeout=0.5)
    await client.settle()
    assert client.refused_publish(subject), client.errors


async def test_a_driver_manager_works_for_its_node_and_cannot_act_for_another(
    server: CalloutNats,
) -> None:
    admin = await server.password_client("admin")
    client = await connected(server, GPU_1)
    try:
        js = client.nc.jetstream()
        # its own work: publish its node's driver events, consume its node's commands
        ack = await js.publish("gpuop.evt.driver.gpu-1.loaded", b"{}", timeout=5)
        assert ack.stream == "GPUOP_EVENTS"
        admin_js = admin.jetstream()
        for node in ("gpu-1", "gpu-2"):
            await admin_js.publish(f"gpuop.cmd.driver-manager.{node}.install", node.encode())
        (own,) = grants.consumers(GPU_1)
        # as NatsBus.consume does: the filter in the create subject, then bound by name
        config = ConsumerConfig(
            name=own.durable, durable_name=own.durable, filter_subject=own.filters[0]
        )
        await js.add_consumer(COMMANDS, config)
        pull = await js.pull_subscribe_bind(durable=own.durable, stream=COMMANDS)
        (message,) = await pull.fetch(1, timeout=5)
        assert (message.subject, message.data) == (
            "gpuop.cmd.driver-manager.gpu-1.install",
            b"gpu-1",
        )
        await message.ack()

        # another node's: its events, its commands, its consumer
        await client.nc.publish("gpuop.evt.driver.gpu-2.loaded", b"forged")
        await client.settle()
        assert client.refused_publish("gpuop.evt.driver.gpu-2.loaded")
        await refused_request(
            client,
            f"$JS.API.CONSUMER.CREATE.{COMMANDS}.driver-manager-gpu-2"
            ".gpuop.cmd.driver-manager.gpu-2.*",
        )
        await refused_request(client, f"$JS.API.CONSUMER.MSG.NEXT.{COMMANDS}.driver-manager-gpu-2")
        await refused_request(client, f"$JS.API.CONSUMER.CREATE.{COMMANDS}")
    finally:
        await client.nc.close()
        await admin.close()


async def test_discovery_writes_and_reads_its_nodes_inventory_only(server: CalloutNats) -> None:
    client = await connected(server, grants.Identity("discovery", "gpu-1"))
    try:
        ack = await client.nc.jetstream().publish("$KV.gpuop_nodes.gpu-1", b"{}", timeout=5)
        assert ack.stream == "KV_gpuop_nodes"
        await client.nc.publish("$KV.gpuop_nodes.gpu-2", b"forged")
        await client.settle()
        assert client.refused_publish("$KV.gpuop_nodes.gpu-2")
        await refused_request(client, "$JS.API.DIRECT.GET.KV_gpuop_nodes.$KV.gpuop_nodes.gpu-2")
        await refused_request(client, "$JS.API.STREAM.MSG.GET.KV_gpuop_nodes", b'{"seq":1}')
    finally:
        await client.nc.close()


async def test_a_node_agent_cannot_read_another_identitys_replies(server: CalloutNats) -> None:
    client = await connected(server, GPU_1)
    try:
        other = grants.inbox_prefix(grants.Identity("driver-manager", "gpu-2"))
        await client.nc.subscribe(f"{other}.>")
        await client.nc.subscribe("_INBOX.>")
        await client.settle()
        assert client.refused_subscription(f"{other}.>")
        assert client.refused_subscription("_INBOX.>")
    finally:
        await client.nc.close()


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        (lambda s: "not-a-token", "not-a-jwt"),
        (lambda s: s.token("driver-manager", "gpu-1", ttl=-5), "not-authenticated"),
        (
            lambda s: s.reviewer.issue("system:serviceaccount:gpuop-system:default", node="gpu-1"),
            "unknown-account",
        ),
        (
            lambda s: s.token(
                "driver-manager", "gpu-1", audiences=("https://kubernetes.default.svc",)
            ),
            "wrong-audience",
        ),
        (lambda s: s.token("driver-manager", None), "no-node"),
    ],
    ids=["unknown", "expired", "foreign-account", "other-audience", "unbound"],
)
async def test_a_token_the_authority_refuses_keeps_the_client_out(
    server: CalloutNats, token: object, reason: str
) -> None:
    with pytest.raises(nats.errors.Error, match=r"(?i)authorization violation"):
        await server.token_client(token(server), GPU_1)  # type: ignore[operator]
    assert server.decisions(reason) == 1
    assert server.decisions("allowed") == 0
    # the server's log says why, in the callout's words
    said = "Auth callout service returned an error: gpuop:"
    await eventually(lambda: said in server.log_file.read_text())


async def test_a_password_is_no_way_around_the_callout(server: CalloutNats) -> None:
    url = server.url.replace("tls://", "tls://driver-manager:guess@")
    with pytest.raises(nats.errors.Error, match=r"(?i)authorization violation"):
        await nats.connect(url, tls=server.tls(), allow_reconnect=False, connect_timeout=5)
    assert server.decisions("no-token") == 1


async def test_without_the_callout_nobody_gets_in_but_admin(server: CalloutNats) -> None:
    await server.stop_callout()
    try:
        nc = await server.token_client(server.token("driver-manager", "gpu-1"), GPU_1)
    except nats.errors.Error:
        pass
    else:
        # nats-py may return from connect before the server's verdict: it never gets in
        assert not nc.is_connected
        await eventually(lambda: nc.is_closed)
    await eventually(lambda: "authentication error" in server.log_file.read_text())
    admin = await server.password_client("admin")
    try:
        info = await admin.jetstream().stream_info("GPUOP_EVENTS")
        assert info.config.name == "GPUOP_EVENTS"
    finally:
        await admin.close()

    await server.start_callout()
    client = await server.token_client(server.token("driver-manager", "gpu-1"), GPU_1)
    await client.close()


async def test_a_user_expires_with_its_token_and_comes_back_with_the_new_one(
    server: CalloutNats, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(server.token("driver-manager", "gpu-1", ttl=2))
    disconnects: list[float] = []
    reconnected = asyncio.Event()

    async def disconnected() -> None:
        disconnects.append(asyncio.get_running_loop().time())

    async def back() -> None:
        reconnected.set()

    async def ignore(error: Exception) -> None:
        pass

    nc = tokens.RotatingClient()
    await nc.connect(
        server.url,
        tls=server.tls(),
        token=tokens.TokenFile(token_file),
        inbox_prefix=grants.inbox_prefix(GPU_1),
        reconnect_time_wait=1,
        max_reconnect_attempts=-1,
        disconnected_cb=disconnected,
        reconnected_cb=back,
        error_cb=ignore,
    )
    try:
        # the server ends the connection when the user (and the token) expires; the client's
        # tries with the expired token are refused until the kubelet writes a new one
        await eventually(lambda: bool(disconnects), timeout=10)
        await eventually(lambda: server.decisions("not-authenticated") >= 1, timeout=10)
        assert not nc.is_closed
        token_file.write_text(server.token("driver-manager", "gpu-1", ttl=600))
        await asyncio.wait_for(reconnected.wait(), 10)
        ack = await nc.jetstream().publish("gpuop.evt.driver.gpu-1.loaded", b"{}", timeout=5)
        assert ack.stream == "GPUOP_EVENTS"
    finally:
        await nc.close()


async def test_a_node_agents_bus_runs_on_its_token_file_with_ids_of_its_own_key(
    server: CalloutNats, tmp_path: Path
) -> None:
    """What `gpuop run` does in callout mode: the bus connects with the token file and keys
    its message ids with a key file it makes, which a restart reads back."""
    identity = grants.Identity("driver-manager", "gpu-1")
    token_file, key_file = tmp_path / "token", tmp_path / "ids" / "driver-manager.key"
    key_file.parent.mkdir()
    token_file.write_text(server.token(identity.role, identity.node))
    envelope = new_event(
        driver.DriverLoaded(command_id="c-1", component=driver.Component.GPU, version="580.1"),
        node="gpu-1",
        source="/test",
    )

    def bus() -> NatsBus:
        return NatsBus(
            server.url,
            name="test-driver-manager",
            identity=identity,
            token_file=str(token_file),
            id_key_file=str(key_file),
        )

    first = bus()
    await first.start()
    try:
        assert not (await first.publish(envelope)).duplicate
    finally:
        await first.close()
    assert key_file.stat().st_mode & 0o777 == 0o600
    again = bus()  # a restart: the same key, so a retried publish is the same message
    await again.connect()
    try:
        assert (await again.publish(envelope, republish=True)).duplicate
    finally:
        await again.close()
    other = grants.Identity("driver-manager", "gpu-2")
    assert message_id(tokens.id_key(key_file), "s", envelope.id) != message_id(
        tokens.id_key(tmp_path / "ids" / "other.key"), "s", envelope.id
    ), other


async def test_a_missing_token_file_is_a_clear_error(server: CalloutNats, tmp_path: Path) -> None:
    bus = NatsBus(
        server.url,
        identity=GPU_1,
        token_file=str(tmp_path / "absent"),
        retry_for=0.1,
    )
    with pytest.raises(BusUnavailable, match=r"cannot read the NATS token file .*absent"):
        await bus.start()


@pytest.mark.parametrize("role", sorted(grants.NODE_ROLES))
async def test_no_node_agent_may_use_any_grant_of_the_same_service_on_another_node(
    server: CalloutNats, role: str
) -> None:
    """Everything the agent of `role` on gpu-2 may publish that the one on gpu-1 may not
    (events, dead letters, consumers, acks, KV keys of gpu-2), tried with gpu-1's token."""
    own = grants.Identity(role, "gpu-1")
    other = grants.for_identity(grants.Identity(role, "gpu-2"))
    foreign = sorted(set(other.publish) - set(grants.for_identity(own).publish))
    assert foreign, f"{role} on gpu-2 has no grant of its own"
    client = await connected(server, own)
    try:
        for subject in foreign:
            # a wildcard in a grant stands for any token: try it with one
            await client.nc.publish(subject.replace(">", "x").replace("*", "x"), b"forged")
        await client.nc.subscribe(f"{other.inbox_prefix}.>")
        await client.settle()
        rows = [
            (subject, client.refused_publish(subject.replace(">", "x").replace("*", "x")))
            for subject in foreign
        ]
        inbox = f"{other.inbox_prefix}.>"
        rows.append((f"subscribe {inbox}", client.refused_subscription(inbox)))
    finally:
        await client.nc.close()
    print(f"\n{role}@gpu-1 trying gpu-2's grants:")
    for attempt, refused in rows:
        print(f"  {'refused' if refused else 'ALLOWED':8} {attempt}")
    assert all(refused for _, refused in rows)


async def test_the_issuer_key_changes_without_a_client_refused(server: CalloutNats) -> None:
    """README's rotation: the callouts get the new key first (and keep the old), then the
    server moves to the new issuer; clients are admitted before and after."""
    old, new = server.issuer, nkeys.KeyPair.generate(nkeys.Kind.ACCOUNT)
    await server.stop_callout()
    server.callout_issuers = [new, old]
    await server.start_callout()
    before = await server.token_client(server.token("driver-manager", "gpu-1"), GPU_1)
    await before.close()

    server.issuer = new
    await server.restart_server()
    after = await server.token_client(server.token("driver-manager", "gpu-1"), GPU_1)
    await after.close()
    assert server.decisions("allowed") == 2
    assert server.decisions("bad-request") == 0


async def test_a_node_agent_watches_its_nodes_kv_keys_and_not_another_nodes(
    server: CalloutNats,
) -> None:
    """KV watches are consumers created with their filter in the subject (gpuop.bus.watching):
    the network-manager of gpu-1 watches its node's IPAM records, and neither another node's
    records, the whole bucket, nor a consumer whose filter travels in the body (nats-py's
    own watch) is created for it."""
    admin = await server.password_client("admin")
    try:
        for node in ("gpu-1", "gpu-2"):
            await admin.jetstream().publish(f"$KV.gpuop_ipam.node.{node}.rdma", node.encode())
    finally:
        await admin.close()
    identity = grants.Identity("network-manager", "gpu-1")
    client = await connected(server, identity)
    js = client.nc.jetstream(timeout=1)
    api = "$JS.API.CONSUMER.CREATE.KV_gpuop_ipam"
    rows = []
    try:
        own, _ = await watching.named_ordered(
            js, "$KV.gpuop_ipam.node.gpu-1.>", stream="KV_gpuop_ipam", deliver=client.nc.new_inbox()
        )
        seen = await own.next_msg(timeout=5)
        assert (seen.subject, seen.data) == ("$KV.gpuop_ipam.node.gpu-1.rdma", b"gpu-1")
        rows.append(("its own node's records", "watched"))
        await own.unsubscribe()
        for what, pattern in (
            ("gpu-2's records", "node.gpu-2.>"),
            ("every node's records", "node.>"),
            ("the whole bucket", ">"),
        ):
            with pytest.raises(nats.errors.TimeoutError):
                await watching.named_ordered(
                    js,
                    f"$KV.gpuop_ipam.{pattern}",
                    stream="KV_gpuop_ipam",
                    deliver=client.nc.new_inbox(),
                )
            await client.settle()
            named = f"{api}.{watching.NAME_PREFIX}".lower()
            refused = [e for e in client.errors if named in e.lower()]
            assert refused and f"$kv.gpuop_ipam.{pattern}" in refused[-1].lower(), client.errors
            rows.append((what, "refused"))
        with pytest.raises(nats.errors.TimeoutError):
            await js.subscribe(
                "$KV.gpuop_ipam.node.gpu-2.>", stream="KV_gpuop_ipam", ordered_consumer=True
            )
        await client.settle()
        assert client.refused_publish(api), client.errors
        rows.append(("gpu-2's records, filter in the body", "refused"))
    finally:
        await client.nc.close()
    print(f"\n{identity.role}@{identity.node} watching KV ipam:")
    for what, outcome in rows:
        print(f"  {outcome:8} {what}")
