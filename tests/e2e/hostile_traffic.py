"""What the rollout under hostile input publishes (tests/e2e/test_hostile_input_e2e.py):
hypothesis strategies over every subject the stack's services consume, for the stack's
nodes, for nodes that do not exist, and for names no node can have.

Each message belongs to one category:

    garbage          not an envelope: binary, any JSON value, nesting too deep to parse
    mutated          an envelope with fields removed or of the wrong type (may stay valid)
    huge             an envelope with a 512 KiB string in one field
    near-limit       the same, as large as the NATS payload limit lets the server store it
    over-limit       the same, just over the limit: the publisher refuses it
    long-subject     anything on a subject nearly as long as a NATS protocol line may be
    newer            a later version of a known type (`...v7`) with any data
    mismatch         a valid envelope about one node on another node's subject
    invalid-node     a valid-looking envelope about a name no Kubernetes node can have
    ghost            a valid message about a node that does not exist (commands too)
    ghost-inventory  the same, an inventory (the labeler waits for the Node to register)
    stale            a valid message about an existing node that answers nothing pending:
                     a result of a command never issued, a deadline or admission of no
                     saga, a reboot decided in a boot that is not the current one, a rescan
    old-command      a driver command the orchestrator issued earlier, published again

Messages about existing nodes have `HARMLESS` types and fresh ids: a valid cordon, drain or
inventory about a real node is a fact the system must believe, not hostile input (only the
orchestrator and discovery may publish those: deploy/nats).
"""

from __future__ import annotations

import functools
import itertools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from gpuop.bus import streams
from gpuop.events import Command, Event, Payload, deadlines, device, kube, subjects, upgrade
from gpuop.events import driver as dm
from gpuop.events import hardware as hw
from tests import hostile
from tests.support.event_samples import SAMPLES

PREFIX = subjects.DEFAULT_PREFIX
GHOSTS = ("ghost-1", "ghost-2", "gpu-404.example.com", subjects.CLUSTER)
"""Valid names of nodes the cluster does not have (`_cluster`: events about no node)."""
INVALID = ("Node-A", "-lead", "trail-", "a..b", "x" * 254, "under_score")
"""Names no Kubernetes node can have; `a..b` travels as `a__b`."""
HARMLESS: tuple[type[Payload], ...] = (
    dm.DriverResult,
    dm.RebootStarted,
    dm.RebootNode,
    kube.PodsDeleted,
    kube.PodDeletionFailed,
    kube.DrainFailed,
    device.OperandPaused,
    deadlines.DeadlineExpired,
    upgrade.NodeAdmitted,
    hw.HardwareHeartbeat,
    hw.RescanHardware,
)
"""Types a message about an existing node may have: with fresh ids they answer nothing."""
FRESH_IDS = ("command_id", "action_id", "saga_id", "rollout_id")
QUOTAS = {
    "garbage": 8,
    "mutated": 10,
    "newer": 5,
    "mismatch": 5,
    "invalid-node": 5,
    "ghost": 7,
    "stale": 7,
    "old-command": 2,
}
"""Messages of each category in every batch, and one `RARE` more."""
RARE = ("garbage",) * 6 + (
    "huge", "huge", "ghost-inventory", "near-limit", "over-limit", "long-subject",
)  # fmt: skip
"""One of these ends every batch, in turn: the costly categories, in about every other batch."""
RARE_KINDS = tuple(dict.fromkeys(RARE))
"""The rare categories, each once, in a fixed order."""
BATCH = sum(QUOTAS.values()) + 1
LONG_SUBJECT = 3950
"""Characters in a `long-subject` subject: it and a reply inbox fit in nats-server's 4 KiB
protocol line, the subject of its dead letter (10 characters longer, with its own inbox)
would not."""


@dataclass(frozen=True)
class Hostile:
    """One message to publish; an `old-command` gets its subject and bytes when it is
    published (`pick` chooses among the commands issued by then)."""

    category: str
    subject: str
    data: bytes
    pick: int = 0


def subject_for(payload: Payload, token: str) -> str:
    """The subject `payload` travels on for node token `token` (valid or not)."""
    if isinstance(payload, Command):
        return f"{PREFIX}.{subjects.Kind.COMMAND}.{payload.SERVICE}.{token}.{payload.VERB}"
    assert isinstance(payload, Event)
    return f"{PREFIX}.{subjects.Kind.EVENT}.{payload.DOMAIN}.{token}.{payload.subject_token()}"


def token_of(node: str) -> str:
    return node.replace(".", "_")


def consumed(filters: Sequence[str], nodes: Sequence[str]) -> list[Payload]:
    """The sample payloads whose subject some consumer reads for some existing node."""
    return [
        sample
        for sample in SAMPLES
        if any(
            streams.subject_matches(pattern, subject_for(sample, token_of(node)))
            for pattern in filters
            for node in nodes
        )
    ]


_picks = st.integers(min_value=0, max_value=1 << 16)
_ids = st.uuids()


class Traffic:
    """Strategies for one running stack: its nodes, and the payloads its consumers read."""

    def __init__(self, nodes: Sequence[str], filters: Sequence[str], max_payload: int) -> None:
        self.nodes = list(nodes)
        # hypothesis favours the first of a list: let that be a cheap type (the orchestrator
        # alone reads it), not an inventory (the labeler writes Nodes for those)
        self.families = sorted(consumed(filters, nodes), key=_cost)
        self.harmless = [p for p in self.families if isinstance(p, HARMLESS)]
        self.ghostly = [p for p in self.families if not isinstance(p, hw.HardwareDiscovered)]
        """What a ghost is sent: its inventories (which the labeler retries until its
        `max_deliver` is spent) come only as `ghost-inventory`, a few."""
        self.max_payload = max_payload
        self.inventory = next(p for p in SAMPLES if isinstance(p, hw.HardwareDiscovered))
        self._rare = itertools.cycle(RARE)
        """The rare category of each batch, in turn: which one hypothesis would draw depends
        on its version (it favours some values), and each must come up."""
        if not self.families or not self.harmless:
            raise AssertionError(f"no consumed payload types among the samples ({filters})")
        self._valid_nodes = [*self.nodes, *GHOSTS]
        self._all_nodes = [*self.nodes, *GHOSTS, *INVALID]

    def batch(self) -> st.SearchStrategy[list[Hostile]]:
        """`BATCH` messages: `QUOTAS` of each category, and one of the `RARE` ones."""

        @st.composite
        def one(draw: st.DrawFn) -> list[Hostile]:
            out = [self._message(draw, c) for c, n in QUOTAS.items() for _ in range(n)]
            # Every rare category is drawn and the turn's one kept: what hypothesis draws
            # must not depend on state outside the draw (the turn), or an example whose first
            # choices repeat an earlier one's draws differently and hypothesis stops the run
            # as flaky (FlakyStrategyDefinition).
            rare = {c: self._message(draw, c) for c in RARE_KINDS}
            out.append(rare[next(self._rare)])
            return out

        return one()

    def _message(self, draw: st.DrawFn, category: str) -> Hostile:
        if category == "old-command":
            return Hostile(category, "", b"", pick=draw(_picks))
        subject, data = getattr(self, "_" + category.replace("-", "_"))(draw)
        return Hostile(category, subject, data)

    def _valid(self, draw: st.DrawFn, node: str) -> tuple[str, dict[str, Any]]:
        """A valid envelope about `node` of a type it may be sent, with fresh ids."""
        choices = self.harmless if node in self.nodes else self.ghostly
        base = draw(_ids)
        payload = fresh(base, _pick(draw, choices))
        envelope = hostile.envelope_of(payload, node, base.hex)
        return subject_for(payload, token_of(node)), hostile.document_of(envelope)

    def _garbage(self, draw: st.DrawFn) -> tuple[str, bytes]:
        payload = _pick(draw, self.families)
        subject = subject_for(payload, token_of(_pick(draw, self._all_nodes)))
        return subject, draw(hostile.garbage)

    def _mutated(self, draw: st.DrawFn) -> tuple[str, bytes]:
        subject, document = self._valid(draw, _pick(draw, self._valid_nodes))
        return subject, hostile.mutate(draw, document)

    def _huge(self, draw: st.DrawFn, size: int = hostile.HUGE) -> tuple[str, bytes]:
        subject, document = self._valid(draw, _pick(draw, self._valid_nodes))
        return subject, hostile.enlarge(draw, document, size)

    def _near_limit(self, draw: st.DrawFn) -> tuple[str, bytes]:
        """As large as the server stores: the consumers' dead letters of it must fit too."""
        subject, document = self._valid(draw, _pick(draw, self._valid_nodes))
        room = self.max_payload - len(hostile.encoded(document)) - 64
        return subject, hostile.enlarge(draw, document, room)

    def _over_limit(self, draw: st.DrawFn) -> tuple[str, bytes]:
        return self._huge(draw, self.max_payload + 1)

    def _long_subject(self, draw: st.DrawFn) -> tuple[str, bytes]:
        subject, data = self._garbage(draw) if draw(st.booleans()) else self._mismatch(draw)
        prefix, kind, group, _, name = subject.split(".")
        token = "x" * (LONG_SUBJECT - len(f"{prefix}.{kind}.{group}..{name}"))
        return f"{prefix}.{kind}.{group}.{token}.{name}", data

    def _newer(self, draw: st.DrawFn) -> tuple[str, bytes]:
        node, payload = _pick(draw, self._valid_nodes), _pick(draw, self.families)
        envelope = hostile.envelope_of(payload, node, draw(_ids).hex)
        subject = subject_for(payload, token_of(node))
        return subject, hostile.newer(draw, hostile.document_of(envelope))

    def _mismatch(self, draw: st.DrawFn) -> tuple[str, bytes]:
        about = _pick(draw, self._valid_nodes)
        on = _pick(draw, [n for n in self._valid_nodes if n != about])
        base = draw(_ids)
        payload = fresh(base, _pick(draw, self.families))
        envelope = hostile.envelope_of(payload, about, base.hex)
        return subject_for(payload, token_of(on)), envelope.to_bytes()

    def _invalid_node(self, draw: st.DrawFn) -> tuple[str, bytes]:
        name = _pick(draw, INVALID)
        base = draw(_ids)
        payload = fresh(base, _pick(draw, self.families))
        envelope = hostile.envelope_of(payload, "placeholder", base.hex)
        document = {**hostile.document_of(envelope), "subject": name}
        return subject_for(payload, token_of(name)), hostile.encoded(document)

    def _ghost(self, draw: st.DrawFn) -> tuple[str, bytes]:
        subject, document = self._valid(draw, _pick(draw, GHOSTS))
        return subject, hostile.encoded(document)

    def _ghost_inventory(self, draw: st.DrawFn) -> tuple[str, bytes]:
        node = _pick(draw, GHOSTS[:-1])
        envelope = hostile.envelope_of(self.inventory, node, draw(_ids).hex)
        return subject_for(self.inventory, token_of(node)), envelope.to_bytes()

    def _stale(self, draw: st.DrawFn) -> tuple[str, bytes]:
        subject, document = self._valid(draw, _pick(draw, self.nodes))
        return subject, hostile.encoded(document)


def _cost(payload: Payload) -> int:
    """0: the orchestrator alone reads it; 1: a driver result, which discovery may rescan
    after; 2: a command, or what the labeler reads."""
    if isinstance(payload, Command | hw.HardwareDiscovered | hw.HardwareHeartbeat):
        return 2
    return 1 if isinstance(payload, dm.DriverResult | dm.RebootStarted) else 0


def fresh(base: uuid.UUID, payload: Payload) -> Payload:
    """`payload` with ids that name nothing the system issued (derived from `base`), and a
    boot that is not any node's current one."""
    fields = type(payload).model_fields
    update: dict[str, Any] = {
        name: f"{base.hex}-{i}" for i, name in enumerate(FRESH_IDS) if name in fields
    }
    if "boot_id" in fields:
        update["boot_id"] = str(base)
    if "inventory_hash" in fields and not isinstance(payload, hw.HardwareDiscovered):
        update["inventory_hash"] = base.hex * 2
    return payload.model_copy(update=update)


def _pick(draw: st.DrawFn, items: Sequence[Any]) -> Any:
    """One of `items`, drawn as `sampled_from` would (a strategy per length, built once)."""
    return items[draw(_indexes(len(items)))]


@functools.cache
def _indexes(count: int) -> st.SearchStrategy[int]:
    return st.integers(min_value=0, max_value=count - 1)
