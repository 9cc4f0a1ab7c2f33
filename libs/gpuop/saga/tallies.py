"""The done sagas, counted instead of read: what admission still needs to know of them.

Pure. A rollout over thousands of nodes ends with nearly all of its sagas in upgrade-done,
and an admission pass that read and weighed each of them again cost more with every node
finished (issue 24). A settled saga (`settles`: upgrade-done, and no cordon of its own left)
holds no slot, is no candidate, makes no node unavailable and opens no wave; what
`admission.plan` still takes from it is only which driver pools have nodes at all (a pool's
figures) and how many of a pool's canary nodes are done (the canary gate). `DoneSagas`
keeps exactly that, by node, so the orchestrator's saga index (`indexing.SagaIndex`) moves
a saga in and out as its stored state changes, and `plan(..., done=...)` counts these
without reading them: the result is the one `plan` gives over every saga.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from gpuop.events.upgrade import UpgradeState
from gpuop.saga.upgrade.records import NodeSaga


def settles(saga: NodeSaga) -> bool:
    """Whether admission may count the saga in `DoneSagas` instead of reading it: done, and
    not cordoned by itself (a cordon of its own would make its node unavailable)."""
    return saga.state is UpgradeState.UPGRADE_DONE and not saga.cordoned


class DoneSagas:
    """The settled sagas by driver pool (None: the default drivers), their canaries apart."""

    def __init__(self) -> None:
        self._pool_of: dict[str, str | None] = {}
        self._members: dict[str | None, set[str]] = {}
        self._canaries: dict[str | None, set[str]] = {}

    def add(self, saga: NodeSaga) -> None:
        """Count `saga` (which `settles`) in place of whatever the node had."""
        self.discard(saga.node)
        self._pool_of[saga.node] = saga.pool
        self._members.setdefault(saga.pool, set()).add(saga.node)
        if saga.canary:
            self._canaries.setdefault(saga.pool, set()).add(saga.node)

    def discard(self, node: str) -> None:
        """Stop counting the node (its saga moved on, or is gone); nothing if not counted."""
        if node not in self._pool_of:
            return
        pool = self._pool_of.pop(node)
        for by_pool in (self._members, self._canaries):
            members = by_pool.get(pool)
            if members is not None:
                members.discard(node)
                if not members:
                    del by_pool[pool]

    def __contains__(self, node: object) -> bool:
        return node in self._pool_of

    def __len__(self) -> int:
        return len(self._pool_of)

    def __iter__(self) -> Iterator[str]:
        return iter(self._pool_of)

    def pools_where(self, counted: Callable[[str], bool]) -> set[str | None]:
        """The pools with a done node that `counted` accepts. Stops at the first accepted
        node of each pool, so the cost is one look per pool while the pool's nodes are
        managed (the usual case), not one per done node."""
        return {pool for pool, members in self._members.items() if any(map(counted, members))}

    def canaries_where(self, pool: str | None, counted: Callable[[str], bool]) -> int:
        """How many of the pool's canary nodes are done and accepted by `counted` (a
        handful: the policy's `canary.nodes`)."""
        return sum(map(counted, self._canaries.get(pool, ())))
