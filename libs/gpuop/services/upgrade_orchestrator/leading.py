"""Leader election: only the replica holding the Lease, and its NATS presence, decides.

`lead` runs a `LeaderElection` on the configured Lease and, each time this replica becomes
leader and holds the presence (`presence.Presence`, unless its duration is 0), runs a
fresh `Controller` until either is lost or the service stops; a replica that is not leader
only waits, watching the leader's presence so that it can take over within seconds of the
leader's death instead of the Lease's duration. A takeover needs nothing from the previous
leader: the sagas are in KV, the intake consumer is durable, and `Runner.resume` re-issues
pending steps.

A replica whose presence another took (it was fenced off: it stalled, or lost NATS, long
enough for a standby to claim it) ends its term: it releases the Lease to that standby and
campaigns again under a new identity (`<identity>~<term>`), so that the standby's proof
that the old identity stopped acting can never be mistaken for one about the new term.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gpuop.bus import Buckets, Bus, BusError
from gpuop.clocks import SYSTEM_CLOCK, Clock
from gpuop.kube import client
from gpuop.kube.leases import LeaderElection, default_identity
from gpuop.services.upgrade_orchestrator.config import OrchestratorConfig
from gpuop.services.upgrade_orchestrator.controller import Controller
from gpuop.services.upgrade_orchestrator.presence import Presence

log = logging.getLogger(__name__)


def election(
    kube: client.Kube,
    config: OrchestratorConfig,
    *,
    identity: str | None = None,
    presence: Presence | None = None,
) -> LeaderElection:
    """The Lease candidate for this replica, with renewal periods scaled to the duration;
    with a `presence`, it takes over a holder that the presence fenced off at once."""
    duration = config.lease_duration_seconds
    return LeaderElection(
        kube,
        config.lease_name,
        namespace=config.lease_namespace,
        identity=identity,
        lease_duration=duration,
        renew_deadline=duration * 2 / 3,
        retry_period=duration / 5,
        takes_over=presence.takes_over if presence is not None else None,
    )


async def _first(*events: asyncio.Event, task: asyncio.Task[None] | None = None) -> None:
    """Return once any of `events` is set (or `task` ended)."""
    waits = [asyncio.create_task(event.wait()) for event in events]
    watched: list[asyncio.Task[Any]] = [*waits, *([task] if task is not None else [])]
    try:
        await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)


async def _stop(task: asyncio.Task[None]) -> BaseException | None:
    """Cancel `task` until it ends (a library may swallow one cancel, see
    `controller._raise_if_cancelled`); returns the exception it failed with, if any."""
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=1.0)
    if task.cancelled():
        return None
    return task.exception()


async def lead(
    bus: Bus,
    kube: client.Kube,
    config: OrchestratorConfig,
    stopping: asyncio.Event,
    *,
    identity: str | None = None,
    clock: Clock = SYSTEM_CLOCK,
    retry_delay: float = 2.0,
) -> None:
    """Campaign for the Lease and lead whenever holding it (and the presence), until
    `stopping` is set; a controller that fails is started again after `retry_delay` while
    still leading."""
    base = identity or default_identity()
    term = 1
    while not stopping.is_set():
        name = base if term == 1 else f"{base}~{term}"
        presence = None
        if config.presence_duration:
            try:
                kv = await bus.kv(Buckets.SAGAS)
            except BusError as error:
                log.warning("cannot open the presence's bucket (%s); trying again", error)
                pause = asyncio.create_task(clock.sleep(retry_delay))
                await _first(stopping, task=pause)
                await _stop(pause)
                continue
            presence = Presence(kv, name, duration=config.presence_duration, clock=clock)
        candidate = election(kube, config, identity=name, presence=presence)
        await _term(bus, kube, config, stopping, candidate, presence, clock, retry_delay)
        term += 1


async def _term(
    bus: Bus,
    kube: client.Kube,
    config: OrchestratorConfig,
    stopping: asyncio.Event,
    candidate: LeaderElection,
    presence: Presence | None,
    clock: Clock,
    retry_delay: float,
) -> None:
    """Lead under one identity until `stopping`, or until the presence is taken from it."""
    campaign = asyncio.create_task(candidate.run(), name="lease-campaign")
    tasks = [campaign]
    if presence is not None:
        tasks.append(asyncio.create_task(presence.run(candidate), name="presence"))
    ended = (stopping, presence.taken_event) if presence is not None else (stopping,)
    try:
        while not any(event.is_set() for event in ended):
            await _first(candidate.leading_event, *ended)
            if presence is not None:
                await _first(presence.held_event, candidate.following_event, *ended)
                if not presence.holds:
                    continue
            if any(event.is_set() for event in ended) or not candidate.is_leader:
                continue
            log.info("leading as %s", candidate.identity)
            controller = Controller(bus, kube, config, clock=clock)
            leading = asyncio.create_task(controller.run(), name="upgrade-controller")
            dropped = (presence.dropped_event,) if presence is not None else ()
            try:
                await _first(candidate.following_event, *dropped, *ended, task=leading)
            finally:
                outcome = await _stop(leading)
            if isinstance(outcome, Exception):
                # leading again starts over from KV, which is always safe
                log.error("the controller failed; starting it again", exc_info=outcome)
                await clock.sleep(retry_delay)
            if presence is not None and presence.taken_event.is_set():
                log.warning("lost the lease: another replica fenced this one off")
            elif not stopping.is_set() and not candidate.is_leader:
                log.warning("lost the lease; waiting to lead again")
            elif not stopping.is_set() and presence is not None and not presence.holds:
                log.warning("lost the lease's presence on NATS; waiting to hold it again")
    finally:
        # the campaign releases the Lease if it still holds it
        for task in reversed(tasks):
            failure = await _stop(task)
            if failure is not None:
                log.error("the %s failed", task.get_name(), exc_info=failure)
