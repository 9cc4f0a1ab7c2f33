"""Saga kinds other than the driver upgrade, as the runtime runs them: one `KindRunner` each.

The driver upgrade keeps its own store, index and admission (`store`, `indexing`,
`running.Runner.admit`): they were built for it and are measured at scale. Every other kind
(GPU remediation, MIG reconfiguration) runs through what this module describes, on the same
runner, outbox, deadlines and intake:

    SagaKind    what the runtime needs of a kind: how its record is stored (a key prefix of
                its own in `gpuop_sagas`: `<prefix>.<node token>`, a key `store.is_saga_key`
                leaves to it), which events of the log it decides (`inbound`, and the
                subjects the intake adds for them), its one fold step (the one replay
                takes too), what a decision publishes with its ids (`outputs`), what a
                stored saga issues again after a crash (`pending`), and whether a saga
                holds its node (`holds`: unavailable to every other kind, one
                `maxUnavailable` budget) or waits for an admission (`waiting`)
    KindStore   compare-and-set reads and writes of one kind's records, with an index of
                every record (a kind has at most one saga per node)
    KindRunner  a kind with its store and, optionally, the hook that starts a saga from an
                event (a remediation from a GPU's health): called by the runner before it
                decides the event, under the node's lock

How a kind is added (the MIG reconfiguration, for one): write the pure kind under
`gpuop.saga.<kind>/` (states, table, one phase module per state, record, its fold) and its
`SagaKind` in a module of this service (the remediation's `remediations.REMEDIATION`, with
its starting hook `remediations.Starter`, is the model); add its `KindRunner` where the
controller builds them (`Controller.kind_runners`); its public events go into `gpuop.events`
like any; `gpuop replay` folds it beside the upgrade (`gpuop.saga.replaying`). Nothing of the
upgrade's is touched.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from gpuop.bus import Buckets, Bus, KeyExists, KeyValue, RevisionConflict
from gpuop.events import Event, subjects
from gpuop.saga.kinds import SagaKind
from gpuop.saga.machine import SagaRecord

log = logging.getLogger(__name__)

R = TypeVar("R", bound=SagaRecord[Any])


@dataclass(frozen=True)
class StoredRecord(Generic[R]):
    """A record as read from KV, with the revision a conditional write must name."""

    saga: R
    revision: int


class KindStore(Generic[R]):
    """One kind's records in `gpuop_sagas`, with an index of every one (read cache)."""

    def __init__(self, kv: KeyValue, kind: SagaKind[R]) -> None:
        self._kv = kv
        self.kind = kind
        self._index: dict[str, StoredRecord[R]] = {}

    @classmethod
    async def open(cls, bus: Bus, kind: SagaKind[R]) -> KindStore[R]:
        return cls(await bus.kv(Buckets.SAGAS), kind)

    def key(self, node: str) -> str:
        return f"{self.kind.key_prefix}.{subjects.encode_node(node)}"

    def owns(self, key: str) -> bool:
        """Whether `key` is one of this kind's records."""
        return key.startswith(f"{self.kind.key_prefix}.")

    async def get(self, node: str) -> StoredRecord[R] | None:
        """The node's record as KV holds it now."""
        entry = await self._kv.get(self.key(node))
        if entry is None:
            self._index.pop(node, None)
            return None
        known = self._index.get(node)
        if known is not None and known.revision == entry.revision:
            return known
        stored = StoredRecord(self.kind.decode(entry.value), entry.revision)
        self._index[node] = stored
        return stored

    async def create(self, saga: R, node: str) -> StoredRecord[R]:
        """Store the node's first record; `KeyExists` when it has one."""
        encoded = _encoded(saga)
        try:
            revision = await self._kv.create(self.key(node), encoded)
        except KeyExists:
            await self.get(node)
            raise
        stored = StoredRecord(saga, revision)
        self._index[node] = stored
        return stored

    async def replace(self, saga: R, node: str, revision: int) -> StoredRecord[R]:
        """Store `saga` over the record read at `revision`; `RevisionConflict` if it moved."""
        try:
            new = await self._kv.update(self.key(node), _encoded(saga), revision)
        except RevisionConflict:
            await self.get(node)
            raise
        stored = StoredRecord(saga, new)
        self._index[node] = stored
        return stored

    async def load(self) -> int:
        """Rebuild the index from KV (a leader that starts); returns the records found."""
        self._index.clear()
        for key in await self._kv.keys():
            if not self.owns(key):
                continue
            node = subjects.decode_node(key[len(self.kind.key_prefix) + 1 :])
            try:
                await self.get(node)
            except ValueError as error:
                log.warning("ignoring the %s record of %s: %s", self.kind.name, node, error)
        return len(self._index)

    def cached(self, node: str) -> StoredRecord[R] | None:
        """The node's record as last known here: no read of KV."""
        return self._index.get(node)

    def records(self) -> list[StoredRecord[R]]:
        """Every record known here, by node name."""
        return [self._index[node] for node in sorted(self._index)]


def is_a_node(node: str) -> bool:
    """Whether an event's node names a node at all (not `_cluster`, the subject of events
    about none): what a kind's starter knows of a node before the node watch has listed
    the GPU nodes."""
    return node != subjects.CLUSTER


def _encoded(saga: Any) -> bytes:
    encoded: str = saga.model_dump_json()
    return encoded.encode()


Starter = Callable[[str, Event, datetime, str | None], Awaitable[None]]
"""Starts a saga of the kind on a node from an event, if the event calls for one: (node,
event, the event's time, the event's envelope id)."""


@dataclass
class KindRunner(Generic[R]):
    """A kind the runner runs: its description, its store, what starts its sagas, and
    what makes sure the log records a stored saga's start (called by `resume` first: a
    leader that stored a saga may have died before it published its start)."""

    kind: SagaKind[R]
    store: KindStore[R]
    starter: Starter | None = None
    recorded: Callable[[R], Awaitable[None]] | None = None
    after: Starter | None = None
    """Called once the runner decided an event for every kind, under the node's lock: a
    kind may start what the decision made due (a request queued behind a saga that ended)."""
