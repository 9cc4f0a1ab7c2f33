"""The NATS permissions one identity needs, exactly: what a service on one node (or a cluster
role) may publish and subscribe to, derived from the consumers it creates, the subjects it
publishes and the KV keys it touches.

The auth callout issues `for_identity` as a per-node user's permissions; the test suite
renders it into a server configuration and tries every other node's subjects with it; and the
services build their consumers from `consumer` (the same table), so a consumer that changes
here changes in the grants at once, and one that drifts fails a unit test.

A node agent's grants are exact for its node: its own node token and the exact event names
(`gpuop.events.event_names`, from the events registry) in every event it may publish, its
consumers by name and filter (`$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>`, which only
the filter-in-subject form lets a permission bind), `MSG.NEXT`, `INFO` and acks of
those names only, its dead letters for its node, its own KV key (key-scoped direct gets), and
replies on its own inbox prefix. A stream read back at start (`Bus.read`) uses a short-lived
push consumer named after the identity and the filter (`read_name`), delivering to that inbox.

Cluster roles keep consumers with several filters: their creates are pinned by name
(`CONSUMER.CREATE.<stream>.<name>`), the filters travel in the body.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from gpuop.bus import streams
from gpuop.bus.protocol import Buckets, ConsumerSpec
from gpuop.events import event_names, subjects

NODE_ROLES = frozenset(
    {"discovery", "driver-manager", "device-plugin", "network-manager", "telemetry"}
)
"""Roles that run on every node, one identity per node."""
CLUSTER_ROLES = frozenset(
    {
        "discovery-cluster",
        "device-plugin-cluster",
        "network-manager-cluster",
        "telemetry-cluster",
        "upgrade-orchestrator",
        "observer",
    }
)
"""Roles that run once for the cluster (the observer is external tooling)."""
ROLES = NODE_ROLES | CLUSTER_ROLES
"""Every user of deploy/nats/accounts.conf but `admin`."""
OPERANDS = "operands"
"""The command group every operand on a node consumes (`gpuop.events.device.OPERANDS`)."""
INBOX = "_INBOX"
JS_API = "$JS.API"
CLAIM_SHAPES = ("*.*", "*.*.*.*.*.*.*.*")
"""The tokens after the node of an IPAM claim's key, `<subnet>.<address>`: an IPv6 subnet
and address are one token each (`fd00-0000-…_64`), an IPv4 one four (`10.10.0.0_24`)."""


@dataclass(frozen=True, slots=True)
class Identity:
    """Who connects: a role (a user of deploy/nats) and, for node agents, its node."""

    role: str
    node: str | None
    """The Kubernetes node name of a node agent; None for cluster roles."""

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(
                f"unknown NATS role {self.role!r}: expected one of {', '.join(sorted(ROLES))}"
            )
        if self.role in NODE_ROLES and not self.node:
            raise ValueError(f"role {self.role!r} runs on a node: its identity needs the node")
        if self.role in CLUSTER_ROLES and self.node is not None:
            raise ValueError(
                f"role {self.role!r} is a cluster role: its identity has no node "
                f"(got {self.node!r})"
            )
        if self.node is not None:
            subjects.validate_node_name(self.node)

    @property
    def node_token(self) -> str:
        """The node as a subject token (`gpu-1.example.com` -> `gpu-1_example_com`)."""
        if self.node is None:
            raise ValueError(f"role {self.role!r} has no node")
        return subjects.encode_node(self.node)


@dataclass(frozen=True, slots=True)
class Grants:
    """NATS permissions: subjects that may be published to and subscribed to."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    inbox_prefix: str
    """The prefix of every reply subject of this identity's connection."""
    deny_publish: tuple[str, ...] = ()
    """Taken out of `publish` (a static per-service user's wildcards reach too far)."""


@dataclass(frozen=True, slots=True)
class Consumer:
    """One durable consumer an identity creates."""

    purpose: str
    """What it is for (`commands`, `health`): how a service asks for it."""
    stream: str
    durable: str
    filters: tuple[str, ...]
    """One filter for a node agent (bound in the create subject); several for a cluster role."""
    deliver_new_only: bool = False
    """Start at new messages on first creation (the agent looks at the present at start)."""


def inbox_prefix(identity: Identity) -> str:
    """`_INBOX_<role>.<node token>` for a node agent, `_INBOX_<role>` for a cluster role: a
    static per-service user may then subscribe to `_INBOX_<role>.>`, a per-node one only to
    its node's prefix."""
    if identity.node is None:
        return f"{INBOX}_{identity.role}"
    return f"{INBOX}_{identity.role}.{identity.node_token}"


def read_name(identity: Identity, subject_filter: str) -> str:
    """The name of the short-lived consumer with which `identity` reads `subject_filter`
    back (`Bus.read`): fixed, so a permission can name it, and distinct per filter."""
    digest = hashlib.sha256(subject_filter.encode()).hexdigest()[:12]
    if identity.node is None:
        return f"{identity.role}-read-{digest}"
    return streams.node_durable(identity.role, identity.node, f"read-{digest}")


# --- the table -------------------------------------------------------------------------------


def _node_consumers(role: str, node: str, prefix: str) -> tuple[Consumer, ...]:
    events, commands, _ = (layout.name for layout in streams.layouts(prefix))
    token = subjects.encode_node(node)

    def durable(purpose: str) -> str:
        return streams.node_durable(role, node, purpose)

    def command_filter(service: str) -> str:
        return subjects.commands_filter(service, node, prefix=prefix)

    def event_filter(domain: str, name: str = "*") -> str:
        return subjects.events_filter(domain, node, name, prefix=prefix)

    def on_commands(purpose: str, name: str, service: str, new_only: bool = False) -> Consumer:
        return Consumer(purpose, commands, name, (command_filter(service),), new_only)

    def on_events(purpose: str, subject_filter: str, new_only: bool = False) -> Consumer:
        return Consumer(purpose, events, durable(purpose), (subject_filter,), new_only)

    if role == "discovery":
        return (
            # the operands' pause and resume: the durable that always carried them, from the
            # start of the stream on first creation (a pause sent before the agent ran)
            on_commands("commands", durable("commands"), OPERANDS),
            on_commands("rescan", durable("rescan"), "discovery", new_only=True),
            on_events("driver-events", event_filter("driver"), new_only=True),
        )
    if role == "driver-manager":
        # named before node_durable existed; kept, so a running node resumes where it acked
        return (on_commands("commands", f"driver-manager-{token}", role),)
    if role == "device-plugin":
        return (
            on_commands("commands", durable("commands"), OPERANDS),
            # its own commands: the remediation saga's holder listing
            on_commands("own-commands", durable("own-commands"), role),
            # telemetry's health events and the driver's validations, in the order they
            # happened: one filter over the node's events, of which the agent takes those two
            on_events("health", event_filter("*")),
            on_events("config", event_filter("device", "plugin-config-selected")),
        )
    if role == "network-manager":
        return (
            on_commands("commands", durable("commands"), role),
            on_events("driver-events", event_filter("driver"), new_only=True),
        )
    if role == "telemetry":
        return (on_commands("commands", durable("commands"), OPERANDS),)
    raise ValueError(f"role {role!r} has no node consumers")


_CLUSTER_DURABLES: dict[str, tuple[str, ...]] = {
    "discovery-cluster": ("discovery-labeler",),
    "device-plugin-cluster": ("device-plugin-dra",),
    "upgrade-orchestrator": ("upgrade-orchestrator",),
}
"""Cluster roles' durable consumers, all on the events stream; their filters are in the
services (the orchestrator's come from the saga's fold, which the bus cannot import)."""


def consumers(identity: Identity, *, prefix: str = subjects.DEFAULT_PREFIX) -> tuple[Consumer, ...]:
    """The durable consumers `identity` creates (for a cluster role, name and stream only:
    its filters are empty here)."""
    if identity.node is not None:
        return _node_consumers(identity.role, identity.node, prefix)
    events = streams.layouts(prefix)[0].name
    return tuple(
        Consumer(name, events, name, ()) for name in _CLUSTER_DURABLES.get(identity.role, ())
    )


def consumer(
    identity: Identity, purpose: str, *, prefix: str = subjects.DEFAULT_PREFIX
) -> Consumer:
    """One of `identity`'s consumers, by purpose (`commands`, `health`)."""
    found = consumers(identity, prefix=prefix)
    for candidate in found:
        if candidate.purpose == purpose:
            return candidate
    raise ValueError(
        f"{identity.role} has no consumer for {purpose!r}: "
        f"it has {', '.join(c.purpose for c in found) or 'none'}"
    )


def node_consumer_spec(
    role: str, node: str, purpose: str, *, prefix: str, retry_delay: float
) -> ConsumerSpec:
    """The spec a node agent consumes with: its consumer for `purpose` as granted here (name,
    filter, where it starts on first creation), retrying unknown errors after `retry_delay`."""
    granted = consumer(Identity(role, node), purpose, prefix=prefix)
    return ConsumerSpec(
        durable=granted.durable,
        subjects=granted.filters,
        retry_delay=retry_delay,
        deliver_new_only=granted.deliver_new_only,
    )


def _reads(identity: Identity, prefix: str) -> tuple[str, ...]:
    """Filters `identity` reads back from the streams at start (`Bus.read`)."""
    node = identity.node
    if identity.role in ("discovery", "telemetry") and node is not None:
        return (subjects.commands_filter(OPERANDS, node, prefix=prefix),)
    if identity.role == "device-plugin" and node is not None:
        return (
            subjects.commands_filter(OPERANDS, node, prefix=prefix),
            subjects.events_filter("device", node, "health-changed", prefix=prefix),
            subjects.events_filter("driver", node, "validated", prefix=prefix),
            subjects.events_filter("device", node, "plugin-config-selected", prefix=prefix),
            # the DRA plugin's claims index, rebuilt at start from the cluster role's facts
            subjects.events_filter("dra", node, prefix=prefix),
        )
    if identity.role == "discovery-cluster":
        return (
            subjects.events_filter("device", name="plugin-config-applied", prefix=prefix),
            subjects.events_filter("device", name="plugin-config-selected", prefix=prefix),
            subjects.events_filter("device", name="mig-config-requested", prefix=prefix),
        )
    if identity.role == "device-plugin-cluster":
        # at start: each node's latest device API answer, and what it told of claims
        return (
            subjects.events_filter("device", name="api-applied", prefix=prefix),
            subjects.events_filter("dra", prefix=prefix),
        )
    if identity.role == "telemetry-cluster":
        return (
            subjects.stream_filter(subjects.Kind.EVENT, prefix=prefix),
            subjects.stream_filter(subjects.Kind.DEAD_LETTER, prefix=prefix),
            # the history it replays (`cluster_exporter`): upgrades and GPU health
            subjects.events_filter("upgrade", prefix=prefix),
            subjects.events_filter("device", name="health-changed", prefix=prefix),
        )
    return ()


def reads(identity: Identity, *, prefix: str = subjects.DEFAULT_PREFIX) -> tuple[str, ...]:
    """Filters `identity` may read back with `Bus.read`."""
    return _reads(identity, prefix)


def _node_events(role: str, node: str, prefix: str) -> tuple[str, ...]:
    def event(domain: str, name: str) -> str:
        return subjects.events_filter(domain, node, name, prefix=prefix)

    def every(domain: str) -> tuple[str, ...]:
        # the registry's exact names, never `*`: a subject a node makes up would be one
        # more the event log keeps `events_per_subject` messages of, without bound
        return tuple(event(domain, name) for name in event_names(domain))

    pause = (event("device", "operand-paused"), event("device", "operand-resumed"))
    published: dict[str, tuple[str, ...]] = {
        "discovery": (*every("hardware"), *pause),
        "driver-manager": every("driver"),
        "device-plugin": (
            *pause,
            event("device", "plugin-config-applied"),
            event("device", "mps-daemon-changed"),
            event("device", "gpu-holders-listed"),
            event("device", "gpu-holders-unknown"),
            event("device", "api-applied"),  # which kubelet API serves its GPUs
        ),
        "network-manager": every("network"),
        "telemetry": (event("device", "health-changed"), *pause),
    }
    return published[role]


_CLUSTER_PUBLISHES: dict[str, Callable[[str], tuple[str, ...]]] = {
    "discovery-cluster": lambda p: (
        subjects.events_filter("device", name="plugin-config-selected", prefix=p),
        subjects.events_filter("device", name="mig-config-requested", prefix=p),
    ),
    # the DRA claims' allocations, on any node: only this role reads claims
    "device-plugin-cluster": lambda p: (subjects.events_filter("dra", prefix=p),),
    "network-manager-cluster": lambda p: (),
    "telemetry-cluster": lambda p: (),
    "upgrade-orchestrator": lambda p: (
        subjects.commands_filter(prefix=p),
        subjects.events_filter("kube", prefix=p),
        subjects.events_filter("saga", prefix=p),
        subjects.events_filter("upgrade", prefix=p),
        subjects.events_filter("remediation", prefix=p),
        subjects.events_filter("mig", prefix=p),
    ),
    "observer": lambda p: (),
}
_CLUSTER_DEAD_LETTERS: dict[str, Callable[[str], tuple[str, ...]]] = {
    "device-plugin-cluster": lambda p: (
        subjects.events_filter("hardware", name="discovered", prefix=p),
        subjects.events_filter("device", name="api-applied", prefix=p),
    ),
    "discovery-cluster": lambda p: tuple(
        subjects.events_filter(domain, name=name, prefix=p)
        for domain, name in (
            ("hardware", "discovered"),
            ("hardware", "heartbeat"),
            ("device", "plugin-config-applied"),
        )
    ),
    "upgrade-orchestrator": lambda p: (
        subjects.events_filter("kube", prefix=p),
        subjects.events_filter("driver", prefix=p),
        subjects.events_filter("device", name="operand-paused", prefix=p),
        subjects.events_filter("device", name="operand-resumed", prefix=p),
        subjects.events_filter("hardware", name="discovered", prefix=p),
        subjects.events_filter("saga", name="deadline-expired", prefix=p),
        subjects.events_filter("upgrade", name="admitted", prefix=p),
        # the remediation saga's (`gpuop.saga.remediation.folding.is_inbound`)
        subjects.events_filter("device", name="health-changed", prefix=p),
        subjects.events_filter("device", name="gpu-holders-listed", prefix=p),
        subjects.events_filter("device", name="gpu-holders-unknown", prefix=p),
        subjects.events_filter("upgrade", name="uncordon-required", prefix=p),
        subjects.events_filter("upgrade", name="upgrade-done", prefix=p),
        subjects.events_filter("upgrade", name="upgrade-failed", prefix=p),
        # the MIG reconfiguration's (`gpuop.saga.mig.folding.is_inbound`)
        subjects.events_filter("device", name="mig-config-requested", prefix=p),
    ),
}
"""Subjects a cluster role's consumers take (and so may dead-letter)."""


def _kv(identity: Identity, prefix: str) -> tuple[str, ...]:
    """KV subjects: writes (`$KV.<bucket>.<key>`) and key-scoped direct gets."""

    def bucket(name: Buckets) -> str:
        return streams.bucket_name(prefix, name)

    def key(name: Buckets, key: str) -> tuple[str, ...]:
        b = bucket(name)
        return (f"$KV.{b}.{key}", f"{JS_API}.DIRECT.GET.KV_{b}.$KV.{b}.{key}")

    def reading(name: Buckets, key: str = ">") -> tuple[str, ...]:
        b = bucket(name)
        return (f"{JS_API}.DIRECT.GET.KV_{b}.$KV.{b}.{key}",)

    def watching(name: Buckets, *keys: str) -> tuple[str, ...]:
        # a watch (or key listing) is an ordered consumer of a fresh name, created with its
        # filter in the subject (gpuop.bus.watching), so only over `keys`; it answers the
        # server's flow control and never asks a consumer's info (a grant for its random
        # name would show every other watch's filter)
        b = bucket(name)
        return (
            *(f"{JS_API}.CONSUMER.CREATE.KV_{b}.*.$KV.{b}.{key}" for key in keys),
            f"$JS.FC.KV_{b}.>",
        )

    role = identity.role
    if role == "discovery":
        return key(Buckets.NODES, identity.node_token)
    if role == "network-manager":
        ipam = bucket(Buckets.IPAM)
        return (
            *key(Buckets.IPAM, f"node.{identity.node_token}.*"),
            # its own address claims only (`claim.<node>.<subnet>.<address>`): of the claims
            # of an address the earliest holds it, so a node may claim a free address but
            # never write, delete or outrank another node's claim. Exactly the keys' shapes
            # (an IPv6 subnet and address are a token each, an IPv4 one four), so no key of
            # any other shape can be made up under the node's name
            *(f"$KV.{ipam}.claim.{identity.node_token}.{shape}" for shape in CLAIM_SHAPES),
            # every node's claims are watched, one address or one pool at a time; the claims
            # made before the node was in the key (`addr.<subnet>.<address>`) read, never
            # written; a pool's per-node blocks (`block.<subnet>.*`, the cluster role's)
            # watched, never written
            *reading(Buckets.IPAM, "addr.>"),
            *watching(
                Buckets.IPAM, f"node.{identity.node_token}.>", "claim.>", "addr.>", "block.>"
            ),
            f"{JS_API}.STREAM.INFO.KV_{ipam}",
            *reading(Buckets.CONFIG),
            *watching(Buckets.CONFIG, ">"),
        )
    if role == "discovery-cluster":
        return reading(Buckets.NODES)
    if role == "device-plugin-cluster":
        # the inventories at start: their keys listed, each read
        return (*reading(Buckets.NODES), *watching(Buckets.NODES, ">"))
    if role == "network-manager-cluster":
        return (
            *key(Buckets.CONFIG, ">"),
            # the per-node address blocks and each subnet's epoch, its keys alone, listed by
            # a watch (the direct get is nats.py's, when a create finds the key there)
            *key(Buckets.IPAM, "block.>"),
            *watching(Buckets.IPAM, "block.>"),
        )
    if role == "upgrade-orchestrator":
        return (
            f"$KV.{bucket(Buckets.SAGAS)}.>",
            # read from the leader, not by direct get (compare-and-set on what was read)
            f"{JS_API}.STREAM.MSG.GET.KV_{bucket(Buckets.SAGAS)}",
            *watching(Buckets.SAGAS, ">"),
            *reading(Buckets.NODES),
            # the inventories' keys are listed, never watched
            f"{JS_API}.CONSUMER.CREATE.KV_{bucket(Buckets.NODES)}.*.$KV.{bucket(Buckets.NODES)}.>",
            f"$JS.FC.KV_{bucket(Buckets.NODES)}.>",
        )
    return ()


def _start(prefix: str) -> tuple[str, ...]:
    """What `NatsBus.start()` asks: create the streams and buckets, look at the buckets."""
    created = [layout.name for layout in streams.layouts(prefix)]
    buckets = [f"KV_{streams.bucket_name(prefix, b)}" for b in Buckets]
    return (
        *(f"{JS_API}.STREAM.CREATE.{name}" for name in (*created, *buckets)),
        *(f"{JS_API}.STREAM.INFO.{name}" for name in buckets),
    )


def _consuming(identity: Identity, prefix: str) -> tuple[str, ...]:
    granted: list[str] = []
    for found in consumers(identity, prefix=prefix):
        s, name = found.stream, found.durable
        if identity.node is not None:
            (only,) = found.filters
            granted.append(f"{JS_API}.CONSUMER.CREATE.{s}.{name}.{only}")
        else:
            granted.append(f"{JS_API}.CONSUMER.CREATE.{s}.{name}")
        # bound without asking the consumer's info (`pull_subscribe_bind`)
        granted += [f"{JS_API}.CONSUMER.MSG.NEXT.{s}.{name}", f"$JS.ACK.{s}.{name}.>"]
    for read in reads(identity, prefix=prefix):
        s, name = streams.stream_for(prefix, read).name, read_name(identity, read)
        granted.append(f"{JS_API}.CONSUMER.CREATE.{s}.{name}.{read}")
    return tuple(granted)


def _dead_letters(identity: Identity, prefix: str) -> tuple[str, ...]:
    if identity.node is not None:
        taken = [f for c in consumers(identity, prefix=prefix) for f in c.filters]
    else:
        taken_by = _CLUSTER_DEAD_LETTERS.get(identity.role)
        taken = list(taken_by(prefix)) if taken_by is not None else []
    return tuple(subjects.dead_letter_subject(subject, prefix=prefix) for subject in taken)


def for_identity(identity: Identity, *, prefix: str = subjects.DEFAULT_PREFIX) -> Grants:
    """Everything `identity` needs to publish and subscribe to, and nothing more."""
    subjects.validate_prefix(prefix)
    inbox = inbox_prefix(identity)
    if identity.role == "observer":
        upgrades = subjects.events_filter("upgrade", prefix=prefix)
        return Grants((), (upgrades, f"{inbox}.>"), inbox)
    if identity.node is not None:
        events = _node_events(identity.role, identity.node, prefix)
    else:
        events = _CLUSTER_PUBLISHES[identity.role](prefix)
    publish = [
        *events,
        *_dead_letters(identity, prefix),
        *_kv(identity, prefix),
        *_consuming(identity, prefix),
        *_start(prefix),
    ]
    if identity.role == "upgrade-orchestrator":
        publish += _orchestrator_streams(prefix)
    return Grants(tuple(dict.fromkeys(publish)), (f"{inbox}.>",), inbox)


def _orchestrator_streams(prefix: str) -> list[str]:
    """The orchestrator reconciles the streams' configuration, and a new leader reads the
    last state change of a saga (`Bus.last`): a direct get with the subject in the API
    subject, so of upgrade events only, never a message of the log by sequence."""
    names = [layout.name for layout in streams.layouts(prefix)]
    upgrades = subjects.events_filter("upgrade", prefix=prefix)
    return [
        *(f"{JS_API}.STREAM.INFO.{name}" for name in names),
        *(f"{JS_API}.STREAM.UPDATE.{name}" for name in names),
        f"{JS_API}.DIRECT.GET.{names[0]}.{upgrades}",
    ]


ANY_NODE = "gpuop-any-node"
"""Stands for every node while a per-service user's permissions are rendered."""


def for_service(role: str, *, prefix: str = subjects.DEFAULT_PREFIX) -> Grants:
    """The permissions of a static per-service user (deploy/nats/accounts.conf): for a
    cluster role its identity's, for a node role every node's at once, that is the node
    token and every consumer name wildcarded (`*`) and the filters kept. What the wildcards
    cannot keep apart (one node's agent acting for another, one service's node agent
    re-filtering another's consumer on the same stream) needs per-node identities; the
    cluster roles' consumers, named alike everywhere, are denied to node users outright."""
    if role not in NODE_ROLES:
        return for_identity(Identity(role, None), prefix=prefix)
    exact = for_identity(Identity(role, ANY_NODE), prefix=prefix)

    def widened(subject: str) -> str:
        return ".".join("*" if ANY_NODE in token else token for token in subject.split("."))

    identity = Identity(role, ANY_NODE)
    streams_read = {c.stream for c in consumers(identity, prefix=prefix)} | {
        streams.stream_for(prefix, read).name for read in reads(identity, prefix=prefix)
    }
    denied = [
        f"{subject}.{name}{tail}"
        for name in sorted(n for names in _CLUSTER_DURABLES.values() for n in names)
        for stream in sorted(streams_read & {streams.layouts(prefix)[0].name})
        for subject, tail in (
            (f"{JS_API}.CONSUMER.CREATE.{stream}", ".>"),
            (f"{JS_API}.CONSUMER.MSG.NEXT.{stream}", ""),
            (f"$JS.ACK.{stream}", ".>"),
        )
    ]
    return Grants(
        tuple(dict.fromkeys(widened(subject) for subject in exact.publish)),
        (f"{INBOX}_{role}.>",),
        f"{INBOX}_{role}",
        tuple(denied),
    )
