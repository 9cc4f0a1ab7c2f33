"""`gpuop.bus.grants`: the exact permissions of one identity, checked against the consumers
the services really create, so a consumer that drifts from the table fails here."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

import pytest

from gpuop.bus import Buckets, ConsumerSpec, InMemoryBus, grants, streams
from gpuop.bus.grants import Identity
from gpuop.services.device_plugin import consumers as device_plugin
from gpuop.services.discovery import consumers as discovery
from gpuop.services.driver_manager.agent import CommandAgent
from gpuop.services.driver_manager.config import DriverManagerConfig
from gpuop.services.network_manager import addressing
from gpuop.services.network_manager import consumers as network_manager
from gpuop.services.telemetry import consumers as telemetry
from gpuop.services.upgrade_orchestrator import intake

NODE = "gpu-1.example.com"
PREFIX = "gpuop"


def _driver_manager_spec(node: str) -> ConsumerSpec:
    agent = CommandAgent.__new__(CommandAgent)
    agent.bus = InMemoryBus(prefix=PREFIX)
    agent.node = node
    return agent.consumer_spec(DriverManagerConfig())


def service_specs(role: str, node: str) -> list[ConsumerSpec]:
    """Every durable consumer the service of `role` creates on `node`, as the service
    builds it."""
    kw = {"retry_delay": 1.0}
    built: dict[str, list[ConsumerSpec]] = {
        "discovery": [
            discovery.node_commands(PREFIX, node, **kw),
            discovery.node_rescans(PREFIX, node, **kw),
            discovery.node_driver_results(PREFIX, node, **kw),
        ],
        "driver-manager": [_driver_manager_spec(node)],
        "device-plugin": [
            device_plugin.node_commands(PREFIX, node, **kw),
            device_plugin.node_own_commands(PREFIX, node, **kw),
            device_plugin.node_health(PREFIX, node, **kw),
            device_plugin.node_config(PREFIX, node, **kw),
        ],
        "network-manager": [
            network_manager.node_commands(PREFIX, node, **kw),
            network_manager.node_driver_results(PREFIX, node, **kw),
        ],
        "telemetry": [telemetry.node_commands(PREFIX, node, **kw)],
    }
    return built[role]


def matches(pattern: str, subject: str) -> bool:
    return streams.subject_matches(pattern, subject)


def allowed(granted: tuple[str, ...], subject: str) -> bool:
    return any(matches(pattern, subject) for pattern in granted)


@pytest.mark.parametrize("role", sorted(grants.NODE_ROLES))
def test_grants_allow_exactly_the_consumers_each_node_agent_creates(role: str) -> None:
    identity = Identity(role, NODE)
    granted = grants.for_identity(identity, prefix=PREFIX)
    creates = {p for p in granted.publish if p.startswith("$JS.API.CONSUMER.CREATE.GPUOP_")}
    wanted = set()
    for spec in service_specs(role, NODE):
        assert len(spec.subjects) == 1, f"{spec.durable} has several filters: {spec.subjects}"
        (only,) = spec.subjects
        stream = streams.stream_for(PREFIX, only).name
        subject = f"$JS.API.CONSUMER.CREATE.{stream}.{spec.durable}.{only}"
        wanted.add(subject)
        assert allowed(granted.publish, f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{spec.durable}")
        assert allowed(granted.publish, f"$JS.ACK.{stream}.{spec.durable}.1.2.3.4.5")
        assert allowed(granted.publish, subjects_dlq(only))
    reads = {c for c in creates if "-read-" in c}
    assert creates - reads == wanted


def subjects_dlq(subject_filter: str) -> str:
    return f"{PREFIX}.dlq.{subject_filter}"


def test_cluster_consumers_are_pinned_by_name_as_the_services_name_them() -> None:
    orchestrator = grants.for_identity(Identity("upgrade-orchestrator", None))
    spec = intake.consumer_spec(PREFIX)
    assert f"$JS.API.CONSUMER.CREATE.GPUOP_EVENTS.{spec.durable}" in orchestrator.publish
    labeler = grants.for_identity(Identity("discovery-cluster", None))
    spec = discovery.labeler(PREFIX, retry_delay=1.0)
    assert f"$JS.API.CONSUMER.CREATE.GPUOP_EVENTS.{spec.durable}" in labeler.publish
    for granted in (orchestrator, labeler):
        # a stream's consumers; the KV watches' are bound by filter (next test)
        assert not any(
            p.endswith(".>") and "CONSUMER.CREATE" in p and ".KV_" not in p for p in granted.publish
        )


@pytest.mark.parametrize("role", sorted(grants.NODE_ROLES))
def test_a_node_agent_may_not_act_for_another_node(role: str) -> None:
    mine = grants.for_identity(Identity(role, "gpu-1"))
    theirs = grants.for_identity(Identity(role, "gpu-2"))
    shared = set(mine.publish) & set(theirs.publish)
    for subject in shared:
        assert "gpu-1" not in subject and "gpu-2" not in subject
        assert not subject.startswith("gpuop.evt."), subject
        assert "CONSUMER.CREATE.GPUOP" not in subject, subject
    for subject in theirs.publish:
        if "gpu-2" in subject:
            assert not allowed(mine.publish, subject), subject
    assert mine.subscribe == (f"_INBOX_{role}.gpu-1.>",)
    assert not allowed(mine.subscribe, f"_INBOX_{role}.gpu-2.abc")


def test_node_names_with_dots_are_encoded_and_cannot_reach_a_longer_name() -> None:
    granted = grants.for_identity(Identity("driver-manager", "a.b"))
    assert "gpuop.evt.driver.a_b.installed" in granted.publish
    assert not allowed(granted.publish, "gpuop.evt.driver.a_b_c.installed")
    assert granted.inbox_prefix == "_INBOX_driver-manager.a_b"


def test_no_node_agent_may_read_commands_or_events_wholesale() -> None:
    for role in grants.NODE_ROLES:
        granted = grants.for_identity(Identity(role, NODE))
        for attempt in (
            "$JS.API.CONSUMER.CREATE.GPUOP_COMMANDS",
            "$JS.API.CONSUMER.CREATE.GPUOP_COMMANDS.x.gpuop.cmd.>",
            "$JS.API.CONSUMER.CREATE.GPUOP_EVENTS.upgrade-orchestrator.gpuop.evt.>",
            "$JS.API.CONSUMER.DURABLE.CREATE.GPUOP_COMMANDS.x",
            "$JS.API.CONSUMER.MSG.NEXT.GPUOP_COMMANDS.upgrade-orchestrator",
            "$JS.API.STREAM.MSG.GET.KV_gpuop_nodes",
            "$JS.API.DIRECT.GET.KV_gpuop_nodes",
            "$JS.API.STREAM.DELETE.GPUOP_EVENTS",
        ):
            assert not allowed(granted.publish, attempt), (role, attempt)
        assert not allowed(granted.subscribe, "_INBOX.abc")


def test_the_kv_grants_are_key_scoped_for_node_agents() -> None:
    granted = grants.for_identity(Identity("discovery", "gpu-1"))
    assert allowed(granted.publish, "$KV.gpuop_nodes.gpu-1")
    assert allowed(granted.publish, "$JS.API.DIRECT.GET.KV_gpuop_nodes.$KV.gpuop_nodes.gpu-1")
    assert not allowed(granted.publish, "$KV.gpuop_nodes.gpu-2")
    assert not allowed(granted.publish, "$JS.API.DIRECT.GET.KV_gpuop_nodes.$KV.gpuop_nodes.gpu-2")


def test_kv_watches_are_bound_by_filter_to_the_keys_a_user_reads() -> None:
    api = "$JS.API.CONSUMER.CREATE.KV_gpuop_ipam"
    granted = grants.for_identity(Identity("network-manager", "gpu-1"))
    assert allowed(granted.publish, f"{api}.gpuop-watch-1.$KV.gpuop_ipam.node.gpu-1.>")
    assert allowed(granted.publish, f"{api}.gpuop-watch-1.$KV.gpuop_ipam.claim.*.10_0_0_0-24.>")
    assert allowed(granted.publish, f"{api}.gpuop-watch-1.$KV.gpuop_ipam.addr.10_0_0_0-24.>")
    for foreign in ("node.gpu-2.>", "node.>", ">", "node.*.>"):
        assert not allowed(granted.publish, f"{api}.gpuop-watch-1.$KV.gpuop_ipam.{foreign}")
    # the legacy create, filter in the body, binds nothing: nobody but admin has it
    for role in grants.ROLES - {"observer"}:
        node = "gpu-1" if role in grants.NODE_ROLES else None
        publish = grants.for_identity(Identity(role, node)).publish
        for bucket in ("ipam", "config", "nodes", "sagas"):
            assert not allowed(publish, f"$JS.API.CONSUMER.CREATE.KV_gpuop_{bucket}"), role
    discovery = grants.for_identity(Identity("discovery", "gpu-1")).publish
    assert not any("CONSUMER.CREATE.KV_" in p for p in discovery)


def test_a_network_manager_writes_only_its_own_address_claims_and_reads_every_nodes() -> None:
    address = ipaddress.ip_interface("10.10.0.5/24")
    ipv6 = ipaddress.ip_interface("fd00:10::5/64")
    granted = grants.for_identity(Identity("network-manager", NODE)).publish
    for held in (address, ipv6):
        mine, theirs = addressing.claim_key(held, NODE), addressing.claim_key(held, "gpu-2")
        assert allowed(granted, f"$KV.gpuop_ipam.{mine}")
        assert not allowed(granted, f"$KV.gpuop_ipam.{theirs}")
        # claims from before the node was in the key are read, never written
        assert not allowed(granted, f"$KV.gpuop_ipam.{addressing.legacy_claim_key(held)}")
        legacy = addressing.legacy_claim_key(held)
        assert allowed(granted, f"$JS.API.DIRECT.GET.KV_gpuop_ipam.$KV.gpuop_ipam.{legacy}")
        every = addressing.claims_filter(held)
        assert allowed(
            granted,
            f"$JS.API.CONSUMER.CREATE.KV_gpuop_ipam.gpuop-watch-1.$KV.gpuop_ipam.{every}",
        )
    assert not allowed(granted, "$KV.gpuop_ipam.claim.>")
    assert not allowed(granted, "$KV.gpuop_ipam.addr.>")
    assert not allowed(granted, "$JS.API.STREAM.PURGE.KV_gpuop_ipam")
    static = grants.for_service("network-manager").publish
    assert allowed(static, f"$KV.gpuop_ipam.{addressing.claim_key(address, 'gpu-2')}")
    assert not allowed(static, f"$KV.gpuop_ipam.{addressing.legacy_claim_key(address)}")


@pytest.mark.parametrize(
    ("role", "node", "wrong"),
    [
        ("spy", None, "unknown NATS role 'spy'"),
        ("driver-manager", None, "runs on a node"),
        ("upgrade-orchestrator", "gpu-1", "is a cluster role"),
        ("telemetry", "Not_A_Node", "Not_A_Node"),
    ],
)
def test_a_wrong_identity_is_refused_naming_what_is_wrong(
    role: str, node: str | None, wrong: str
) -> None:
    with pytest.raises(ValueError, match=wrong):
        Identity(role, node)


def test_prefixes_other_than_gpuop_rename_everything() -> None:
    granted = grants.for_identity(Identity("telemetry", "gpu-1"), prefix="lab")
    assert all("gpuop" not in subject for subject in granted.publish)
    assert "$JS.API.STREAM.CREATE.LAB_EVENTS" in granted.publish


def _shipped_users() -> dict[str, dict[str, list[str]]]:
    """deploy/nats/accounts.conf's users: their publish allow and deny lists and their
    subscribe allow list."""
    text = (Path(__file__).resolve().parents[2] / "deploy/nats/accounts.conf").read_text()
    code = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    users: dict[str, dict[str, list[str]]] = {}
    for block in re.split(r"\n\s*\{\s*\n\s*user:", code)[1:]:
        name = re.match(r'\s*"([^"]+)"', block)
        assert name is not None
        lists: dict[str, list[str]] = {}
        for kind, pattern in (
            ("allow", r"publish:\s*\{\s*allow:\s*\[([^\]]*)\]"),
            ("deny", r"publish:\s*\{\s*allow:\s*\[[^\]]*\]\s*deny:\s*\[([^\]]*)\]"),
            ("subscribe", r"subscribe:\s*\{\s*allow:\s*\[([^\]]*)\]"),
        ):
            found = re.search(pattern, block)
            lists[kind] = re.findall(r'"([^"]+)"', found[1]) if found else []
        users[name[1]] = lists
    return users


@pytest.mark.parametrize("role", sorted(grants.ROLES - {"observer"}))
def test_the_shipped_static_users_are_the_grants_of_their_service(role: str) -> None:
    shipped = _shipped_users()[role]
    rendered = grants.for_service(role)
    assert shipped["allow"] == list(rendered.publish)
    assert shipped["deny"] == list(rendered.deny_publish)
    assert shipped["subscribe"] == list(rendered.subscribe)


def test_a_static_node_user_names_no_node_and_may_not_touch_the_cluster_consumers() -> None:
    for role in grants.NODE_ROLES:
        rendered = grants.for_service(role)
        assert not any(grants.ANY_NODE in s for s in rendered.publish), role
        assert rendered.subscribe == (f"_INBOX_{role}.>",)
        for name in ("upgrade-orchestrator", "discovery-labeler"):
            for subject in (
                f"$JS.API.CONSUMER.CREATE.GPUOP_EVENTS.{name}.gpuop.evt.driver.gpu-1.*",
                f"$JS.API.CONSUMER.MSG.NEXT.GPUOP_EVENTS.{name}",
                f"$JS.ACK.GPUOP_EVENTS.{name}.1.2.3.4.5",
            ):
                assert not allowed(rendered.publish, subject) or allowed(
                    rendered.deny_publish, subject
                ), (role, subject)


def test_the_orchestrator_reads_the_last_upgrade_event_by_direct_get_only() -> None:
    publish = grants.for_identity(Identity("upgrade-orchestrator", None)).publish
    api = "$JS.API.DIRECT.GET.GPUOP_EVENTS"
    assert allowed(publish, f"{api}.gpuop.evt.upgrade.gpu-1.cordon-required")
    assert not allowed(publish, f"{api}.gpuop.evt.hardware.gpu-1.discovered")
    assert not allowed(publish, api)  # by sequence, subject in the body
    assert not allowed(publish, "$JS.API.STREAM.MSG.GET.GPUOP_EVENTS")


@pytest.mark.parametrize("role", sorted(grants.ROLES))
def test_no_user_may_read_the_info_of_a_kv_watchs_consumer(role: str) -> None:
    """A watch learns what it has to catch up on from its consumer's creation
    (gpuop.bus.watching): the info of a watch's consumer, whose name is random, would show
    any other watch's filter."""
    node = NODE if role in grants.NODE_ROLES else None
    for granted in (grants.for_identity(Identity(role, node)), grants.for_service(role)):
        for bucket in Buckets:
            stream = f"KV_{streams.bucket_name(PREFIX, bucket)}"
            subject = f"$JS.API.CONSUMER.INFO.{stream}.gpuop-watch-0123456789abcdef"
            assert not allowed(granted.publish, subject), (role, subject)


def test_the_telemetry_cluster_role_may_read_everything_its_exporter_reads() -> None:
    """Its history (upgrades and GPU health, replayed at start) and the streams it counts:
    a read the grants lack is a consumer the server refuses, and the role restarts forever."""
    from prometheus_client import CollectorRegistry

    from gpuop.services.telemetry.cluster_exporter import ClusterExporter
    from gpuop.services.telemetry.config import TelemetryConfig

    exporter = ClusterExporter(InMemoryBus(prefix=PREFIX), CollectorRegistry(), TelemetryConfig())
    read = (*exporter._history, exporter._everything, exporter._dead_letters)
    allowed = grants.reads(Identity("telemetry-cluster", None), prefix=PREFIX)
    assert [f for f in read if f not in allowed] == []
