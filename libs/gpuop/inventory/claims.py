"""Which pods hold a node's GPUs through DRA ResourceClaims, folded from the bus.

The device plugin's cluster role reads the ResourceClaims and publishes, on the subject of
each node whose GPUs a claim holds, `dra.ClaimAllocated` (the devices, each with the GPU of
the node it is, and the pods that reserve the claim) and `dra.ClaimReleased`. Node agents
hold no Kubernetes token, so these facts are how they see DRA allocations of any driver:
the device plugin's answer to `ListGpuHolders` (`device_plugin.holders`) and telemetry's
pod labels (`telemetry.pods`) read a `ClaimHolders` that `follow` keeps current; the
upgrade orchestrator's pod deletions (`gpuop.kube.pods.holders_filter`) read every node's,
a `NodeClaims` that `follow_all` keeps current.

The fold: per claim uid, the newest `resource_version` wins (a redelivered older fact is
ignored); `ClaimReleased` removes the claim and remembers the version it removed, so an
older `ClaimAllocated` read after it does not bring the claim back, while a later allocation
of the same claim (deallocated, then allocated again: a higher version) does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpuop.bus import Bus, BusError, StoredMessage
from gpuop.events import Event, MalformedMessage, UnknownEventType, decode_on, dra, subjects

log = logging.getLogger(__name__)

FOLLOW_RETRY_SECONDS = 2.0
"""Pause before a failed read of the node's claim facts is resumed."""


def claim_subjects(node: str | None, *, prefix: str = subjects.DEFAULT_PREFIX) -> str:
    """The node's claim facts, `gpuop.evt.dra.<node>.*` (None: every node's)."""
    return subjects.events_filter(dra.ClaimAllocated.DOMAIN, node, prefix=prefix)


@dataclass(frozen=True, slots=True)
class _Known:
    version: int
    allocated: dra.ClaimAllocated | None
    """None once released."""


class ClaimHolders:
    """The node's allocated claims, from their facts; each method answers from what was
    applied so far."""

    def __init__(self) -> None:
        self._claims: dict[str, _Known] = {}
        self.changed = asyncio.Event()
        """Set whenever a fact changed the answer (cleared by the reader)."""
        self.ready = asyncio.Event()
        """Set once every fact the log held when `follow` began was applied: before, an
        answer could miss a claim."""

    def apply(self, event: Event) -> bool:
        """Take in one fact; whether it changed anything (other events change nothing)."""
        if isinstance(event, dra.ClaimAllocated):
            known = self._claims.get(event.claim.uid)
            version = int(event.resource_version)
            if known is not None and version <= known.version:
                return False
            self._claims[event.claim.uid] = _Known(version, event)
        elif isinstance(event, dra.ClaimReleased):
            known = self._claims.get(event.claim.uid)
            if known is None or known.allocated is None:
                return False  # nothing allocated to release
            self._claims[event.claim.uid] = _Known(known.version, None)
        else:
            return False
        self.changed.set()
        return True

    def get(self, uid: str) -> dra.ClaimAllocated | None:
        """The claim's allocation on this node; None while none is known, or once released."""
        known = self._claims.get(uid)
        return known.allocated if known is not None else None

    def allocations(self) -> tuple[dra.ClaimAllocated, ...]:
        """The claims allocated now, by uid."""
        return tuple(
            known.allocated
            for _, known in sorted(self._claims.items())
            if known.allocated is not None
        )

    def pods_holding(self, gpu_uuids: Iterable[str]) -> tuple[dra.PodRef, ...]:
        """The pods reserving a claim with a device of any of `gpu_uuids`, each once, sorted.
        A device the publisher could not match to a GPU of the node (`gpu_uuid` None) counts
        as every GPU: resetting a GPU under a running container costs more than waiting for
        one more pod."""
        wanted = frozenset(gpu_uuids)
        found: set[dra.PodRef] = set()
        for claim in self.allocations():
            if any(d.gpu_uuid is None or d.gpu_uuid in wanted for d in claim.devices):
                found.update(claim.pods)
        return tuple(sorted(found, key=lambda pod: (pod.namespace, pod.name, pod.uid)))

    def pods_by_gpu(self) -> dict[str, tuple[dra.PodRef, ...]]:
        """The pods reserving a claim of each GPU (matched devices only), sorted."""
        found: dict[str, set[dra.PodRef]] = {}
        for claim in self.allocations():
            for device in claim.devices:
                if device.gpu_uuid is not None:
                    found.setdefault(device.gpu_uuid, set()).update(claim.pods)
        return {
            gpu: tuple(sorted(pods, key=lambda pod: (pod.namespace, pod.name, pod.uid)))
            for gpu, pods in sorted(found.items())
            if pods
        }


class NodeClaims:
    """Every node's claims (`ClaimHolders`), for the orchestrator, which drains any node."""

    def __init__(self) -> None:
        self._nodes: dict[str, ClaimHolders] = {}
        self.ready = asyncio.Event()
        """Set once every fact the log held when `follow_all` began was applied."""

    def apply(self, node: str, event: Event) -> bool:
        """Take in one fact about `node`'s claims; whether it changed anything."""
        return self._nodes.setdefault(node, ClaimHolders()).apply(event)

    def claimants(self, node: str) -> frozenset[tuple[str, str]]:
        """The pods (namespace, name) reserving a claim on `node`'s GPUs, of any driver."""
        found = self._nodes.get(node)
        if found is None:
            return frozenset()
        return frozenset((p.namespace, p.name) for c in found.allocations() for p in c.pods)


Apply = Callable[[str, Event], object]
"""Takes one fact about a node's claims: the node, the fact."""


def _apply(apply: Apply, stored: StoredMessage, last: int) -> int:
    """Apply `stored` unless it is at or before `last` (a resumed read starts again at the
    beginning); the sequence applied up to."""
    if stored.seq <= last:
        return last
    try:
        envelope, payload = decode_on(stored.subject, stored.data)
    except (MalformedMessage, UnknownEventType):
        return stored.seq
    if isinstance(payload, Event):
        apply(envelope.node, payload)
    return stored.seq


async def _follow(
    bus: Bus, subject: str, apply: Apply, ready: asyncio.Event, retry_seconds: float
) -> None:
    last = 0
    while True:
        try:
            if not ready.is_set():
                async for stored in bus.read(subject):
                    last = _apply(apply, stored, last)
                ready.set()
            async for stored in bus.read(subject, follow=True):
                last = _apply(apply, stored, last)
        except BusError as error:
            log.warning("reading %s failed, resuming: %s", subject, error)
        await asyncio.sleep(retry_seconds)


async def follow(
    bus: Bus, node: str, claims: ClaimHolders, *, retry_seconds: float = FOLLOW_RETRY_SECONDS
) -> None:
    """Apply the node's claim facts from the start of the log (then `claims.ready` is set),
    then each new one, until cancelled; a failed read resumes after the last fact applied."""
    subject = claim_subjects(node, prefix=bus.prefix)
    await _follow(bus, subject, lambda _, event: claims.apply(event), claims.ready, retry_seconds)


async def follow_all(
    bus: Bus, claims: NodeClaims, *, retry_seconds: float = FOLLOW_RETRY_SECONDS
) -> None:
    """`follow` for every node's claim facts at once, into `claims`."""
    subject = claim_subjects(None, prefix=bus.prefix)
    await _follow(bus, subject, claims.apply, claims.ready, retry_seconds)
