"""The leader's presence on NATS: how a standby learns within seconds that the leader is
gone, and when it may take the Lease before the Lease expires.

The Lease (`gpuop.kube.leases`) stays the fence and keeps client-go's rules, but its 15 s
decide how long a crashed leader's rollout stands still, and a shorter Lease costs Kubernetes
API requests on every renewal, forever. So beside it the leader keeps a second, short lease
in KV (`gpuop_sagas`, key `PRESENCE_KEY`, which no node saga can have), with the same rules
on NATS's compare-and-set, which costs the API server nothing:

- The Lease holder writes its identity there every `renew_period` (a fifth of `duration`),
  each write conditional on the revision of its last one, and acts only while its last
  acknowledged write was *sent* less than `deadline` (two thirds of `duration`) ago on its
  own monotonic clock (`held_event`). A renewal that misses the deadline stops the
  controller; one that lands later starts it again. A renewal that finds the key taken by
  another replica (`taken_event`) means a standby fenced it off: it must give the Lease up.
- A standby reads the key every `watch_period` (a tenth of `duration`). When the record
  names the replica that holds the Lease and has not changed for `duration`, measured from
  when this standby first saw that revision (no trust in another machine's clock, as
  client-go does with the Lease), it claims the key with compare-and-set on that revision.
  A claim that succeeds proves the holder's last renewal is that revision, sent before the
  standby first saw it, so the holder stopped acting (its deadline) before the claim, and
  cannot renew again (compare-and-set): the holder is `fenced`, and the standby takes the
  Lease at once (`LeaderElection.takes_over`). A claim that conflicts means the holder
  renewed: nothing changes.

With the default 3 s, a standby acts about 3 s after the leader's last renewal, for one KV
write by the leader every 0.6 s and one KV read by the standby every 0.3 s, and not one
Kubernetes API request more.

What this does not change: a holder that never wrote a presence (presence turned off, or a
version before it) is only ever taken over when its Lease expires; a standby that cannot
reach NATS never claims anything and waits for the Lease; a leader cut off from NATS stops
acting within `deadline`, which it must anyway (its sagas are in KV). Like client-go's
renew deadline, the self-fence assumes the two clocks run at about the same rate, and
cancels the controller between its requests: one already sent may still land, within the
`duration - deadline` margin. A partition between the leader and NATS therefore moves the
leadership to the standby within about `duration` plus one Lease write; a partition between
the leader and the API server is the Lease's business, as before.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable
from dataclasses import dataclass

from gpuop.bus import BusError, KeyExists, KeyValue, RevisionConflict
from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.kube.leases import LeaderElection

log = logging.getLogger(__name__)

PRESENCE_KEY = "_presence"
"""The key in `gpuop_sagas`: node tokens never begin with `_`, and the saga store skips it."""


@dataclass(frozen=True)
class PresenceRecord:
    """The presence as read: who wrote it, at which revision."""

    holder: str
    revision: int


def encode(holder: str) -> bytes:
    return json.dumps({"holder": holder}).encode()


def decode(value: bytes) -> str:
    """The holder in a presence value; "" for one that does not decode (nobody)."""
    try:
        found = json.loads(value)
    except ValueError:
        return ""
    holder = found.get("holder") if isinstance(found, dict) else None
    return holder if isinstance(holder, str) else ""


class Presence:
    """One replica's side of the presence: it holds it while it leads, and watches the
    leader's while it stands by."""

    def __init__(
        self, kv: KeyValue, identity: str, *, duration: float, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        if duration <= 0:
            raise ValueError("the presence needs a duration above 0")
        self.kv = kv
        self.identity = identity
        self.duration = duration
        self.renew_period = duration / 5
        self.watch_period = duration / 10
        """A standby's reads: each costs one KV get, and a takeover comes this much sooner."""
        self.deadline = duration * 2 / 3
        self.clock = clock
        self.held_event = asyncio.Event()
        """Set while this replica holds the presence with a renewal within `deadline`."""
        self.dropped_event = asyncio.Event()
        """Set while it does not: the controller must not run."""
        self.dropped_event.set()
        self.taken_event = asyncio.Event()
        """Set once another replica claimed the presence this one held."""
        self.fenced = ""
        """The holder whose presence this replica claimed: it stopped acting for good."""
        self._revision = 0
        self._sent_at: float | None = None
        self._observed: PresenceRecord | None = None
        self._observed_at = 0.0

    @property
    def holds(self) -> bool:
        return self.held_event.is_set()

    def takes_over(self, holder: str) -> bool:
        """For `LeaderElection.takes_over`: whether `holder`'s Lease may be taken now (we
        fenced it, and no one has overwritten our claim since we last looked). A fenced
        replica leads again only under a new identity (`leading.lead` numbers its terms)."""
        return bool(holder) and holder == self.fenced and self._revision != 0

    async def run(self, candidate: LeaderElection) -> None:
        """Hold the presence while `candidate` leads, watch it otherwise, until cancelled."""
        try:
            while True:
                try:
                    if candidate.is_leader:
                        await self._renew()
                    else:
                        self._set_held(False)
                        await self._watch(candidate)
                except BusError as error:
                    log.warning("presence: %s", error)
                self._check_deadline()
                await self.clock.sleep(self._next_pause(candidate.is_leader))
        finally:
            self._set_held(False)

    async def _renew(self) -> None:
        """Write the presence: a renewal of our own revision, or, as the Lease holder, a
        claim of whatever is there (a presence of a replica that does not hold the Lease
        fences nothing)."""
        if self.taken_event.is_set():
            return
        if self._revision:
            try:
                await self._write(
                    self.kv.update(PRESENCE_KEY, encode(self.identity), self._revision)
                )
                return
            except RevisionConflict:
                found = await self.read()
                if found is not None and found.holder == self.identity:
                    # our own late write landed: keep its revision, not its send time
                    self._revision = found.revision
                    return
                log.warning("presence taken by %s", found.holder if found else "nobody")
                self._revision = 0
                self._set_held(False)
                self.taken_event.set()
                return
        found = await self.read()
        try:
            if found is None:
                operation = self.kv.create(PRESENCE_KEY, encode(self.identity))
            else:
                operation = self.kv.update(PRESENCE_KEY, encode(self.identity), found.revision)
            await self._write(operation)
        except (RevisionConflict, KeyExists):
            return  # changed since read: try again next time

    async def _watch(self, candidate: LeaderElection) -> None:
        """Read the leader's presence; claim it once it names the Lease holder and has not
        changed for `duration` since we first saw it."""
        found = await self.read()
        now = self.clock.monotonic()
        if found is None or found.holder != self.identity:
            self._revision = 0  # a claim of ours that another overwrote is void
        if found != self._observed:
            self._observed, self._observed_at = found, now
            return
        if (
            found is None
            or found.holder in ("", self.identity, self.fenced)
            or found.holder != candidate.holder
            or now - self._observed_at < self.duration
        ):
            return
        silent = now - self._observed_at
        try:
            await self._write(
                self.kv.update(PRESENCE_KEY, encode(self.identity), found.revision), hold=False
            )
        except RevisionConflict:
            return  # the holder renewed: it is alive
        log.warning(
            "presence of %s unrenewed for %.1f s: it has stopped acting; taking the lease",
            found.holder,
            silent,
        )
        self.fenced = found.holder
        candidate.wake()

    async def read(self) -> PresenceRecord | None:
        entry = await self.kv.get(PRESENCE_KEY)
        if entry is None:
            return None
        return PresenceRecord(decode(entry.value), entry.revision)

    async def _write(self, operation: Awaitable[int], *, hold: bool = True) -> None:
        """Await a presence write; while it is out, a deadline that passes drops the
        presence at once (the write may be slow, not lost: it is awaited to the end)."""
        sent = self.clock.monotonic()
        task = asyncio.ensure_future(operation)
        try:
            while not (await asyncio.wait({task}, timeout=self._remaining()))[0]:
                self._check_deadline()
        finally:
            if not task.done():  # cancelled meanwhile
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._revision = task.result()
        self._observed = PresenceRecord(self.identity, self._revision)
        self._observed_at = self.clock.monotonic()
        self._sent_at = sent
        if hold:
            self._set_held(True)

    def _remaining(self) -> float | None:
        """Seconds until the deadline of the last renewal, while the presence is held."""
        if not self.holds or self._sent_at is None:
            return None
        return max(self._sent_at + self.deadline - self.clock.monotonic(), 0.0)

    def _check_deadline(self) -> None:
        if self.holds and self._remaining() == 0.0:
            log.warning("presence not renewed within %.1f s: not acting", self.deadline)
            self._set_held(False)

    def _next_pause(self, leading: bool) -> float:
        period = self.renew_period if leading else self.watch_period
        remaining = self._remaining()
        return period if remaining is None else min(period, remaining)

    def _set_held(self, held: bool) -> None:
        if held == self.holds:
            return
        if held:
            self.dropped_event.clear()
            self.held_event.set()
        else:
            self.held_event.clear()
            self.dropped_event.set()
