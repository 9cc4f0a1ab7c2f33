"""The durable sagas: one `NodeSaga` per node in the KV bucket `gpuop_sagas`.

The runner (`gpuop.services.upgrade_orchestrator.running`) reads a node's saga with its
revision, decides, and writes the result with compare-and-set before it acts (outbox), so a
second writer (a replica that briefly believed it led, a restarted process) makes the write
fail with `RevisionConflict` instead of silently overwriting a newer step. The key is the
node name encoded as a subject token (`subjects.encode_node`), reversible for listing.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuop.bus import Buckets, Bus, KeyValue
from gpuop.events import subjects
from gpuop.saga import NodeSaga


@dataclass(frozen=True)
class StoredSaga:
    """A saga as read from KV, with the revision a conditional write must name."""

    saga: NodeSaga
    revision: int


class SagaStore:
    """Reads and compare-and-set writes of the node sagas."""

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv
        # a revision's value never changes, so a saga decoded at the revision KV still holds
        # is reused: admission reads every saga on each pass, and decoding dominated it
        self._decoded: dict[str, StoredSaga] = {}

    @classmethod
    async def open(cls, bus: Bus) -> SagaStore:
        """The store on `bus`'s `gpuop_sagas` bucket."""
        return cls(await bus.kv(Buckets.SAGAS))

    async def get(self, node: str) -> StoredSaga | None:
        """The node's saga, or None when it has none."""
        entry = await self._kv.get(subjects.encode_node(node))
        if entry is None:
            self._decoded.pop(node, None)
            return None
        known = self._decoded.get(node)
        if known is not None and known.revision == entry.revision:
            return known
        return self._remember(StoredSaga(NodeSaga.from_json(entry.value), entry.revision))

    async def all(self) -> list[StoredSaga]:
        """Every saga, by node name."""
        found = []
        for key in await self._kv.keys():
            stored = await self.get(subjects.decode_node(key))
            if stored is not None:
                found.append(stored)
        return found

    async def create(self, saga: NodeSaga) -> StoredSaga:
        """Store the node's first saga; raises `KeyExists` when it has one."""
        revision = await self._kv.create(subjects.encode_node(saga.node), saga.to_json())
        return self._remember(StoredSaga(saga, revision))

    async def replace(self, saga: NodeSaga, revision: int) -> StoredSaga:
        """Store `saga` over the one read at `revision` (a new rollout's saga, or the next
        step of the same); raises `RevisionConflict` when someone wrote since."""
        new = await self._kv.update(subjects.encode_node(saga.node), saga.to_json(), revision)
        return self._remember(StoredSaga(saga, new))

    def _remember(self, stored: StoredSaga) -> StoredSaga:
        self._decoded[stored.saga.node] = stored
        return stored
