"""Which claims hold this node's GPUs, as the device plugin's cluster role tells the node.

The kubelet names a claim by namespace, name and uid only; the allocation behind it comes
over the bus (`dra.ClaimAllocated` and `dra.ClaimReleased` on the node's subject, published
by the cluster role, which alone reads ResourceClaims). `ClaimsIndex` keeps the newest
allocation per claim uid: each fact carries the `resource_version` it was read at, and an
older one (a redelivery, a restore from the log racing a live delivery) never replaces a
newer. A release is remembered with the version of the allocation it ended, so the
allocation it ended cannot come back through a late delivery; a claim deallocated and
allocated again arrives with a newer version and is taken. Fed by `agent.NodeAgent`; read
by `preparing.Preparer` and by the health stream.
"""

from __future__ import annotations

from gpuop.events import dra


class ClaimsIndex:
    """The newest known allocation of every claim on this node, by claim uid."""

    def __init__(self) -> None:
        self._allocated: dict[str, dra.ClaimAllocated] = {}
        self._released: dict[str, int] = {}
        """The version of the allocation a release ended, by claim uid."""

    def apply(self, fact: dra.ClaimAllocated | dra.ClaimReleased) -> bool:
        """Take one fact in; whether the index changed."""
        uid = fact.claim.uid
        if isinstance(fact, dra.ClaimReleased):
            known = self._allocated.pop(uid, None)
            if known is not None:
                self._released[uid] = int(known.resource_version)
            return known is not None
        version = int(fact.resource_version)
        known = self._allocated.get(uid)
        newest = max(int(known.resource_version) if known else -1, self._released.get(uid, -1))
        if version <= newest:
            return False
        self._allocated[uid] = fact
        self._released.pop(uid, None)
        return True

    def get(self, uid: str) -> dra.ClaimAllocated | None:
        """The claim's allocation on this node; None while none is known."""
        return self._allocated.get(uid)

    def allocations(self) -> tuple[dra.ClaimAllocated, ...]:
        """Every allocation known, in no particular order."""
        return tuple(self._allocated.values())
