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

One store class serves every kind (`SagaStore[R]`, one instance per kind of the registry
`gpuop.saga.registry.KINDS`): a kind's records are the keys its `SagaKind` owns, under its
key prefix (`<prefix>.<node token>`; the upgrade's keys are the bare node tokens, as they
were before there were other kinds). Keys that begin with `_` are no kind's: the leader's
presence (`presence.PRESENCE_KEY`) lives in the same bucket.
"""

from __future__ import annotations

import logging
from typing import Any, Generic

from gpuop.bus import Buckets, Bus, KeyExists, KeyValue, KvEntry, RevisionConflict
from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.saga.kinds import SagaKind
from gpuop.saga.upgrade import folding
from gpuop.services.upgrade_orchestrator.indexing import R, SagaIndex, StoredSaga

log = logging.getLogger(__name__)

__all__ = ["SagaStore", "StoredSaga"]

WATCH_RETRY_SECONDS = 1.0
"""How long `follow` waits after its watch broke before it watches (and rebuilds) again."""


def is_saga_key(key: str) -> bool:
    """Whether a key of `gpuop_sagas` holds a node's upgrade saga (and not, say, the
    presence, or another kind's record)."""
    return folding.KIND.owns(key)


class SagaStore(Generic[R]):
    """Reads and compare-and-set writes of one kind's sagas (the upgrade's where none is
    named), and their index."""

    def __init__(self, kv: KeyValue, kind: SagaKind[R] = folding.KIND) -> None:  # type: ignore[assignment]
        self._kv = kv
        self.kind = kind
        self.index: SagaIndex[R] = SagaIndex(kind.settles)
        """Every saga as last known; a read cache, KV decides every write."""

    @classmethod
    async def open(cls, bus: Bus, kind: SagaKind[R] = folding.KIND) -> SagaStore[R]:  # type: ignore[assignment]
        """The store of `kind` on `bus`'s `gpuop_sagas` bucket."""
        return cls(await bus.kv(Buckets.SAGAS), kind)

    async def get(self, node: str) -> StoredSaga[R] | None:
        """The node's saga as KV holds it now, or None when it has none."""
        entry = await self._kv.get(self.kind.key(node))
        if entry is None:
            known = self.index.get(node)
            if known is not None:
                self.index.forget(node, known.revision)
            return None
        return self._decoded(node, entry)

    async def all(self) -> list[StoredSaga[R]]:
        """Every saga, by node name, read from KV (the restart path: see `sagas` for the
        index)."""
        found = []
        for key in await self._kv.keys():
            if not self.kind.owns(key):
                continue
            node = self.kind.node_of(key)
            try:
                stored = await self.get(node)
            except ValueError as error:  # left to the runner, which reads KV itself
                log.warning("ignoring the %s record of %s: %s", self.kind.name, node, error)
                continue
            if stored is not None:
                found.append(stored)
        return found

    def sagas(self) -> list[StoredSaga[R]]:
        """Every saga in the index, by node name: no read of KV."""
        return self.index.all()

    def cached(self, node: str) -> StoredSaga[R] | None:
        """The node's saga in the index: no read of KV, so possibly stale; a write based on
        it conflicts if so."""
        return self.index.get(node)

    async def create(self, saga: R) -> StoredSaga[R]:
        """Store the node's first saga; raises `KeyExists` when it has one."""
        try:
            revision = await self._kv.create(self.kind.key(saga.node), _encoded(saga))
        except KeyExists:
            await self.get(saga.node)  # the index missed it: learn it for the next pass
            raise
        return self._recorded(StoredSaga(saga, revision))

    async def replace(self, saga: R, revision: int) -> StoredSaga[R]:
        """Store `saga` over the one read at `revision` (a new rollout's saga, or the next
        step of the same); raises `RevisionConflict` when someone wrote since."""
        key = self.kind.key(saga.node)
        try:
            new = await self._kv.update(key, _encoded(saga), revision)
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
        found: list[StoredSaga[R]] = []
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
                if not self.kind.owns(entry.key):
                    continue
                node = self.kind.node_of(entry.key)
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

    def _watched(self, node: str, entry: KvEntry) -> StoredSaga[R] | None:
        """The entry's saga, reusing the index's when it holds that revision (the store's
        own writes come back through the watch); None when it does not decode."""
        known = self.index.get(node)
        if known is not None and known.revision == entry.revision:
            return known
        try:
            return StoredSaga(self.kind.decode(entry.value), entry.revision)
        except ValueError as error:
            # leaving it out of the index leaves it to the runner, which reads KV itself
            log.warning(
                "ignoring the %s saga of node %s that does not decode: %s",
                self.kind.name,
                node,
                error,
            )
            return None

    def _decoded(self, node: str, entry: KvEntry) -> StoredSaga[R]:
        """The entry's saga; a revision's value never changes, so the index's copy at the
        same revision is reused (decoding dominated the full reads)."""
        known = self.index.get(node)
        if known is not None and known.revision == entry.revision:
            return known
        return self._recorded(StoredSaga(self.kind.decode(entry.value), entry.revision))

    def _recorded(self, stored: StoredSaga[R]) -> StoredSaga[R]:
        self.index.record(stored)
        return stored


def _encoded(saga: Any) -> bytes:
    encoded: str = saga.model_dump_json()
    return encoded.encode()
