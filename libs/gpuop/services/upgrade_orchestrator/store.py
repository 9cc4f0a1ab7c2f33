"""The durable sagas: one `NodeSaga` per node in the KV bucket `gpuop_sagas`.

The runner (`gpuop.services.upgrade_orchestrator.running`) reads a node's saga with its
revision, decides, and writes the result with compare-and-set before it acts (outbox), so a
second writer (a replica that briefly believed it led, a restarted process) makes the write
fail with `RevisionConflict` instead of silently overwriting a newer step. The key is the
node name encoded as a subject token (`subjects.encode_node`), reversible for listing.

Next to KV the store keeps the in-memory index (`indexing.SagaIndex`) that admission and the
controller read instead of listing the bucket: `load` fills it when a leader starts,
`follow` keeps it in step with the bucket's watch until cancelled, and every read and write
here records what it learnt. A write that conflicts reads the node again, so a stale index
is corrected before the next pass retries.

Keys that begin with `_` are not sagas (node tokens never do): the leader's presence
(`presence.PRESENCE_KEY`) lives in the same bucket, and the store skips them. Nor are keys
with a dot, which no node token has: the records of the other saga kinds, one prefix each
(`<prefix>.<node token>`, `kinds.KindStore`).
"""

from __future__ import annotations

import logging

from gpuop.bus import Buckets, Bus, KeyExists, KeyValue, KvEntry, RevisionConflict
from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.events import subjects
from gpuop.saga import NodeSaga
from gpuop.services.upgrade_orchestrator.indexing import SagaIndex, StoredSaga

log = logging.getLogger(__name__)

__all__ = ["SagaStore", "StoredSaga"]

WATCH_RETRY_SECONDS = 1.0
"""How long `follow` waits after its watch broke before it watches (and rebuilds) again."""


def is_saga_key(key: str) -> bool:
    """Whether a key of `gpuop_sagas` holds a node's upgrade saga (and not, say, the
    presence, or another kind's record)."""
    return not key.startswith("_") and "." not in key


class SagaStore:
    """Reads and compare-and-set writes of the node sagas, and their index."""

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv
        self.index = SagaIndex()
        """Every saga as last known; a read cache, KV decides every write."""

    @classmethod
    async def open(cls, bus: Bus) -> SagaStore:
        """The store on `bus`'s `gpuop_sagas` bucket."""
        return cls(await bus.kv(Buckets.SAGAS))

    async def get(self, node: str) -> StoredSaga | None:
        """The node's saga as KV holds it now, or None when it has none."""
        entry = await self._kv.get(subjects.encode_node(node))
        if entry is None:
            known = self.index.get(node)
            if known is not None:
                self.index.forget(node, known.revision)
            return None
        return self._decoded(node, entry)

    async def all(self) -> list[StoredSaga]:
        """Every saga, by node name, read from KV (the restart path: see `sagas` for the
        index)."""
        found = []
        for key in await self._kv.keys():
            if not is_saga_key(key):
                continue
            stored = await self.get(subjects.decode_node(key))
            if stored is not None:
                found.append(stored)
        return found

    def sagas(self) -> list[StoredSaga]:
        """Every saga in the index, by node name: no read of KV."""
        return self.index.all()

    def cached(self, node: str) -> StoredSaga | None:
        """The node's saga in the index: no read of KV, so possibly stale; a write based on
        it conflicts if so."""
        return self.index.get(node)

    async def create(self, saga: NodeSaga) -> StoredSaga:
        """Store the node's first saga; raises `KeyExists` when it has one."""
        try:
            revision = await self._kv.create(subjects.encode_node(saga.node), saga.to_json())
        except KeyExists:
            await self.get(saga.node)  # the index missed it: learn it for the next pass
            raise
        return self._recorded(StoredSaga(saga, revision))

    async def replace(self, saga: NodeSaga, revision: int) -> StoredSaga:
        """Store `saga` over the one read at `revision` (a new rollout's saga, or the next
        step of the same); raises `RevisionConflict` when someone wrote since."""
        key = subjects.encode_node(saga.node)
        try:
            new = await self._kv.update(key, saga.to_json(), revision)
        except RevisionConflict:
            await self.get(saga.node)  # a stale read: learn the newer saga
            raise
        return self._recorded(StoredSaga(saga, new))

    async def load(self) -> int:
        """Rebuild the index from KV (a leader that starts); returns the sagas found."""
        self.index.reset(await self.all())
        return len(self.index)

    async def follow(self, *, clock: Clock = SYSTEM_CLOCK) -> None:
        """Keep the index in step with the bucket until cancelled. Each watch begins with
        the bucket's current entries, from which the index is rebuilt, so whatever a broken
        watch missed is made good when it starts again."""
        while True:
            try:
                await self._watch()
                log.warning("the saga watch ended; watching again")
            except Exception as error:  # any break is mended the same way: a rebuild
                log.warning(
                    "the saga watch broke (%s); watching again in %.0f s",
                    error,
                    WATCH_RETRY_SECONDS,
                )
            await clock.sleep(WATCH_RETRY_SECONDS)

    async def _watch(self) -> None:
        found: list[StoredSaga] = []
        deleted: list[tuple[str, int]] = []
        caught_up = False
        watch = self._kv.watch()
        try:
            async for entry in watch:
                if entry is None:
                    if not caught_up:
                        self.index.reset(found, deleted)
                        caught_up = True
                        found, deleted = [], []
                    continue
                if not is_saga_key(entry.key):
                    continue
                node = subjects.decode_node(entry.key)
                if not caught_up:
                    if entry.deleted:
                        deleted.append((node, entry.revision))
                    else:
                        stored = self._watched(node, entry)
                        if stored is not None:
                            found.append(stored)
                elif entry.deleted:
                    self.index.forget(node, entry.revision)
                elif not self.index.known(node, entry.revision):
                    stored = self._watched(node, entry)
                    if stored is not None:
                        self.index.record(stored)
        finally:
            # the buckets' watches are async generators: closing one stops its watcher
            close = getattr(watch, "aclose", None)
            if close is not None:
                await close()

    def _watched(self, node: str, entry: KvEntry) -> StoredSaga | None:
        """The entry's saga, reusing the index's when it holds that revision (the store's
        own writes come back through the watch); None when it does not decode."""
        known = self.index.get(node)
        if known is not None and known.revision == entry.revision:
            return known
        try:
            return StoredSaga(NodeSaga.from_json(entry.value), entry.revision)
        except ValueError as error:
            # leaving it out of the index leaves it to the runner, which reads KV itself
            log.warning("ignoring the saga of node %s that does not decode: %s", node, error)
            return None

    def _decoded(self, node: str, entry: KvEntry) -> StoredSaga:
        """The entry's saga; a revision's value never changes, so the index's copy at the
        same revision is reused (decoding dominated the full reads)."""
        known = self.index.get(node)
        if known is not None and known.revision == entry.revision:
            return known
        return self._recorded(StoredSaga(NodeSaga.from_json(entry.value), entry.revision))

    def _recorded(self, stored: StoredSaga) -> StoredSaga:
        self.index.record(stored)
        return stored
