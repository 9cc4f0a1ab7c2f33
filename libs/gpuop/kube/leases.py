"""Leader election on a coordination.k8s.io/v1 Lease, with client-go's rules.

Called by the cluster roles that must run once per cluster (the upgrade orchestrator):
they start `LeaderElection.run()` as a task and act only while `is_leader`.

- A candidate takes the lease when nobody holds it (no Lease yet, or an empty
  `holderIdentity` after a release) or when its holder has not renewed it for
  `leaseDurationSeconds`, measured on the candidate's own monotonic clock from the moment
  it first saw the current record: no trust in another machine's clock.
- Every write is a merge patch carrying the resourceVersion it was decided on, so of two
  candidates that race for the same lease one gets 409 and stays a follower: two never
  both lead.
- The leader renews every `retry_period`. It stops leading at once when a renewal finds
  another holder or is answered 409, and when it has not renewed for `renew_deadline`,
  which is shorter than the lease duration: it stops before anyone else may start.
- On the way out (`run()` cancelled) a leader releases the lease, so a successor need not
  wait out the duration; `release_on_stop=False` leaves it to expire, as a crash would.
- Early takeover, outside client-go's rules and off by default: with `takes_over`, a
  candidate treats an unexpired lease as expired when `takes_over(holder)` vouches that the
  holder has stopped acting for good (the upgrade orchestrator's NATS presence, see
  `gpuop.services.upgrade_orchestrator.presence`). The write is the same conditional patch,
  so to any other candidate it reads as an ordinary transition; `wake()` has the candidate
  try at once instead of after its `retry_period`.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.kube import errors
from gpuop.kube.client import Kube

Obj = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"

log = logging.getLogger(__name__)


def default_identity() -> str:
    """Host name plus a random suffix: unique per process, readable in `kubectl get lease`."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def micro_time(moment: datetime) -> str:
    """`metav1.MicroTime`, the form of a Lease's times. The client sends the times of a
    created Lease through `datetime.isoformat()`, which drops a zero fraction that the API
    server's MicroTime parser requires; one microsecond later avoids that."""
    if moment.microsecond == 0:
        moment += timedelta(microseconds=1)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class LeaseRecord:
    """The leader-election fields of a Lease as read."""

    holder: str
    lease_duration: int
    transitions: int
    resource_version: str

    @classmethod
    def of(cls, lease: Mapping[str, Any]) -> LeaseRecord:
        spec = lease.get("spec") or {}
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            lease_duration=int(spec.get("leaseDurationSeconds") or 0),
            transitions=int(spec.get("leaseTransitions") or 0),
            resource_version=str((lease.get("metadata") or {}).get("resourceVersion") or ""),
        )


class Attempt(StrEnum):
    """The outcome of one try to acquire or renew."""

    LEADING = "leading"
    """This candidate holds the lease (acquired it or renewed it)."""
    HELD = "held"
    """Another holder's lease has not expired."""
    CONFLICT = "conflict"
    """Another writer changed the lease between our read and our write."""


class LeaderElection:
    """One candidate for one Lease."""

    def __init__(
        self,
        kube: Kube,
        name: str,
        *,
        namespace: str = "default",
        identity: str | None = None,
        lease_duration: int = 15,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        release_on_stop: bool = True,
        on_started_leading: Callable[[], None] | None = None,
        on_stopped_leading: Callable[[], None] | None = None,
        takes_over: Callable[[str], bool] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if not 0 < retry_period < renew_deadline < lease_duration:
            raise ValueError("need 0 < retry_period < renew_deadline < lease_duration")
        self.kube = kube
        self.name = name
        self.namespace = namespace
        self.identity = identity or default_identity()
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.release_on_stop = release_on_stop
        self.on_started_leading = on_started_leading
        self.on_stopped_leading = on_stopped_leading
        self.takes_over = takes_over
        """Whether an unexpired lease of this holder may be taken now: only for a holder
        known to have stopped acting and unable to act again."""
        self.clock = clock
        self.leading_event = asyncio.Event()
        """Set while this candidate leads."""
        self.following_event = asyncio.Event()
        """Set while it does not."""
        self.following_event.set()
        self._observed_version = ""
        self._observed_at = 0.0
        self._renewed_at = 0.0
        self._woken = asyncio.Event()
        self.holder = ""
        """The holder of the lease as last read or written ("" before the first read, and
        when nobody holds it)."""

    @property
    def is_leader(self) -> bool:
        return self.leading_event.is_set()

    def wake(self) -> None:
        """Try to acquire or renew now rather than after the rest of `retry_period`."""
        self._woken.set()

    async def run(self) -> None:
        """Acquire, then renew, every `retry_period`, until cancelled."""
        try:
            while True:
                attempt: Attempt | None = None
                try:
                    attempt = await self.try_acquire_or_renew()
                except errors.KubeError as error:
                    log.warning("lease %s/%s: %s", self.namespace, self.name, error)
                now = self.clock.monotonic()
                if attempt is Attempt.LEADING:
                    self._renewed_at = now
                    self._set_leading(True)
                elif self.is_leader and (
                    attempt is not None or now - self._renewed_at >= self.renew_deadline
                ):
                    log.warning("lease %s/%s lost (%s)", self.namespace, self.name, attempt)
                    self._set_leading(False)
                await self._pause()
        finally:
            if self.is_leader:
                # Stop acting before the lease can pass to anyone else.
                self._set_leading(False)
                if self.release_on_stop:
                    await self._release()

    async def try_acquire_or_renew(self) -> Attempt:
        """One read and, when the lease is free, expired or ours, one conditional write;
        both, retries included, within `renew_deadline`, as client-go bounds one try with a
        context deadline: a leader whose try runs late must find out before the lease can
        pass to another candidate."""
        deadline = self.clock.monotonic() + self.renew_deadline
        try:
            read = self.kube.coordination.read_namespaced_lease
            lease = await self.kube.call(
                read, self.name, self.namespace, **self._remaining(deadline)
            )
        except errors.NotFound:
            return await self._create(self._remaining(deadline))
        record = LeaseRecord.of(lease)
        self.holder = record.holder
        monotonic = self.clock.monotonic()
        if record.resource_version != self._observed_version:
            self._observed_version, self._observed_at = record.resource_version, monotonic
        if (
            record.holder
            and record.holder != self.identity
            and monotonic < self._observed_at + record.lease_duration
        ):
            if self.takes_over is None or not self.takes_over(record.holder):
                return Attempt.HELD
            log.info(
                "lease %s/%s: taking it from %s, which has stopped acting",
                self.namespace,
                self.name,
                record.holder,
            )
        now = micro_time(self.clock.now())
        spec: Obj = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.lease_duration,
            "renewTime": now,
        }
        if record.holder != self.identity:
            spec.update(acquireTime=now, leaseTransitions=record.transitions + 1)
        try:
            written = await self._patch(record.resource_version, spec, self._remaining(deadline))
        except errors.Conflict:
            return Attempt.CONFLICT
        self._observe(written)
        return Attempt.LEADING

    async def _create(self, timeout: Mapping[str, float]) -> Attempt:
        now = micro_time(self.clock.now())
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self.lease_duration,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }
        try:
            created = await self.kube.call(
                self.kube.coordination.create_namespaced_lease, self.namespace, lease, **timeout
            )
        except errors.AlreadyExists:
            return Attempt.CONFLICT
        self._observe(created)
        return Attempt.LEADING

    async def _release(self) -> None:
        """Clear the holder, so the next candidate takes over without waiting."""
        try:
            lease = await self.kube.call(
                self.kube.coordination.read_namespaced_lease, self.name, self.namespace
            )
            if LeaseRecord.of(lease).holder != self.identity:
                return
            spec: Obj = {
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "renewTime": micro_time(self.clock.now()),
            }
            await self._patch(
                LeaseRecord.of(lease).resource_version,
                spec,
                {"_request_timeout": self.renew_deadline},
            )
        except errors.KubeError as error:
            log.warning("could not release lease %s/%s: %s", self.namespace, self.name, error)

    async def _patch(self, resource_version: str, spec: Obj, timeout: Mapping[str, float]) -> Obj:
        """Change the lease only if it is still at `resource_version` (else `Conflict`)."""
        body = {"metadata": {"resourceVersion": resource_version}, "spec": spec}
        return await self.kube.call(
            self.kube.coordination.patch_namespaced_lease,
            self.name,
            self.namespace,
            body,
            _content_type=MERGE_PATCH,
            **timeout,
        )

    def _remaining(self, deadline: float) -> dict[str, float]:
        """The request timeout left of this try, a little at least so that a request that
        has no time left fails fast with a timeout."""
        return {"_request_timeout": max(deadline - self.clock.monotonic(), 0.01)}

    async def _pause(self) -> None:
        """Sleep `retry_period`, or less when `wake()` is called meanwhile."""
        if self._woken.is_set():
            self._woken.clear()
            await self.clock.sleep(0)
            return
        sleeping = asyncio.create_task(self.clock.sleep(self.retry_period))
        woken = asyncio.create_task(self._woken.wait())
        try:
            await asyncio.wait({sleeping, woken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sleeping, woken):
                task.cancel()
            await asyncio.gather(sleeping, woken, return_exceptions=True)
            self._woken.clear()

    def _observe(self, lease: Mapping[str, Any]) -> None:
        record = LeaseRecord.of(lease)
        self._observed_version = record.resource_version
        self._observed_at = self.clock.monotonic()
        self.holder = record.holder

    def _set_leading(self, leading: bool) -> None:
        if leading == self.is_leader:
            return
        if leading:
            log.info("%s now leads %s/%s", self.identity, self.namespace, self.name)
            self.following_event.clear()
            self.leading_event.set()
            if self.on_started_leading is not None:
                self.on_started_leading()
        else:
            log.info("%s no longer leads %s/%s", self.identity, self.namespace, self.name)
            self.leading_event.clear()
            self.following_event.set()
            if self.on_stopped_leading is not None:
                self.on_stopped_leading()
