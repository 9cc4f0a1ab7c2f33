"""The leader's in-memory index of the stored sagas: what admission and the reconcile read.

Every admission pass used to list the bucket and read every saga (issue 24): at a thousand
nodes that cost more than the rollout's own steps, and more with every node done. The
`SagaStore` (`store`) keeps this index in step with KV instead: its own writes are recorded
as they return, and its KV watch (`SagaStore.follow`) brings the writes of anyone else and
every delete; the index is rebuilt from KV when a leader starts (`SagaStore.load`) and
whenever the watch starts again after a break (`reset`).

The index is a read cache, never the truth: the runner decides each event on the saga it
reads from KV, and every write names the revision it read, so a stale index can only make a
write fail with `RevisionConflict` or `KeyExists` (the store then reads the node again, and
the next pass retries), never overwrite a newer saga. Entries are kept by revision: a change
older than the one known (a watch delivering the leader's own write late) is ignored.

The sagas still in play (`live`) are kept apart from the settled ones, which are only
counted (`tallies.DoneSagas`), so an admission pass weighs the nodes that can still move.
Every kind's store keeps one; only a kind whose sagas settle (`SagaKind.settles`: the
upgrade's done ones) counts any.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic

from typing_extensions import TypeVar

from gpuop.saga import NodeSaga, tallies
from gpuop.saga.machine import SagaRecord

R = TypeVar("R", bound=SagaRecord[Any], default=NodeSaga)
"""A kind's record (the upgrade's `NodeSaga` where none is named)."""


@dataclass(frozen=True)
class StoredSaga(Generic[R]):
    """A saga as read from KV, with the revision a conditional write must name."""

    saga: R
    revision: int


class SagaIndex(Generic[R]):
    """The latest known saga of every node, by revision, the done ones also counted."""

    def __init__(self, settles: Callable[[Any], bool] = tallies.settles) -> None:
        self._settles = settles
        """Whether a saga is settled (`SagaKind.settles`; the upgrade's by default):
        counted, not weighed."""
        self._entries: dict[str, StoredSaga[R]] = {}
        self._live: dict[str, StoredSaga[R]] = {}
        self._revisions: dict[str, int] = {}
        """The latest revision known per node, a delete's included, so that a change older
        than a delete does not bring the saga back."""
        self.done = tallies.DoneSagas()
        """The settled sagas, counted for admission."""

    def get(self, node: str) -> StoredSaga[R] | None:
        """The node's saga as last known, or None."""
        return self._entries.get(node)

    def all(self) -> list[StoredSaga[R]]:
        """Every known saga, by node name."""
        return [self._entries[node] for node in sorted(self._entries)]

    def live(self) -> list[StoredSaga[R]]:
        """The sagas that are not settled (`tallies.settles`): the ones admission weighs."""
        return list(self._live.values())

    def __len__(self) -> int:
        return len(self._entries)

    def known(self, node: str, revision: int) -> bool:
        """Whether the index already holds the node at `revision` or later."""
        return self._revisions.get(node, 0) >= revision

    def record(self, stored: StoredSaga[R]) -> bool:
        """Hold `stored` unless a later revision of its node is known; whether it did."""
        node = stored.saga.node
        if self.known(node, stored.revision):
            return False
        self._revisions[node] = stored.revision
        self._entries[node] = stored
        if self._settles(stored.saga):
            self._live.pop(node, None)
            self.done.add(stored.saga)  # type: ignore[arg-type]
        else:
            self.done.discard(node)
            self._live[node] = stored
        return True

    def forget(self, node: str, revision: int) -> bool:
        """The node's saga was deleted at `revision`: drop it unless a later write is
        known; whether it did."""
        if self._revisions.get(node, 0) > revision:
            return False
        self._revisions[node] = revision
        self._entries.pop(node, None)
        self._live.pop(node, None)
        self.done.discard(node)
        return True

    def reset(
        self, found: Iterable[StoredSaga[R]], deleted: Iterable[tuple[str, int]] = ()
    ) -> None:
        """Rebuild from a full read of KV: `found`, the live sagas, and `deleted`, the
        deletes it saw, each with its revision. A node the read lacks is dropped, unless it
        was written after everything the read saw (a write that raced the read: the watch
        delivers it again, and a write with a stale revision would only conflict)."""
        found = list(found)
        deleted = list(deleted)
        newest = max([s.revision for s in found] + [revision for _, revision in deleted], default=0)
        kept = [s for s in self._entries.values() if s.revision > newest]
        self._entries.clear()
        self._live.clear()
        self._revisions.clear()
        self.done = tallies.DoneSagas()
        for node, revision in deleted:
            self.forget(node, revision)
        for stored in (*found, *kept):
            self.record(stored)
