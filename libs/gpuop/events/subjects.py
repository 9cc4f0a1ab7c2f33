"""Subject names on the bus, and the reversible node-name encoding they need.

Every event, command and dead letter travels on a subject built here; the bus, the CLI and
external tools parse subjects with the same functions, so nobody splits strings by hand.

    <prefix>.evt.<domain>.<node>.<name>     an event (a fact, past tense)
    <prefix>.cmd.<service>.<node>.<verb>    a command to one node agent
    <prefix>.dlq.<original subject>         a dead letter

Kubernetes node names may contain dots, which NATS treats as token separators, and never
contain `_`; so `.` is written as `_` in the node token, and that is reversible. Events that
belong to no node use the node token `_cluster`.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from enum import StrEnum

DEFAULT_PREFIX = "gpuop"
CLUSTER = "_cluster"
"""Node token of cluster-wide events and commands."""

_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_TOKEN = re.compile(r"^[a-z0-9]([-a-z0-9_]*[a-z0-9])?$")
_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


class InvalidSubject(ValueError):
    """A subject, node name or token that the naming rules above do not allow."""


class Kind(StrEnum):
    """The three families of subjects."""

    EVENT = "evt"
    COMMAND = "cmd"
    DEAD_LETTER = "dlq"


@functools.lru_cache(maxsize=16384)
def validate_node_name(node: str) -> str:
    """Return `node` if it is a valid Kubernetes node name (RFC 1123 subdomain)."""
    if len(node) > 253 or not _NODE_NAME.match(node):
        raise InvalidSubject(f"invalid node name {node!r}: expected an RFC 1123 subdomain")
    return node


def validate_prefix(prefix: str) -> str:
    """Return `prefix` if it is one NATS token of letters, digits, `-` and `_`."""
    if not _PREFIX.match(prefix):
        raise InvalidSubject(f"invalid subject prefix {prefix!r}: expected one token")
    return prefix


@functools.lru_cache(maxsize=16384)
def encode_node(node: str) -> str:
    """Node name -> subject token: `gpu-1.example.com` -> `gpu-1_example_com`."""
    if node == CLUSTER:
        return CLUSTER
    return validate_node_name(node).replace(".", "_")


def decode_node(token: str) -> str:
    """Subject token -> node name; the inverse of `encode_node`."""
    if token == CLUSTER:
        return CLUSTER
    return validate_node_name(token.replace("_", "."))


def _check_token(what: str, token: str) -> str:
    if not _TOKEN.match(token):
        raise InvalidSubject(f"invalid {what} {token!r}: expected lowercase letters, digits, -")
    return token


def event_subject(domain: str, node: str, name: str, *, prefix: str = DEFAULT_PREFIX) -> str:
    """Subject of event `name` in `domain` about `node` (or `CLUSTER`)."""
    return _subject(prefix, Kind.EVENT, ("domain", domain), node, ("event name", name))


def command_subject(service: str, node: str, verb: str, *, prefix: str = DEFAULT_PREFIX) -> str:
    """Subject of command `verb` for `service` on `node`."""
    return _subject(prefix, Kind.COMMAND, ("service", service), node, ("verb", verb))


def _subject(
    prefix: str, kind: Kind, group: tuple[str, str], node: str, last: tuple[str, str]
) -> str:
    """`prefix.kind.group.node.last`, each token checked; `group` and `last` are (what, token)."""
    return ".".join((prefix, kind, _check_token(*group), encode_node(node), _check_token(*last)))


def dead_letter_subject(original: str, *, prefix: str = DEFAULT_PREFIX) -> str:
    """Subject under which a message that arrived on `original` is dead-lettered."""
    return f"{prefix}.{Kind.DEAD_LETTER}.{original}"


def stream_filter(kind: Kind, *, prefix: str = DEFAULT_PREFIX) -> str:
    """Wildcard that captures every subject of one kind: `gpuop.evt.>`."""
    return f"{prefix}.{kind}.>"


def events_filter(
    domain: str = "*", node: str | None = None, name: str = "*", *, prefix: str = DEFAULT_PREFIX
) -> str:
    """Wildcard for events: `events_filter("upgrade")` is `gpuop.evt.upgrade.*.*`."""
    node_token = "*" if node is None else encode_node(node)
    return f"{prefix}.{Kind.EVENT}.{domain}.{node_token}.{name}"


def commands_filter(
    service: str = "*", node: str | None = None, verb: str = "*", *, prefix: str = DEFAULT_PREFIX
) -> str:
    """Wildcard for commands to one service, optionally on one node."""
    node_token = "*" if node is None else encode_node(node)
    return f"{prefix}.{Kind.COMMAND}.{service}.{node_token}.{verb}"


@dataclass(frozen=True, slots=True)
class Subject:
    """A parsed event or command subject."""

    prefix: str
    kind: Kind
    group: str
    """The event's domain, or the command's service."""
    node: str
    """Decoded node name, or `CLUSTER`."""
    name: str
    """The event's name, or the command's verb."""

    def __str__(self) -> str:
        if self.kind is Kind.EVENT:
            return event_subject(self.group, self.node, self.name, prefix=self.prefix)
        return command_subject(self.group, self.node, self.name, prefix=self.prefix)


def parse_subject(subject: str) -> Subject:
    """Parse an event or command subject; raises `InvalidSubject` for anything else."""
    parts = subject.split(".")
    if len(parts) != 5:
        raise InvalidSubject(f"invalid subject {subject!r}: expected 5 tokens, got {len(parts)}")
    prefix, kind, group, node_token, name = parts
    validate_prefix(prefix)
    try:
        parsed_kind = Kind(kind)
    except ValueError:
        raise InvalidSubject(f"invalid subject {subject!r}: unknown kind {kind!r}") from None
    if parsed_kind is Kind.DEAD_LETTER:
        raise InvalidSubject(f"invalid subject {subject!r}: dead letters wrap another subject")
    _check_token("subject token", group)
    _check_token("subject token", name)
    return Subject(prefix, parsed_kind, group, decode_node(node_token), name)


def node_key(subject: str) -> str:
    """The ordering key of a subject: its node token, or the whole subject if it has none.

    Consumers run one node's messages in order; this is the cheap, never-failing way to find
    which node a (possibly malformed) message belongs to.
    """
    parts = subject.split(".")
    if len(parts) == 5 and parts[1] in (Kind.EVENT, Kind.COMMAND):
        return parts[3]
    return subject
